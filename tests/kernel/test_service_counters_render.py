"""The counting objects of ``--service-counters`` as nft sees them: the rendered sets and chains,
loaded with ``nft -f``, list exactly as rendered (with the values ``read_counters`` reads), and
read back as the planned IR (a set nft declared with ``counter`` too)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from ipaddress import ip_address

import pytest

from nlproxy.nft.counters import read_counters
from nlproxy.nft.ir import Element, Family, L4Proto, Ruleset, Table
from nlproxy.nft.readback import read_ruleset
from nlproxy.nft.render import render_ruleset
from nlproxy.proxy import naming as n
from nlproxy.proxy.skeleton import IPV4, IPV6, FamilySpec, add_counting, counter_sets
from tests.netns import sh

TABLE = "nlpcount"


def _counting(f: FamilySpec) -> Ruleset:
    """The counting sets and chains alone, one element in each set."""
    rs = Ruleset(table=Table(family=f.family, name=TABLE))
    add_counting(rs, f)
    addr = ip_address("fd00::10" if f.version == 6 else "10.96.0.10")
    for el in (
        Element(set=n.SERVICE_COUNTERS, key=(addr, L4Proto.TCP, 80)),
        Element(set=n.NODEPORT_COUNTERS, key=(L4Proto.UDP, 30053)),
    ):
        rs.add_element(el)
    return rs


@pytest.mark.parametrize("spec", [IPV4, IPV6], ids=["ip", "ip6"])
def test_render_equals_nft_list(make_netns: Callable[[str], str], spec: FamilySpec) -> None:
    ns = make_netns("scr")
    planned = _counting(spec)
    text = render_ruleset(planned)
    proc = subprocess.run(
        ["ip", "netns", "exec", ns, "nft", "-f", "-"], input=text, text=True, capture_output=True
    )
    assert proc.returncode == 0, f"nft -f rejected the rendered text: {proc.stderr}\n{text}"
    listed = sh("nft", "list", "table", str(spec.family), TABLE, ns=ns)
    counts = read_counters(spec.family, TABLE, counter_sets(spec.family), netns=ns)
    assert set(counts) == {n.SERVICE_COUNTERS, n.NODEPORT_COUNTERS}
    assert render_ruleset(planned, counts) == listed
    assert "counter packets 0 bytes 0" in listed

    back = read_ruleset(spec.family, TABLE, netns=ns)
    assert back is not None
    assert back.sets == planned.sets, "a set nft declared with counter reads back as planned"
    assert back.elements == planned.elements
    for chain, rules in planned.rules.items():
        assert [r.exprs for r in back.rules[chain]] == [r.exprs for r in rules]


def test_counter_values_follow_the_kernel(make_netns: Callable[[str], str]) -> None:
    """Values nft loads into an element are what read_counters and the renderer show."""
    ns = make_netns("scv")
    planned = _counting(IPV4)
    text = render_ruleset(planned).replace("30053 counter", "30053 counter packets 7 bytes 1234")
    subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=text, text=True, check=True)
    counts = read_counters(Family.IP, TABLE, counter_sets(Family.IP), netns=ns)
    assert counts[n.NODEPORT_COUNTERS] == {(17, 30053): (7, 1234)}
    assert counts[n.SERVICE_COUNTERS] == {(ip_address("10.96.0.10"), 6, 80): (0, 0)}
    listed = sh("nft", "list", "table", "ip", TABLE, ns=ns)
    assert render_ruleset(planned, counts) == listed
