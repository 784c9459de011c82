"""The daemon's inspector, on the real kernel: its per-endpoint gauge is bounded (a node that
has lost its routes sees every endpoint of the cluster unreachable, and one series each would
cost ~85 MB at 100k), and a failed pass is retried, never fatal.

Real classification in namespaces with no routes at all (every endpoint: no route).
"""

from __future__ import annotations

from collections.abc import Callable
from ipaddress import ip_address
from typing import Any

import pytest
import structlog
import trio
from prometheus_client import CollectorRegistry

from nlproxy.inspect import reachability
from nlproxy.inspect.reachability import ReachabilityMonitor, left_out, without_unreachable
from nlproxy.proxy.endpoints import addresses
from nlproxy.proxy.planner import plan
from tests.unit.builders import endpoint, eps_slice, node, service, snapshot
from tests.unit.incremental import CONFIG


async def test_series_are_capped_and_the_count_is_whole(
    make_netns: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = make_netns("reach")
    monkeypatch.setattr(reachability, "SERIES_LIMIT", 3)
    services = [service("default", f"s{i}", f"172.30.0.{i + 1}") for i in range(3)]
    slices = [
        eps_slice("default", f"s{i}", [endpoint(f"10.1.{i}.1"), endpoint(f"10.1.{i}.2")])
        for i in range(3)
    ]
    ports = plan(snapshot(services, slices, node=node()), CONFIG).ports
    registry = CollectorRegistry()
    monitor = ReachabilityMonitor(registry, netns=ns)
    monitor.plan_changed(ports, None)
    await monitor._evaluate(full=True)  # one evaluation, without the monitor's event loop
    assert len(monitor.unreachable) == 6
    assert registry.get_sample_value("nlproxy_unreachable_endpoints") == 6
    series = [
        s
        for metric in registry.collect()
        if metric.name == "nlproxy_endpoint_unreachable"
        for s in metric.samples
    ]
    assert len(series) == 3
    # The first services in key order are the ones shown.
    assert {s.labels["service"] for s in series} == {"default/s0:p80/TCP", "default/s1:p80/TCP"}


async def until(pred: Callable[[], bool]) -> None:
    while True:
        if pred():
            return
        await trio.sleep(0.02)


async def test_a_failed_pass_is_logged_and_retried_not_fatal(
    make_netns: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = make_netns("reachf")
    monkeypatch.setattr(reachability, "RETRY_AFTER", 0.1)
    monkeypatch.setattr(reachability, "PLAN_SETTLE", 0.01)

    def ports(count: int) -> Any:
        svc = service("default", "s", "172.30.0.1")
        eps = eps_slice("default", "s", [endpoint(f"10.1.0.{i + 1}") for i in range(count)])
        return plan(snapshot([svc], [eps], node=node()), CONFIG).ports

    monitor = ReachabilityMonitor(CollectorRegistry(), netns=ns)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(monitor.run)
            monitor.plan_changed(ports(2), None)
            await until(lambda: len(monitor.unreachable) == 2)
            # The namespace's name goes away: classifying in it fails (the watcher's socket
            # keeps the namespace itself alive, so no event says anything changed).
            await trio.run_process(["ip", "netns", "del", ns])
            monitor.plan_changed(ports(3), None)
            await trio.sleep(0.5)
            assert len(monitor.unreachable) == 2  # failed passes changed nothing...
            await trio.run_process(["ip", "netns", "add", ns])
            await until(lambda: len(monitor.unreachable) == 3)  # ...and the retry catches up
            nursery.cancel_scope.cancel()


async def test_a_run_after_another_classifies_every_endpoint_at_once(
    make_netns: Callable[[str], str],
) -> None:
    """The daemon restarts a failed inspector: a route made while no run watched is seen at
    the next run's start, not at the next route or plan change."""
    ns = make_netns("reachagain")
    svc = service("default", "s", "172.30.0.1")
    eps = eps_slice("default", "s", [endpoint("10.1.0.1"), endpoint("10.1.0.2")])
    monitor = ReachabilityMonitor(CollectorRegistry(), netns=ns)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(monitor.run)
            monitor.plan_changed(plan(snapshot([svc], [eps], node=node()), CONFIG).ports, None)
            await until(lambda: len(monitor.unreachable) == 2)
            nursery.cancel_scope.cancel()
        await trio.run_process(["ip", "-n", ns, "link", "set", "lo", "up"])
        await trio.run_process(
            ["ip", "-n", ns, "route", "add", "local", "10.1.0.0/24", "dev", "lo"]
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(monitor.run)
            await until(lambda: not monitor.unreachable)
            assert monitor.verdicts[ip_address("10.1.0.1")].reachable
            nursery.cancel_scope.cancel()


async def test_an_excluded_endpoint_stays_out_until_it_is_reachable(
    make_netns: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--exclude-unreachable-endpoints`` as the daemon wires it: each sync plans the
    snapshot without the unreachable endpoints and tells the inspector what it left out. The
    excluded endpoint stays out (it used to leave the index with the plan, then come back at
    the next sync and be excluded again, every second), and comes back once a route reaches it."""
    ns = make_netns("reachx")
    monkeypatch.setattr(reachability, "PLAN_SETTLE", 0.05)
    await trio.run_process(["ip", "-n", ns, "link", "set", "lo", "up"])
    await trio.run_process(["ip", "-n", ns, "route", "add", "local", "10.1.0.0/24", "dev", "lo"])
    svc = service("default", "s", "172.30.0.1")
    eps = eps_slice("default", "s", [endpoint("10.1.0.1"), endpoint("10.9.0.1")])
    whole = snapshot([svc], [eps], node=node())
    planned: list[set[str]] = []
    changes: list[frozenset[Any]] = []

    def sync() -> None:  # the daemon's filter and its hook after the sync
        bad = monitor.unreachable
        filtered = without_unreachable(whole, bad)
        monitor.hold(left_out(whole, filtered, bad))
        ports = plan(filtered, CONFIG).ports
        planned.append({str(ip) for p in ports.values() for ip in addresses(p.cluster_endpoints)})
        monitor.plan_changed(ports, None)

    def changed(bad: frozenset[Any]) -> None:
        changes.append(bad)
        sync()

    monitor = ReachabilityMonitor(CollectorRegistry(), netns=ns, on_change=changed)
    x = ip_address("10.9.0.1")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(monitor.run)
            sync()
            await until(lambda: monitor.unreachable == {x} and planned[-1] == {"10.1.0.1"})
            await trio.sleep(20 * reachability.PLAN_SETTLE)  # passes after the exclusion
            assert changes == [frozenset({x})]
            assert monitor.unreachable == {x}
            assert planned[-1] == {"10.1.0.1"}
            # A route to it: the next pass finds it reachable, the next sync plans it again.
            await trio.run_process(
                ["ip", "-n", ns, "route", "add", "local", "10.9.0.0/24", "dev", "lo"]
            )
            await until(lambda: planned[-1] == {"10.1.0.1", "10.9.0.1"})
            assert monitor.verdicts[x].reachable
            assert changes == [frozenset({x}), frozenset()]
            nursery.cancel_scope.cancel()


async def test_the_first_pass_logs_the_unreachable_and_counts_the_rest(
    make_netns: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At start every endpoint is new: the lines name only unreachable ones (address order,
    at most ``LOG_LIMIT``), the summary counts every endpoint by kind, and equal verdicts are
    one object (a node's 100k endpoints share a handful)."""
    ns = make_netns("reachfirst")
    monkeypatch.setattr(reachability, "LOG_LIMIT", 2)
    local = [f"10.1.0.{i}" for i in range(1, 5)]
    # One local route covers them all (as one route to another node covers its pods).
    await trio.run_process(["ip", "-n", ns, "link", "set", "lo", "up"])
    await trio.run_process(["ip", "-n", ns, "route", "add", "local", "10.1.0.0/24", "dev", "lo"])
    svc = service("default", "s", "172.30.0.1")
    unreachable = ["10.9.0.3", "10.9.0.1", "10.9.0.2"]
    eps = eps_slice("default", "s", [endpoint(ip) for ip in [*local, *unreachable]])
    monitor = ReachabilityMonitor(CollectorRegistry(), netns=ns)
    monitor.plan_changed(plan(snapshot([svc], [eps], node=node()), CONFIG).ports, None)
    with structlog.testing.capture_logs() as logs:
        await monitor._evaluate(full=True)
    lines = [e for e in logs if e["event"] == "endpoint.reachability"]
    assert [e["endpoint"] for e in lines] == ["10.9.0.1", "10.9.0.2"]
    assert all(e["now"] == "unreachable" and e["was"] is None for e in lines)
    (summary,) = [e for e in logs if e["event"] == "endpoint.reachability_summary"]
    assert summary["transitions"] == 7
    assert summary["logged"] == 2
    assert summary["now"] == {"local": 4, "unreachable": 3}
    verdicts = monitor.verdicts
    assert len({id(verdicts[ip_address(ip)]) for ip in local}) == 1
    # A later pass compares with what is known: nothing changed, nothing is logged.
    with structlog.testing.capture_logs() as logs:
        await monitor._evaluate(full=True)
    assert not [e for e in logs if e["event"].startswith("endpoint.reachability")]
