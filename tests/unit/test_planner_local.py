"""Who is masqueraded on the way to a ClusterIP: ``masqueradeAll`` and kube-proxy's detect-local
modes that tell pods apart by source range (``ClusterCIDR``, ``NodeCIDR`` from the Node's
``spec.podCIDRs``), traced through the planned ruleset for every Service layout."""

from __future__ import annotations

from dataclasses import replace
from ipaddress import ip_address, ip_network
from typing import Any

import pytest

from nlproxy.cluster.model import LoadBalancing, Node, Protocol
from nlproxy.nft.ir import Cmp, Family, Field, Lookup, Op, jump
from nlproxy.proxy import naming as n
from nlproxy.proxy.config import DetectLocal, ProxyConfig
from nlproxy.proxy.incremental import attach, plan_update
from nlproxy.proxy.planner import plan
from nlproxy.proxy.tracer import trace
from tests.unit.builders import NODE, endpoint, eps_slice, service, snapshot

NODE_IP = "192.168.0.2"
CIP = "172.30.0.10"
POD_HERE = "10.1.0.5"
"""A pod of this node (inside the Node's podCIDR 10.1.0.0/24 and the cluster's 10.0.0.0/8)."""
POD_ELSEWHERE = "10.2.0.7"
"""A pod of another node: in the cluster's range, not in this Node's podCIDR."""
OFF_CLUSTER = "203.0.113.9"

LAYOUTS = {
    "plain": {},
    "affinity": {"affinity_timeout": 300},
    "round-robin": {"load_balancing": LoadBalancing.ROUND_ROBIN},
    "consistent-hash": {"load_balancing": LoadBalancing.CONSISTENT_HASH},
}


def _node(pod_cidrs: tuple[str, ...] = ("10.1.0.0/24", "fd00:10:1::/64")) -> Node:
    return Node(
        name=NODE,
        addresses=(ip_address(NODE_IP), ip_address("fd00:192::2")),
        pod_cidrs=tuple(ip_network(c) for c in pod_cidrs),
    )


def _world(layout: str, node: Node | None = None) -> Any:
    overrides = dict(LAYOUTS[layout])
    svc = service("ns", "web", CIP, **overrides)
    eps = eps_slice("ns", "web", [endpoint("10.1.0.20", NODE), endpoint("10.2.0.30")])
    return snapshot([svc], [eps], node=node or _node())


def _config(**kw: Any) -> ProxyConfig:
    base = ProxyConfig(node_name=NODE, cluster_cidrs=(ip_network("10.0.0.0/8"),))
    return replace(base, **kw)


def _masqueraded(world: Any, config: ProxyConfig, src: str) -> bool:
    rs = plan(world, config).rulesets[Family.IP]
    got = trace(rs, ip_address(src), Protocol.TCP, ip_address(CIP), 80, local_addrs={NODE_IP})
    assert got.endpoints, f"{src} reaches no endpoint"
    return got.masquerade


# (detect-local mode, masqueradeAll) -> which sources are masqueraded to the ClusterIP
EXPECTED = {
    (DetectLocal.CLUSTER_CIDR, False): {POD_HERE: False, POD_ELSEWHERE: False, OFF_CLUSTER: True},
    (DetectLocal.NODE_CIDR, False): {POD_HERE: False, POD_ELSEWHERE: True, OFF_CLUSTER: True},
    (DetectLocal.CLUSTER_CIDR, True): {POD_HERE: True, POD_ELSEWHERE: True, OFF_CLUSTER: True},
    (DetectLocal.NODE_CIDR, True): {POD_HERE: True, POD_ELSEWHERE: True, OFF_CLUSTER: True},
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    ("mode", "masquerade_all"), list(EXPECTED), ids=lambda v: str(v) if v is not None else ""
)
def test_who_is_masqueraded_to_a_cluster_ip(
    layout: str, mode: DetectLocal, masquerade_all: bool
) -> None:
    config = _config(detect_local=mode, masquerade_all=masquerade_all)
    world = _world(layout)
    got = {src: _masqueraded(world, config, src) for src in (POD_HERE, POD_ELSEWHERE, OFF_CLUSTER)}
    assert got == EXPECTED[mode, masquerade_all]


def test_masquerade_all_is_upstreams_rule_before_dispatch() -> None:
    rs = plan(_world("plain"), _config(masquerade_all=True)).rulesets[Family.IP]
    first = rs.rules[n.SERVICES][0]
    assert first.exprs == (Lookup((Field.IP_DADDR,), n.CLUSTER_IPS), jump(n.MARK_FOR_MASQUERADE))
    assert first.comment == "masquerade all clusterIP traffic"
    plain = plan(_world("plain"), _config()).rulesets[Family.IP]
    assert all(r.comment != first.comment for r in plain.rules[n.SERVICES])


def test_node_cidr_takes_the_first_pod_cidr_of_each_family() -> None:
    node = _node(("10.1.0.0/24", "10.9.0.0/24", "fd00:10:1::/64"))
    rulesets = plan(_world("plain", node), _config(detect_local=DetectLocal.NODE_CIDR)).rulesets
    v4 = {e.key for e in rulesets[Family.IP].elements[n.CLUSTER_CIDRS].values()}
    v6 = {e.key for e in rulesets[Family.IP6].elements[n.CLUSTER_CIDRS].values()}
    assert v4 == {(ip_network("10.1.0.0/24"),)}
    assert v6 == {(ip_network("fd00:10:1::/64"),)}


def test_node_cidr_without_pod_cidrs_tells_no_pod_apart() -> None:
    """As upstream's no-op detector: nothing is masqueraded for being off-cluster."""
    world = _world("plain", _node(()))
    config = _config(detect_local=DetectLocal.NODE_CIDR)
    assert not _masqueraded(world, config, OFF_CLUSTER)


def test_node_cidr_follows_the_node() -> None:
    """A Node whose podCIDR changes re-plans the rule's range (upstream exits and restarts)."""
    config = _config(detect_local=DetectLocal.NODE_CIDR)
    world = _world("plain")
    first = plan(world, config)
    attach(first, world)
    moved = _world("plain", _node(("10.2.0.0/24",)))
    again, _ = plan_update(first, moved, config)
    rs = again.rulesets[Family.IP]
    for src, masq in ((POD_ELSEWHERE, False), (POD_HERE, True)):
        got = trace(rs, ip_address(src), Protocol.TCP, ip_address(CIP), 80, local_addrs={NODE_IP})
        assert got.masquerade is masq, src
    assert again.rulesets[Family.IP].elements[n.CLUSTER_CIDRS].keys() == (
        plan(moved, config).rulesets[Family.IP].elements[n.CLUSTER_CIDRS].keys()
    )


# (detect-local mode, pod_interface) -> the interface pods' packets come in on
INTERFACE_MODES = {
    "bridge": (DetectLocal.BRIDGE_INTERFACE, "cbr0", "cbr0"),
    "prefix": (DetectLocal.INTERFACE_NAME_PREFIX, "veth", "veth1a2b3c4d"),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", INTERFACE_MODES)
def test_interface_modes_tell_pods_by_the_interface_they_come_in_on(layout: str, mode: str) -> None:
    """Whatever the source address: in on the pods' interface is a pod (not masqueraded),
    in on any other interface is not (masqueraded), as kube-proxy's ``iifname`` detectors."""
    detect, name, pod_link = INTERFACE_MODES[mode]
    config = _config(detect_local=detect, pod_interface=name)
    rs = plan(_world(layout), config).rulesets[Family.IP]

    def masqueraded(src: str, iifname: str) -> bool:
        got = trace(
            rs, ip_address(src), Protocol.TCP, ip_address(CIP), 80,
            local_addrs={NODE_IP}, iifname=iifname,
        )  # fmt: skip
        assert got.endpoints, f"{src} on {iifname} reaches no endpoint"
        return got.masquerade

    assert not masqueraded(POD_HERE, pod_link)
    assert not masqueraded(OFF_CLUSTER, pod_link)
    assert masqueraded(POD_HERE, "eth0")
    assert masqueraded(POD_ELSEWHERE, "eth0")
    assert masqueraded(POD_HERE, "cbr01" if mode == "bridge" else "eth0veth")


@pytest.mark.parametrize("mode", INTERFACE_MODES)
def test_interface_modes_match_iifname_in_both_families(mode: str) -> None:
    detect, name, _ = INTERFACE_MODES[mode]
    pattern = name if detect is DetectLocal.BRIDGE_INTERFACE else name + "*"
    config = _config(detect_local=detect, pod_interface=name)
    v6 = snapshot(
        [service("ns", "web6", "fd00:30::10")],
        [eps_slice("ns", "web6", [endpoint("fd00:10:1::20", NODE)])],
        node=_node(),
    )
    for family, world in ((Family.IP, _world("plain")), (Family.IP6, v6)):
        rs = plan(world, config).rulesets[family]
        exprs = [e for rules in rs.rules.values() for r in rules for e in r.exprs]
        assert Cmp(Field.META_IIFNAME, pattern, Op.NE) in exprs, family
        assert not any(isinstance(e, Lookup) and e.set == n.CLUSTER_CIDRS for e in exprs)
        assert not rs.elements[n.CLUSTER_CIDRS], "no source range is used"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_external_local_policy_short_circuits_pods_by_interface(layout: str) -> None:
    """externalTrafficPolicy Local: a pod reaching the LoadBalancer IP gets every endpoint
    (upstream's short-circuit), telling the pod by its interface."""
    svc = service(
        "ns", "web", CIP, external_policy_local=True, load_balancer_ips=("198.51.100.7",),
        **LAYOUTS[layout],
    )  # fmt: skip
    eps = eps_slice("ns", "web", [endpoint("10.1.0.20", NODE), endpoint("10.2.0.30")])
    world = snapshot([svc], [eps], node=_node())
    config = _config(detect_local=DetectLocal.INTERFACE_NAME_PREFIX, pod_interface="veth")
    rs = plan(world, config).rulesets[Family.IP]
    lb = ip_address("198.51.100.7")

    def reached(iifname: str) -> set[str]:
        # many sources: a consistent hash picks one endpoint per source
        return set().union(*(
            trace(rs, ip_address(f"10.1.0.{host}"), Protocol.TCP, lb, 80,
                  local_addrs={NODE_IP}, iifname=iifname).endpoints
            for host in range(2, 66)
        ))  # fmt: skip

    assert reached("veth0") == {"10.1.0.20:80", "10.2.0.30:80"}
    assert reached("eth0") == {"10.1.0.20:80"}
