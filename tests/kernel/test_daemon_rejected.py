"""The daemon with a service refused a frontend another claims: named once, counted, the rest
kept in sync.

A LoadBalancer service whose source range falls inside another's on the same address and port
would make overlapping interval elements the kernel refuses; the older claimant keeps the
address and the other is refused it before anything reaches the kernel. Meanwhile other
services' changes keep flowing, and fixing the service brings it in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import VIP_A, answered_by, daemon, objects, publish, wait_until
from tests.kernel.topo import LB_IP, lb

testbed = topo.testbed


def cluster(tb: Testbed, a_pods: list[str], clash_port: int) -> list[dict[str, Any]]:
    client = str(tb.client.ipv4[0])
    return [
        *objects(tb, a_pods),
        *lb(tb, "edge-a", "10.96.0.20", "pod-b", 80, [f"{client}/24"]),
        *lb(tb, "edge-b", "10.96.0.21", "pod-c", clash_port, [f"{client}/32"]),
    ]


def refused(body: str) -> float:
    for line in body.splitlines():
        if line.startswith("nlproxy_refused_service_frontends "):
            return float(line.split()[1])
    raise AssertionError("nlproxy_refused_service_frontends missing from /metrics")


def answered_by_lb(ns: str) -> set[str]:
    """Which pods answered LB_IP:8080 from ``ns`` (a failed request answers nobody)."""
    return {o.pod for o in topo.ask("tcp", ns, LB_IP, 8080, n=2) if o.pod}


def test_a_refused_frontend_is_named_counted_and_given_when_fixed(
    testbed: Testbed, tmp_path: Path
) -> None:
    d = publish(tmp_path / "m", cluster(testbed, ["pod-a"], 80))
    with daemon(testbed, d) as proc:
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        assert refused(proc.get(proc.metrics, "/metrics")[1]) == 1
        (event,) = proc.events("service.refused")
        assert event["error"].startswith("Service default/edge-b: status.loadBalancer.ingress:")
        assert not proc.events("service.rejected")  # nothing reached the kernel to refuse
        # Other services' changes still flow, and the refusal is not logged again.
        publish(d, cluster(testbed, ["pod-b"], 80))
        wait_until(lambda: answered_by(testbed, VIP_A, 6) == {"pod-b"}, 2.0, "endpoint change")
        assert len(proc.events("service.refused")) == 1
        # Fixed (its own port): programmed.
        publish(d, cluster(testbed, ["pod-b"], 8080))
        wait_until(
            lambda: refused(proc.get(proc.metrics, "/metrics")[1]) == 0, 2.0, "edge-b accepted"
        )
        # The gauge follows the cluster state, read just before the sync that programs the fix
        # commits: traffic may need that sync's few milliseconds more.
        ns, gw = testbed.client.netns, str(testbed.node.gateway_v4)
        wait_until(lambda: answered_by_lb(ns) == {"pod-c"}, 6.0, "edge-b programmed")
        assert topo.answers(topo.ask("tcp", ns, LB_IP, 8080, n=4)) == {"pod-c": {gw}}
