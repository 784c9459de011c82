"""The inspector's compact index (``inspect/reachability.py``) against a model recomputed from
scratch: after any mix of whole plans and per-service changes (bursts of both, services removed,
addresses shared by services and ports, IPv4 and IPv6 addresses with the same number), the
verdicts are exactly the current endpoints' own, and the gauges name exactly the unreachable
ones with the ports using them. A fake node stands in for the kernel: IPv4 pods are routed via
a gateway, IPv6 ones are blackholed, so an address mapped to its twin's verdict shows."""

from __future__ import annotations

import random
from ipaddress import ip_address, ip_network

from prometheus_client import CollectorRegistry

from nlproxy.cluster.model import ClusterSnapshot, IPAddress, ServiceKey
from nlproxy.inspect.classify import classify
from nlproxy.inspect.fake import FakeNode
from nlproxy.inspect.reachability import ReachabilityMonitor
from nlproxy.inspect.rtnl import Link, NextHop, Route, Snapshot
from nlproxy.proxy.planner import plan
from tests.unit.builders import endpoint, eps_slice, port, service, snapshot
from tests.unit.test_reachability_index import CONFIG

V4 = [f"10.1.0.{i}" for i in range(1, 7)]
V6 = [f"::a01:{i}" for i in range(1, 7)]  # ::a01:1 and 10.1.0.1 are both the number 0x0a010001
NAMES = [f"s{i}" for i in range(6)]


def node(blackholed: str = "::/0") -> FakeNode:
    """IPv4 pods via a gateway; ``blackholed`` (all of IPv6 unless told) unreachable."""
    gw = ip_address("192.168.1.1")
    link = Link(index=2, name="eth0", kind=None, admin_up=True, oper="UP")

    def route(dst: str, kind: int, hops: tuple[NextHop, ...], scope: int = 0) -> Route:
        return Route(
            dst=ip_network(dst), table=254, type=kind, scope=scope, priority=0, nexthops=hops
        )

    routes = (
        route("10.0.0.0/8", 1, (NextHop(oif=2, gateway=gw),)),
        route("192.168.1.0/24", 1, (NextHop(oif=2, gateway=None),), scope=253),
        route(blackholed, 6, ()),
    )
    return FakeNode(Snapshot(links={2: link}, routes=routes, neighbours={(2, gw): 2}))


def world(spec: dict[str, list[str]]) -> ClusterSnapshot:
    """Dual-stack services; odd-numbered ones have two ports."""
    services, slices = [], []
    for i, name in enumerate(NAMES):
        if name not in spec:
            continue
        two = i % 2 == 1
        ports = [port("ns", name, "p80", 80)] + ([port("ns", name, "p81", 81)] if two else [])
        slice_ports = [("p80", 80, "TCP")] + ([("p81", 81, "TCP")] if two else [])
        ips = [f"172.30.0.{i + 1}", f"fd00:30::{i + 1}"]
        services.append(service("ns", name, ips, ports))
        for family, tag in ((V4, "v4"), (V6, "v6")):
            eps = [endpoint(ip) for ip in spec[name] if ip in family]
            if eps:
                slices.append(eps_slice("ns", name, eps, slice_ports, slice_name=f"{name}-{tag}"))
    return snapshot(services, slices)


def expected_series(spec: dict[str, list[str]]) -> set[tuple[str, str, str]]:
    verdicts = classify([ip_address(ip) for ip in V6], node=node())
    out = set()
    for i, name in enumerate(NAMES):
        refs = [f"ns/{name}:p80/TCP"] + ([f"ns/{name}:p81/TCP"] if i % 2 else [])
        for ip in spec.get(name, []):
            if ip in V6:
                out |= {(ref, ip, verdicts[ip_address(ip)].reason) for ref in refs}
    return out


def exported(registry: CollectorRegistry) -> tuple[set[tuple[str, str, str]], float]:
    series, total = set(), -1.0
    for metric in registry.collect():
        for s in metric.samples:
            if s.name == "nlproxy_endpoint_unreachable":
                series.add((s.labels["service"], s.labels["endpoint"], s.labels["reason"]))
            elif s.name == "nlproxy_unreachable_endpoints":
                total = s.value
    return series, total


async def test_verdicts_and_series_follow_a_model_through_any_mix_of_changes() -> None:
    rng = random.Random(35)
    fake = node()
    registry = CollectorRegistry()
    monitor = ReachabilityMonitor(registry, node=fake)
    truth = classify([ip_address(ip) for ip in V4 + V6], node=fake)
    assert all(truth[ip_address(ip)].reachable for ip in V4)
    assert not any(truth[ip_address(ip)].reachable for ip in V6)
    spec: dict[str, list[str]] = {}
    for step in range(120):
        for _ in range(rng.choice((1, 1, 2, 3))):  # a burst of syncs before one pass
            changed = set(rng.sample(NAMES, rng.randint(1, 3)))
            for name in changed:
                if rng.random() < 0.2:
                    spec.pop(name, None)  # the service is removed
                else:
                    spec[name] = rng.sample(V4 + V6, rng.randint(1, 5))
            keys = {ServiceKey(namespace="ns", name=n) for n in changed}
            whole = rng.random() < 0.25
            monitor.plan_changed(plan(world(spec), CONFIG).ports, None if whole else keys)
        await monitor._evaluate(full=rng.random() < 0.2)

        used: set[IPAddress] = {ip_address(ip) for ips in spec.values() for ip in ips}
        assert set(monitor.verdicts) == used, step
        for ip, verdict in monitor.verdicts.items():
            assert verdict == truth[ip], (step, ip)
        bad = {ip for ip in used if ip.version == 6}
        assert monitor.unreachable == bad, step
        assert exported(registry) == (expected_series(spec), float(len(bad))), step


async def test_an_address_dropped_and_used_again_in_one_burst_gets_its_new_verdict() -> None:
    """Used again after being dropped, an address is classified again in a pass that looks
    only at the changed services, and the unreachable set follows the new verdict both ways."""
    fake = node()
    monitor = ReachabilityMonitor(CollectorRegistry(), node=fake)
    x = "10.1.0.1"
    spec = {"s0": [x, "10.1.0.2"], "s1": ["10.1.0.3"]}
    monitor.plan_changed(plan(world(spec), CONFIG).ports, None)
    await monitor._evaluate(full=False)
    assert monitor.unreachable == frozenset()
    for blackholed, bad in (("10.1.0.1/32", {ip_address(x)}), ("::/0", set())):
        fake.snapshot = node(blackholed).snapshot  # no route event: only the burst below
        giver, taker = ("s0", "s1") if x in spec["s0"] else ("s1", "s0")
        for name, ips in ((giver, [i for i in spec[giver] if i != x]), (taker, [*spec[taker], x])):
            spec[name] = ips
            key = {ServiceKey(namespace="ns", name=name)}
            monitor.plan_changed(plan(world(spec), CONFIG).ports, key)
        await monitor._evaluate(full=False)
        assert monitor.unreachable == bad
        assert monitor.verdicts[ip_address(x)].reachable == (not bad)
        assert monitor.verdicts[ip_address("10.1.0.2")].reachable  # not looked at again
