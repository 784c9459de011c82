"""The planner's short way for plain ports (ClusterIP only, random choice, Cluster policy)
gives what the general way gives: the same rulesets (rendered, and element by element in
order), the same fragments (operations in order) and the same port summaries."""

from __future__ import annotations

from typing import Any

import pytest

from nlproxy.cluster.model import ClusterSnapshot, LoadBalancing
from nlproxy.nft.packed import PackedElements
from nlproxy.nft.render import render_ruleset
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.planner import FamilyPlanner, Plan, hairpin_of, plan
from nlproxy.proxy.skeleton import IPV4
from tests.unit.builders import NODE, endpoint, eps_slice, node, port, service, snapshot
from tests.world import config, world


def _edges() -> ClusterSnapshot:
    """Plain ports at their edges: no endpoints, none ready, serving-terminating ones,
    topology hints, duplicate addresses over two slices, named target ports, dual-stack,
    a port beside a node port, a Local external policy on a ClusterIP Service, and on Services
    reachable from outside only by the other family's address."""
    s, e, sl, p = service, endpoint, eps_slice, port
    svcs = [
        s("a", "empty", "172.30.1.1"),
        s("a", "unready", "172.30.1.2"),
        s("a", "draining", "172.30.1.3"),
        s("a", "hinted", "172.30.1.4"),
        s("a", "twoslices", "172.30.1.5"),
        s(
            "a",
            "named",
            "172.30.1.6",
            [p("a", "named", "web", 80, target="web"), p("a", "named", "dns", 53, "UDP")],
        ),
        s("a", "dual", ["172.30.1.7", "fd00:172:30::7"]),
        s("a", "v6", "fd00:172:30::8"),
        s(
            "a",
            "mixed",
            "172.30.1.9",
            [p("a", "mixed", "p80"), p("a", "mixed", "np", 81, node_port=30081)],
        ),
        s("a", "localext", "172.30.1.10", external_policy_local=True, health_check_node_port=31000),
        s("a", "unsorted", "172.30.1.11"),
        s("a", "onehinted", "172.30.1.12"),
        s("a", "onezoned", "172.30.1.13"),
        # Externally reachable only through the other family's address: Local policy still
        # applies to this family's endpoints (its local set, the health check's count).
        s(
            "a",
            "extother",
            "172.30.1.14",
            external_ips=["fd00:1::14"],
            external_policy_local=True,
            health_check_node_port=31001,
        ),
        s(
            "a",
            "lbother",
            ["172.30.1.15", "fd00:172:30::15"],
            load_balancer_ips=["192.0.2.15"],
            external_policy_local=True,
            health_check_node_port=31002,
        ),
    ]
    slices = [
        sl("a", "unready", [e("10.1.0.1", ready=False, serving=False)]),
        sl(
            "a",
            "draining",
            [
                e("10.1.0.2", ready=False, terminating=True),
                e("10.1.0.3", NODE, ready=False, terminating=True),
            ],
        ),
        sl(
            "a",
            "hinted",
            [e("10.1.0.4", NODE, hints_nodes=[NODE]), e("10.1.0.5", hints_nodes=["x"])],
        ),
        sl("a", "twoslices", [e("10.1.0.6"), e("10.1.0.7")], slice_name="b"),
        sl("a", "twoslices", [e("10.1.0.7"), e("10.1.0.8", NODE)], slice_name="a"),
        sl(
            "a",
            "named",
            [e("10.1.0.9"), e("10.1.0.10")],
            [("web", 8080, "TCP"), ("dns", 5353, "UDP")],
        ),
        sl("a", "dual", [e("10.1.0.11"), e("10.1.0.12", NODE)]),
        sl("a", "dual", [e("fd00:10::11"), e("fd00:10::12", NODE)]),
        sl("a", "v6", [e("fd00:10::13")]),
        sl("a", "mixed", [e("10.1.0.13")], [("p80", 80, "TCP"), ("np", 81, "TCP")]),
        sl("a", "localext", [e("10.1.0.14", NODE), e("10.1.0.15")]),
        sl("a", "unsorted", [e("10.1.0.17"), e("10.1.0.16"), e("10.1.0.17")]),
        sl("a", "onehinted", [e("10.1.0.18", hints_nodes=["elsewhere"])]),
        sl("a", "onezoned", [e("10.1.0.19", hints_zones=["zone-b"])]),
        sl(
            "a",
            "extother",
            [e("10.1.0.20", NODE, ready=False, terminating=True), e("10.1.0.21")],
        ),
        sl("a", "lbother", [e("fd00:10::22", NODE), e("fd00:10::23")]),
    ]
    return snapshot(svcs, slices, node=node())


def _seen(p: Plan) -> list[Any]:
    out: list[Any] = []
    for family, rs in p.rulesets.items():
        out.append(render_ruleset(rs))
        out.append(list(rs.chains))
        for name, els in rs.elements.items():
            out.append(
                (name, list(els.raw.items() if isinstance(els, PackedElements) else els.items()))
            )
        for key, frag in p.fragments[family].items():
            out.append((key, frag.ops, frag.pieces, list(hairpin_of(frag)), frag.shuffled))
    out.append(list(p.ports.items()))
    return out


@pytest.mark.parametrize(
    ("snap", "cfg"),
    [
        (world(), config()),
        (world(), config(cluster_cidrs=(), service_cidrs=())),
        (world(), config(load_balancing=LoadBalancing.ROUND_ROBIN)),
        (world(), config(service_counters=True)),
        (_edges(), config()),
        (_edges(), config(cluster_cidrs=())),
        (_edges(), ProxyConfig(node_name=NODE)),
    ],
    ids=[
        "world",
        "world-no-cidrs",
        "world-rr",
        "world-counters",
        "edges",
        "edges-no-pods",
        "edges-bare",
    ],
)
def test_plain_ports_plan_as_the_general_way(
    snap: ClusterSnapshot, cfg: ProxyConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    short = _seen(plan(snap, cfg))
    monkeypatch.setattr(FamilyPlanner, "plain", False)
    general = _seen(plan(snap, cfg))
    assert short == general


def test_the_short_way_is_taken() -> None:
    """(Else the comparison above compares the general way with itself.)"""
    taken = []

    class Counting(FamilyPlanner):
        def _plain_port(self, *args: Any) -> Any:
            taken.append(args[1].ref)
            return super()._plain_port(*args)

    snap = _edges()
    fp = Counting(IPV4, snap, config())
    for key in sorted(snap.services):
        fp.add_service(snap.services[key], snap.slices.get(key, ()))
    assert {str(r) for r in taken} >= {"a/empty:p80/TCP", "a/mixed:p80/TCP", "a/dual:p80/TCP"}
    assert "a/mixed:np/TCP" not in {str(r) for r in taken}
