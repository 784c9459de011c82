"""The inspector's index of the plan's endpoints (``inspect/reachability.py``): a whole new plan
and per-service changes noted after it are both taken in, and each address is classified once
while any service uses it and forgotten when none does. A fake node stands in for the kernel."""

from __future__ import annotations

from ipaddress import ip_address, ip_network

from prometheus_client import CollectorRegistry

from nlproxy.cluster.model import ClusterSnapshot, ServiceKey
from nlproxy.inspect.fake import FakeNode
from nlproxy.inspect.reachability import ReachabilityMonitor
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.planner import plan
from tests.unit.builders import NODE, endpoint, eps_slice, service, snapshot

CONFIG = ProxyConfig(node_name=NODE, cluster_cidrs=(ip_network("10.0.0.0/8"),))


def world(spec: dict[str, list[str]]) -> ClusterSnapshot:
    """Services ``name`` of namespace ``ns``, each with endpoints at the addresses given."""
    return snapshot(
        [service("ns", name, f"172.30.0.{i + 1}") for i, name in enumerate(spec)],
        [eps_slice("ns", name, [endpoint(ip) for ip in ips]) for name, ips in spec.items()],
    )


def addrs(*ips: str) -> set[object]:
    return {ip_address(ip) for ip in ips}


async def test_a_new_plan_then_changes_of_one_service_are_both_taken_in() -> None:
    monitor = ReachabilityMonitor(CollectorRegistry(), node=FakeNode())
    first = world({"a": ["10.1.0.1", "10.1.0.2"], "b": ["10.1.0.2", "10.1.0.3"]})
    monitor.plan_changed(plan(first, CONFIG).ports, None)
    await monitor._evaluate(full=False)
    assert set(monitor.verdicts) == addrs("10.1.0.1", "10.1.0.2", "10.1.0.3")

    # A whole new plan (a full sync): b is gone, c came; then, before the inspector looks,
    # one service changes again (an incremental sync): both count.
    second = world({"a": ["10.1.0.1", "10.1.0.2"], "c": ["10.1.0.4"]})
    monitor.plan_changed(plan(second, CONFIG).ports, None)
    third = world({"a": ["10.1.0.5"], "c": ["10.1.0.4"]})
    monitor.plan_changed(plan(third, CONFIG).ports, {ServiceKey(namespace="ns", name="a")})
    await monitor._evaluate(full=False)
    assert set(monitor.verdicts) == addrs("10.1.0.4", "10.1.0.5")

    # An address two services share stays while one of them uses it.
    fourth = world({"a": ["10.1.0.5"], "c": ["10.1.0.4", "10.1.0.5"]})
    monitor.plan_changed(plan(fourth, CONFIG).ports, {ServiceKey(namespace="ns", name="c")})
    await monitor._evaluate(full=False)
    fifth = world({"c": ["10.1.0.4", "10.1.0.5"]})
    monitor.plan_changed(plan(fifth, CONFIG).ports, {ServiceKey(namespace="ns", name="a")})
    await monitor._evaluate(full=False)
    assert set(monitor.verdicts) == addrs("10.1.0.4", "10.1.0.5")
