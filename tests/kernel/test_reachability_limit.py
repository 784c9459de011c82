"""The daemon's inspector, on the real kernel: its per-endpoint gauge is bounded (a node that
has lost its routes sees every endpoint of the cluster unreachable, and one series each would
cost ~85 MB at 100k), and a failed pass is retried, never fatal.

Real classification in namespaces with no routes at all (every endpoint: no route).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio
from prometheus_client import CollectorRegistry

from nlproxy.inspect import reachability
from nlproxy.inspect.reachability import ReachabilityMonitor
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
