"""Planner: determinism, ruleset shape (no per-service chains), naming, summary, integrity."""

from __future__ import annotations

from ipaddress import ip_address, ip_network

import pytest

from nlproxy.cluster.model import ClusterSnapshot, EndpointSlice, IPFamily, Protocol, Service
from nlproxy.errors import ConfigError, InvalidNftObject
from nlproxy.nft.ir import (
    DnatMap,
    Element,
    Family,
    InlineVMap,
    Lookup,
    Ruleset,
    SetUpdate,
    Verdict,
    VMap,
)
from nlproxy.proxy import naming
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.endpoints import resolve
from nlproxy.proxy.planner import FrontendKind, plan
from tests.unit.builders import NODE, endpoint, eps_slice, node, port, service, snapshot

CONFIG = ProxyConfig(
    node_name=NODE,
    cluster_cidrs=(ip_network("10.0.0.0/8"),),
    service_cidrs=(ip_network("172.30.0.0/16"),),
)


def _many(count: int, *, affinity_every: int = 0) -> tuple[list[Service], list[EndpointSlice]]:
    """``count`` services of mixed kinds and policies with 1..5 endpoints each."""
    svcs, slices = [], []
    for i in range(count):
        ns, name = f"ns{i % 7}", f"svc{i}"
        cip = f"172.30.{i // 250}.{i % 250 + 1}"
        kind = i % 4
        overrides: dict[str, object] = {}
        ports = [port(ns, name, node_port=30000 + i if kind else None)]
        if kind >= 2:
            overrides["load_balancer_ips"] = [f"1.{i // 250}.{i % 250}.1"]
        if kind == 3:
            overrides["external_policy_local"] = True
        if i % 5 == 0:
            overrides["internal_policy_local"] = True
        if affinity_every and i % affinity_every == 0:
            overrides["affinity_timeout"] = 300
        svcs.append(service(ns, name, cip, ports, **overrides))
        eps = [
            endpoint(f"10.{i // 250}.{i % 250}.{j + 1}", NODE if j == 0 else "other")
            for j in range(i % 5 + 1)
        ]
        slices.append(eps_slice(ns, name, eps))
    return svcs, slices


def _dump(rs: Ruleset) -> list[object]:
    """Everything in order, so that equal dumps mean byte-for-byte equal plans."""
    return [
        rs.table,
        list(rs.chains.items()),
        list(rs.rules.items()),
        list(rs.sets.items()),
        [(k, list(v.items())) for k, v in rs.elements.items()],
    ]


def test_plan_is_deterministic_whatever_the_input_order() -> None:
    svcs, slices = _many(200, affinity_every=9)
    first = plan(snapshot(svcs, slices, node=node()), CONFIG)
    again = plan(snapshot(svcs, slices, node=node()), CONFIG)
    shuffled = plan(snapshot(svcs[::-1], slices[::-1], node=node()), CONFIG)
    for family in (Family.IP, Family.IP6):
        assert _dump(first.rulesets[family]) == _dump(again.rulesets[family])
        assert _dump(first.rulesets[family]) == _dump(shuffled.rulesets[family])
    assert list(first.ports.items()) == list(shuffled.ports.items())


def test_chains_do_not_grow_with_services_or_endpoints() -> None:
    small = plan(snapshot(*_many(1000), node=node()), CONFIG).rulesets[Family.IP]
    large = plan(snapshot(*_many(2000), node=node()), CONFIG).rulesets[Family.IP]
    assert set(small.chains) == set(large.chains)
    # 18 static chains plus at most 7 shared dispatch roles per endpoint count (1..5, and 0
    # for Local policies without local endpoints).
    assert len(large.chains) <= 18 + 7 * 6
    assert not [c for c in large.chains if "svc" in c]
    assert len(large.elements[naming.BACKENDS]) > 2000
    assert len(large.sets) == 20


NEW = ("new", "newlocal")
"""The chains choosing a new client's endpoint (every endpoint, this node's)."""


def test_affinity_is_the_only_per_service_state() -> None:
    svcs, slices = _many(1000, affinity_every=100)
    rs = plan(snapshot(svcs, slices, node=node()), CONFIG).rulesets[Family.IP]
    baseline = plan(snapshot(*_many(1000), node=node()), CONFIG).rulesets[Family.IP]
    extra = [c for c in rs.chains if c not in baseline.chains]
    affinity = [s for s in svcs if s.affinity_timeout]
    assert len(affinity) == 10
    for chain in extra:
        assert chain.split("-")[0] in {"service", "local", "external", "learn", *NEW}, chain
        assert rs.chains[chain].comment.startswith("ns")
    # One dynamic map per port (the clients; and this node's endpoints' clients with a Local
    # policy): nothing per endpoint.
    dynamic = [s.name.split("-")[0] for s in rs.sets.values() if s.timeout == 300]
    assert dynamic.count("clients") == sum(len(s.ports) for s in affinity)
    assert set(dynamic) == {"clients", "localclients"}


def _references(rs: Ruleset) -> tuple[set[str], set[str]]:
    chains: set[str] = set()
    sets: set[str] = set()

    def verdict(v: object) -> None:
        if isinstance(v, Verdict) and v.chain:
            chains.add(v.chain)

    for rules in rs.rules.values():
        for rule in rules:
            for e in rule.exprs:
                verdict(e)
                if isinstance(e, Lookup | SetUpdate):
                    sets.add(e.set)
                elif isinstance(e, VMap | DnatMap):
                    sets.add(e.map)
                elif isinstance(e, InlineVMap):
                    for _, v in e.entries:
                        verdict(v)
    for elements in rs.elements.values():
        for el in elements.values():
            verdict(el.value)
    return chains, sets


@pytest.mark.parametrize("family", [Family.IP, Family.IP6])
def test_every_reference_resolves(family: Family) -> None:
    svcs, slices = _many(300, affinity_every=7)
    svcs.append(service("v6", "svc", "fd00:172:30::1", [port("v6", "svc", node_port=31000)]))
    slices.append(eps_slice("v6", "svc", [endpoint("fd00:10::1", NODE)]))
    rs = plan(snapshot(svcs, slices, node=node()), CONFIG).rulesets[family]
    chains, sets = _references(rs)
    assert chains <= set(rs.chains)
    assert sets <= set(rs.sets)
    assert all(el.set == name for name, els in rs.elements.items() for el in els.values())
    assert set(rs.elements) == set(rs.sets)


def test_empty_snapshot_has_both_tables() -> None:
    p = plan(ClusterSnapshot(services={}, slices={}), ProxyConfig(node_name=NODE))
    assert set(p.rulesets) == {Family.IP, Family.IP6}
    assert p.rulesets[Family.IP6].table.family is Family.IP6
    assert p.ports == {}


def _one(**overrides: object) -> tuple[ClusterSnapshot, Service]:
    svc = service(
        "web",
        "front",
        ["172.30.0.10", "fd00:172:30::10"],
        [port("web", "front", "http", 80, node_port=30080), port("web", "front", "dns", 53, "UDP")],
        **overrides,
    )
    slices = [
        eps_slice(
            "web", "front", [endpoint("10.0.0.9"), endpoint("10.0.0.3", NODE)],
            [("http", 8080, "TCP"), ("dns", 5353, "UDP")],
        ),
        eps_slice("web", "front", [endpoint("fd00:10::3", NODE)], [("http", 8080, "TCP")]),
    ]  # fmt: skip
    return snapshot([svc], slices, node=node()), svc


def test_summary_names_frontends_and_endpoints() -> None:
    snap, svc = _one(
        load_balancer_ips=["1.2.3.4"], external_policy_local=True, health_check_node_port=32000
    )
    p = plan(snap, CONFIG)
    http = p.ports[svc.ports[0].ref]
    kinds = [(f.family, f.kind, str(f.address), f.port) for f in http.frontends]
    assert kinds == [
        (Family.IP, FrontendKind.CLUSTER_IP, "172.30.0.10", 80),
        (Family.IP, FrontendKind.LOAD_BALANCER, "1.2.3.4", 80),
        (Family.IP, FrontendKind.NODE_PORT, "None", 30080),
        (Family.IP6, FrontendKind.CLUSTER_IP, "fd00:172:30::10", 80),
        (Family.IP6, FrontendKind.NODE_PORT, "None", 30080),
    ]
    assert [b.text for b in http.cluster_endpoints] == [
        "10.0.0.3:8080",
        "10.0.0.9:8080",
        "[fd00:10::3]:8080",
    ]
    assert [b.text for b in http.local_endpoints] == ["10.0.0.3:8080", "[fd00:10::3]:8080"]
    assert http.has_endpoints
    assert http.health_check_node_port == 32000
    dns = p.ports[svc.ports[1].ref]
    assert [b.text for b in dns.cluster_endpoints] == ["10.0.0.3:5353", "10.0.0.9:5353"]
    assert all(f.protocol is Protocol.UDP for f in dns.frontends)


def test_elements_carry_the_service_port_and_index_endpoints_in_order() -> None:
    snap, _ = _one()
    rs = plan(snap, CONFIG).rulesets[Family.IP]
    cip = ip_address("172.30.0.10")
    dispatch = rs.elements[naming.SERVICE_IPS][(cip, 6, 80)]
    assert dispatch.comment == "web/front:http/TCP"
    assert rs.elements[naming.SERVICE_NODEPORTS][(6, 30080)].comment == "web/front:http/TCP"
    backends = {k: v.value for k, v in rs.elements[naming.BACKENDS].items() if k[0] == cip}
    assert backends == {
        (cip, 6, 80, 0): (ip_address("10.0.0.3"), 8080),
        (cip, 6, 80, 1): (ip_address("10.0.0.9"), 8080),
        (cip, 17, 53, 0): (ip_address("10.0.0.3"), 5353),
        (cip, 17, 53, 1): (ip_address("10.0.0.9"), 5353),
    }
    assert dispatch.value == Verdict(dispatch.value.kind, naming.cluster_ip_chain(2))  # type: ignore[union-attr]


def test_no_endpoints_reject_and_no_local_endpoints_drop() -> None:
    svc = service(
        "a", "b", "172.30.0.1", [port("a", "b", node_port=30001)], external_policy_local=True
    )
    rs = plan(snapshot([svc], []), CONFIG).rulesets[Family.IP]
    no_ep = rs.elements[naming.NO_ENDPOINT_NODEPORTS][(6, 30001)]
    assert no_ep.value == Verdict(no_ep.value.kind, naming.REJECT_CHAIN)  # type: ignore[union-attr]
    slices = [eps_slice("a", "b", [endpoint("10.0.0.1", "other")])]
    rs = plan(snapshot([svc], slices), CONFIG).rulesets[Family.IP]
    dropped = rs.elements[naming.NO_ENDPOINT_NODEPORTS][(6, 30001)]
    assert dropped.value == Verdict(dropped.value.kind)  # type: ignore[union-attr]
    assert str(dropped.value.kind) == "drop"  # type: ignore[union-attr]
    assert (ip_address("172.30.0.1"), 6, 80) not in rs.elements[naming.NO_ENDPOINT_SERVICES]


def test_source_ranges_are_collapsed_per_destination() -> None:
    svc = service(
        "a", "lb", "172.30.0.2", load_balancer_ips=["1.1.1.1"],
        load_balancer_source_ranges=["203.0.113.0/25", "203.0.113.0/24", "198.51.100.7/32"],
    )  # fmt: skip
    rs = plan(snapshot([svc], []), CONFIG).rulesets[Family.IP]
    keys = sorted(str(k[3]) for k in rs.elements[naming.FIREWALL_ALLOW])
    assert keys == ["198.51.100.7/32", "203.0.113.0/24"]
    assert list(rs.elements[naming.FIREWALL_IPS]) == [(ip_address("1.1.1.1"), 6, 80)]


def test_hairpin_pairs_once_per_endpoint_address() -> None:
    svcs, slices = _many(50)
    rs = plan(snapshot(svcs, slices), CONFIG).rulesets[Family.IP]
    hairpin: dict[tuple[object, ...], Element] = rs.elements[naming.HAIRPIN]  # type: ignore[assignment]
    addresses = {ep.ip for sl in slices for ep in sl.endpoints}
    assert set(hairpin) == {(ip, ip) for ip in addresses}


def test_names_fit_the_kernel_limit() -> None:
    ns, name = "n" * 63, "s" * 63
    ref = port(ns, name, "p" * 15, 80).ref
    ip = ip_address("fd00:1111:2222:3333:4444:5555:6666:7777")
    names = [
        naming.affinity_service_chain(ref),
        naming.affinity_endpoint_chain(ref, ip, 65535),
        naming.affinity_set(ref, ip, 65535),
    ]
    assert all(len(x) <= naming.MAX_NAME for x in names)
    assert all(naming.check_name("chain", x) == x for x in names)
    other = port(ns, name, "p" * 14 + "q", 80).ref
    assert naming.affinity_set(other, ip, 65535) != naming.affinity_set(ref, ip, 65535)
    with pytest.raises(InvalidNftObject, match="chain xxx"):
        naming.check_name("chain", "x" * 256)
    with pytest.raises(InvalidNftObject):
        naming.check_name("set", "")


def test_long_affinity_names_are_shortened_but_distinct() -> None:
    ref = port("n" * 63, "s" * 63, "p" * 15, 80).ref
    a = naming.affinity_endpoint_chain(ref, ip_address("fd00::" + "1:1:1:1:1"), 1)
    b = naming.affinity_endpoint_chain(ref, ip_address("fd00::" + "1:1:1:1:2"), 1)
    assert a != b
    assert a.startswith("endpoint-")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        pytest.param({"nodeport_addresses": ("eth0",)}, "'eth0' is neither", id="bad-cidr"),
        pytest.param({"masquerade_bit": 32}, "32 is not in 0..31", id="bad-bit"),
    ],
)
def test_config_errors_name_the_field(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ProxyConfig(node_name=NODE, **overrides)  # type: ignore[arg-type]


def test_node_ips_override_the_node_object() -> None:
    svc = service("a", "b", "172.30.0.1", [port("a", "b", node_port=30001)])
    snap = snapshot([svc], [eps_slice("a", "b", [endpoint("10.0.0.1")])], node=node())
    cfg = ProxyConfig(node_name=NODE, node_ips=(ip_address("192.168.7.7"),))
    rs = plan(snap, cfg).rulesets[Family.IP]
    assert list(rs.elements[naming.NODEPORT_IPS]) == [(ip_address("192.168.7.7"),)]
    assert list(plan(snap, ProxyConfig(node_name=NODE)).rulesets[Family.IP].elements[
        naming.NODEPORT_IPS
    ]) == [(ip_address("192.168.0.2"),)]  # fmt: skip


def test_replaying_unchanged_services_gives_the_fresh_plan() -> None:
    svcs, slices = _many(300, affinity_every=7)
    first = plan(snapshot(svcs, slices, node=node()), CONFIG)
    # Change one service, one slice, drop one service and add one; keep the rest as objects.
    svcs2, slices2 = list(svcs), list(slices)
    svcs2[3] = service("ns3", "svc3", "172.30.0.4", external_ips=["192.168.99.3"])
    slices2[10] = eps_slice("ns3", "svc10", [endpoint("10.99.0.1", NODE)])
    del svcs2[20], slices2[20]
    svcs2.append(service("new", "svc", "172.30.200.1"))
    slices2.append(eps_slice("new", "svc", [endpoint("10.99.0.2")]))
    snap2 = snapshot(svcs2, slices2, node=node())
    replayed = plan(snap2, CONFIG, previous=first)
    fresh = plan(snap2, CONFIG)
    for family in (Family.IP, Family.IP6):
        assert _dump(replayed.rulesets[family]) == _dump(fresh.rulesets[family])
    assert list(replayed.ports.items()) == list(fresh.ports.items())
    # The untouched services' elements are the previous plan's objects, not rebuilt ones.
    key = (ip_address("172.30.0.2"), 6, 80)
    old_el = first.rulesets[Family.IP].elements[naming.SERVICE_IPS][key]
    assert replayed.rulesets[Family.IP].elements[naming.SERVICE_IPS][key] is old_el
    assert fresh.rulesets[Family.IP].elements[naming.SERVICE_IPS][key] is not old_el
    # A changed configuration plans everything again.
    other = ProxyConfig(node_name=NODE, cluster_cidrs=(ip_network("10.0.0.0/16"),))
    redone = plan(snap2, other, previous=first)
    assert redone.rulesets[Family.IP].elements[naming.SERVICE_IPS][key] is not old_el
    assert _dump(redone.rulesets[Family.IP]) == _dump(plan(snap2, other).rulesets[Family.IP])


def test_a_slices_endpoints_are_sorted_and_the_first_listing_of_an_address_wins() -> None:
    """Whatever order a slice lists its endpoints in, the backends are in address order, and
    an address listed twice is the first listing (here: the not-ready one, so it is left out)."""
    svc = service("default", "web", "172.30.0.10")
    listings = {
        "sorted": ["10.1.0.1", "10.1.0.2", "10.1.0.3"],
        "unsorted": ["10.1.0.3", "10.1.0.1", "10.1.0.2"],
    }
    for order, ips in listings.items():
        sl = eps_slice("default", "web", [endpoint(ip) for ip in ips])
        backends, _ = resolve(svc.ports[0], [sl], IPFamily.IPV4)
        assert [str(b.ip) for b in backends] == sorted(ips), order
    twice = [endpoint("10.1.0.2", ready=False), endpoint("10.1.0.1"), endpoint("10.1.0.2")]
    sl = eps_slice("default", "web", twice)
    backends, eps = resolve(svc.ports[0], [sl], IPFamily.IPV4)
    assert [str(b.ip) for b in backends] == ["10.1.0.1", "10.1.0.2"]
    assert [ep.ready for ep in eps] == [True, False]
