"""The daemon's inspector bounds its per-endpoint gauge: a node that has lost its routes sees
every endpoint of the cluster unreachable, and one series each would cost ~85 MB at 100k.

Real classification in a namespace with no routes at all (every endpoint: no route).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from nlproxy import reachability
from nlproxy.proxy.planner import plan
from nlproxy.reachability import ReachabilityMonitor
from tests.unit.builders import endpoint, eps_slice, node, service, snapshot
from tests.unit.test_sync_incremental import CONFIG


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
