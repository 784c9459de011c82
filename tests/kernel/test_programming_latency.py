"""kubeproxy_network_programming_duration_seconds counts each slice change once, when it is
programmed, as upstream: not the initial list's old trigger times, not a Service-only edit, not
a re-sync of unchanged slices."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import VIP_A, answered_by, daemon, publish, wait_until

testbed = topo.testbed
TRIGGER = "endpoints.kubernetes.io/last-change-trigger-time"


def _cluster(tb: Testbed, pods: list[str], trigger: datetime, port: int = 80) -> list[Any]:
    eps = [topo.endpoint(str(tb.pod(p).ipv4), tb.node.name) for p in pods]
    eps_slice = topo.endpoint_slice("a", eps)
    eps_slice["metadata"]["annotations"] = {TRIGGER: trigger.strftime("%Y-%m-%dT%H:%M:%SZ")}
    svc = topo.service("a", VIP_A, [{"name": "tcp", "port": port, "targetPort": 8080}])
    return [tb.node_manifest(), svc, eps_slice]


def _count(proc: Any) -> float:
    for line in proc.get(proc.metrics, "/metrics")[1].splitlines():
        if line.startswith("kubeproxy_network_programming_duration_seconds_count"):
            return float(line.split()[1])
    raise AssertionError("the programming latency histogram is missing")


def test_each_slice_change_is_observed_once(testbed: Testbed, tmp_path: Path) -> None:
    old = datetime.now(UTC) - timedelta(hours=2)
    d = publish(tmp_path / "m", _cluster(testbed, ["pod-a"], old))
    with daemon(testbed, d) as proc:
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        assert _count(proc) == 0, "the initial list's trigger time predates this process"
        changed = datetime.now(UTC).replace(microsecond=0)
        publish(d, _cluster(testbed, ["pod-b"], changed))
        wait_until(lambda: _count(proc) == 1, 5.0, "the endpoint change observed")
        # A Service-only edit re-plans the service; its slice (and trigger time) did not change.
        publish(d, _cluster(testbed, ["pod-b"], changed, port=81))
        wait_until(lambda: proc.events("sync.applied")[-1].get("ops", 0) > 0, 5.0, "port edit")
        publish(d, _cluster(testbed, ["pod-b"], changed, port=80))
        wait_until(lambda: answered_by(testbed, VIP_A, 3) == {"pod-b"}, 5.0, "port back")
        assert _count(proc) == 1
