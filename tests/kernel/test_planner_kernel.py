"""The planned rulesets load into a real kernel and read back as planned.

Planner output is only useful if the kernel takes it in one batch: this applies the tracer's
world (every feature, both families) in a fresh network namespace through the netlink backend
and reads the table back. The tracer's case table (``tests/world.py``, the same table the unit
tracer tests use) is then traced over what the kernel holds, so each expectation is checked
against the kernel's copy of the rules and not only against the plan.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from nlproxy.nft.backend import NftBackend
from nlproxy.nft.ir import Cmp, Family, Field, Ruleset
from nlproxy.nft.readback import read_ruleset
from nlproxy.nft.reconcile import diff
from nlproxy.proxy.config import DetectLocal
from nlproxy.proxy.planner import plan
from tests import netns
from tests.world import CASES, Case, config, world


def _exprs(rs: Ruleset) -> dict[str, list[object]]:
    return {chain: [r.exprs for r in rules] for chain, rules in rs.rules.items()}


DETECT = {
    "cidr": {},
    # pods told by the interface they come in on: iifname matches in every layout's chains
    "bridge": {"detect_local": DetectLocal.BRIDGE_INTERFACE, "pod_interface": "cbr0"},
    "prefix": {"detect_local": DetectLocal.INTERFACE_NAME_PREFIX, "pod_interface": "veth"},
}


@pytest.mark.parametrize("detect", DETECT)
@pytest.mark.parametrize("family", [Family.IP, Family.IP6])
def test_plan_loads_and_reads_back(
    make_netns: Callable[[str], str], family: Family, detect: str
) -> None:
    ns = make_netns("plan")
    want = plan(world(), config(**DETECT[detect])).rulesets[family]
    iifnames = [e for rules in want.rules.values() for r in rules for e in r.exprs
                if isinstance(e, Cmp) and e.left is Field.META_IIFNAME]  # fmt: skip
    assert bool(iifnames) is (detect != "cidr")
    backend = NftBackend(want.table, netns=ns)
    try:
        backend.apply(diff(want, None))
    finally:
        backend.close()
    got = read_ruleset(family, want.table.name, netns=ns)
    assert got is not None
    assert set(got.chains) == set(want.chains)
    assert _exprs(got) == _exprs(want)
    assert got.sets == want.sets
    for name, elements in want.elements.items():
        assert got.elements[name] == elements, name
    assert diff(want, got) == []  # the next sync finds nothing to do


@pytest.fixture(scope="module")
def programmed() -> Iterator[dict[Family, Ruleset]]:
    """The world loaded into a namespace of its own and read back, both families."""
    planned = plan(world(), config()).rulesets
    with netns.namespace("tracek") as ns:
        held: dict[Family, Ruleset] = {}
        for family, want in planned.items():
            with NftBackend(want.table, netns=ns) as backend:
                backend.apply(diff(want, None))
            got = read_ruleset(family, want.table.name, netns=ns)
            assert got is not None
            held[family] = got
        yield held


@pytest.mark.parametrize("case", CASES)
def test_trace_over_what_the_kernel_holds(programmed: dict[Family, Ruleset], case: Case) -> None:
    assert case.trace(programmed) == case.expected
