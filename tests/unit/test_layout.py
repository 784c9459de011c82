"""proxy/layout.py reads back what the planner wrote: the frontends and backends of each port."""

from __future__ import annotations

from ipaddress import ip_address
from typing import Any

import pytest

from nlproxy.cluster.model import ClusterSnapshot, LoadBalancing
from nlproxy.nft.ir import Element, Family, Ruleset, Table
from nlproxy.operate.programmed import kernel_frontends
from nlproxy.proxy import layout
from nlproxy.proxy.layout import (
    Backend,
    Frontend,
    UnexpectedElement,
    programmed_frontends,
    proto_name,
)
from nlproxy.proxy.planner import Plan, plan
from tests.unit.builders import NODE, endpoint, eps_slice, port, service, snapshot
from tests.world import config

CHOICES = [
    pytest.param({}, id="random"),
    pytest.param({"load_balancing": LoadBalancing.ROUND_ROBIN}, id="round-robin"),
    pytest.param({"load_balancing": LoadBalancing.CONSISTENT_HASH}, id="consistent-hash"),
    pytest.param({"affinity_timeout": 60}, id="affinity"),
    pytest.param({"external_policy_local": True}, id="random-local"),
    pytest.param(
        {"load_balancing": LoadBalancing.ROUND_ROBIN, "external_policy_local": True},
        id="round-robin-local",
    ),
]


def _world(**overrides: Any) -> ClusterSnapshot:
    """A dual-stack Service with a TCP and a UDP port, an external IP and node ports, three
    endpoints per family (one on this node), and a second Service with no endpoints."""
    ports = [
        port("ns", "web", "http", 80, node_port=30080, target=8080),
        port("ns", "web", "dns", 53, "UDP", node_port=30053, target=5353),
    ]
    web = service(
        "ns",
        "web",
        ["172.30.0.10", "fd00:172:30::10"],
        ports,
        external_ips=["192.0.2.10"],
        **overrides,
    )
    empty = service("ns", "empty", "172.30.0.11", [port("ns", "empty", "http", 80)], **overrides)
    slice_ports = [("http", 8080, "TCP"), ("dns", 5353, "UDP")]
    v4 = [endpoint("10.180.0.1", NODE), endpoint("10.180.0.2"), endpoint("10.180.0.3")]
    v6 = [endpoint("fd00:10::1", NODE), endpoint("fd00:10::2"), endpoint("fd00:10::3")]
    return snapshot(
        [web, empty],
        [eps_slice("ns", "web", v4, slice_ports), eps_slice("ns", "web", v6, slice_ports)],
    )


def _planned(p: Plan) -> tuple[dict[Frontend, frozenset[Backend]], dict[Frontend, str]]:
    """Every planned frontend that DNATs, with the endpoints its port may DNAT to, and its
    port's name (the traffic of a port without endpoints is rejected: no dispatch)."""
    backends: dict[Frontend, frozenset[Backend]] = {}
    names: dict[Frontend, str] = {}
    for pp in p.ports.values():
        if not pp.has_endpoints:
            continue
        bes = frozenset(Backend(b.ip, b.port) for b in (*pp.cluster_endpoints, *pp.local_endpoints))
        for f in pp.frontends:
            fe = Frontend(f.protocol.value.lower(), f.address, f.port)
            family = 4 if f.family is Family.IP else 6
            mine = frozenset(b for b in bes if b.addr.version == family)
            backends[fe] = backends.get(fe, frozenset()) | mine  # node ports: both families
            names[fe] = str(pp.ref)
    return backends, names


@pytest.mark.parametrize("overrides", CHOICES)
def test_programmed_frontends_are_the_planned_ones(overrides: dict[str, Any]) -> None:
    p = plan(_world(**overrides), config())
    want, names = _planned(p)
    got = programmed_frontends(p.rulesets.values())
    assert dict(got) == want
    assert dict(got.services) == names
    # A node port merges both families.
    assert got[Frontend("tcp", None, 30080)] == {
        Backend(ip_address(a), 8080)
        for a in (
            "10.180.0.1",
            "10.180.0.2",
            "10.180.0.3",
            "fd00:10::1",
            "fd00:10::2",
            "fd00:10::3",
        )
    }
    assert got.frontends_of("ns/empty") == []


@pytest.mark.parametrize("overrides", CHOICES)
def test_udp_only_keeps_every_udp_frontend_and_nothing_else(overrides: dict[str, Any]) -> None:
    p = plan(_world(**overrides), config())
    full = programmed_frontends(p.rulesets.values())
    udp = programmed_frontends(layout.udp_only(rs) for rs in p.rulesets.values())
    assert dict(udp) == {fe: bes for fe, bes in full.items() if fe.proto == "udp"}


def test_an_element_of_another_shape_is_named() -> None:
    rs = Ruleset(table=Table(family=Family.IP, name="nlproxy"))
    rs.elements["backends"] = {("x", 6, 80, 0): Element(set="backends", key=("x", 6, 80, 0))}  # type: ignore[arg-type]
    with pytest.raises(UnexpectedElement, match=r"map backends: key is not daddr"):
        programmed_frontends([rs])
    assert layout.targets(rs, "backends", 3) == {}


@pytest.mark.parametrize("overrides", CHOICES)
def test_explain_reads_the_same_frontends(overrides: dict[str, Any]) -> None:
    """``explain``'s view: per family, the dispatching frontends with the planned endpoints
    (those of the Local policy apart), and the rejected one."""
    p = plan(_world(**overrides), config())
    want, _ = _planned(p)
    for family, rs in p.rulesets.items():
        fronts = kernel_frontends(rs)
        got = {
            Frontend(proto_name(fe.proto).lower(), fe.address, fe.port): frozenset(
                Backend(*t) for t in (*fe.endpoints, *fe.local_endpoints)
            )
            for fe in fronts
            if fe.dispatch is not None
        }
        version = 4 if family is Family.IP else 6
        assert got == {
            fe: frozenset(b for b in bes if b.addr.version == version)
            for fe, bes in want.items()
            if fe.addr is None or fe.addr.version == version
        }
        rejected = [fe.label for fe in fronts if fe.dispatch is None]
        assert rejected == (["172.30.0.11:80/TCP"] if family is Family.IP else [])
