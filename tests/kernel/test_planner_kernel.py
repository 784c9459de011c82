"""The planned rulesets load into a real kernel and read back as planned.

Planner output is only useful if the kernel takes it in one batch: this applies the tracer's
world (every feature, both families) in a fresh network namespace through the netlink backend
and reads the table back.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nlproxy.nft.backend import NftBackend
from nlproxy.nft.ir import Family, Ruleset
from nlproxy.nft.readback import read_ruleset
from nlproxy.nft.reconcile import diff
from nlproxy.proxy.planner import plan
from tests.world import config, world


def _exprs(rs: Ruleset) -> dict[str, list[object]]:
    return {chain: [r.exprs for r in rules] for chain, rules in rs.rules.items()}


@pytest.mark.parametrize("family", [Family.IP, Family.IP6])
def test_plan_loads_and_reads_back(make_netns: Callable[[str], str], family: Family) -> None:
    ns = make_netns("plan")
    want = plan(world(), config()).rulesets[family]
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
