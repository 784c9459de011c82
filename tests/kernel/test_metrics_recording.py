"""What the kube-proxy metrics record on a running daemon: a change is a partial sync, the
conntrack cleanup of a removed UDP endpoint counts under its family, and a service with a Local
internal traffic policy but no endpoint on this node is counted (kube-proxy's rules)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from nlproxy.demo.echo import Result, udp_request
from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import Daemon, answered_by, daemon, nft, publish, wait_until

testbed = topo.testbed

VIP_U = "10.96.0.30"
VIP_L = "10.96.0.31"
UDP = ({"name": "udp", "port": 53, "targetPort": 8080, "protocol": "UDP"},)
UDP_SLICE = ({"name": "udp", "port": 8080, "protocol": "UDP"},)


def _objects(tb: Testbed, pods: list[str]) -> list[dict[str, Any]]:
    ep = lambda name, node=tb.node.name: topo.endpoint(str(tb.pod(name).ipv4), node)  # noqa: E731
    return [
        tb.node_manifest(),
        topo.service("u", VIP_U, UDP),
        topo.endpoint_slice("u", [ep(p) for p in pods], UDP_SLICE),
        # Its only endpoint is on another node: internal traffic has nowhere to go here.
        topo.service("l", VIP_L, internalTrafficPolicy="Local"),
        topo.endpoint_slice("l", [ep("pod-c", "elsewhere")]),
    ]


def sample(proc: Daemon, name: str, **labels: str) -> float:
    body = proc.get(proc.metrics, "/metrics")[1]
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise AssertionError(f"no sample {name} {labels}")


def test_partial_syncs_conntrack_and_no_local_endpoints(testbed: Testbed, tmp_path: Path) -> None:
    d = publish(tmp_path / "m", _objects(testbed, ["pod-a", "pod-b"]))
    with daemon(testbed, d) as proc:
        v4 = {"ip_family": "IPv4"}
        assert sample(proc, "kubeproxy_sync_full_proxy_rules_duration_seconds_count", **v4) >= 1
        no_local = "kubeproxy_sync_proxy_rules_no_local_endpoints_total"
        assert sample(proc, no_local, ip_family="IPv4", traffic_policy="internal") == 1
        assert sample(proc, no_local, ip_family="IPv6", traffic_policy="internal") == 0
        assert sample(proc, no_local, ip_family="IPv4", traffic_policy="external") == 0

        out = udp_request(testbed.pod("pod-c").netns, VIP_U, 53)
        assert out.result is Result.ANSWERED, out
        partial = sample(proc, "kubeproxy_sync_partial_proxy_rules_duration_seconds_count", **v4)
        rest = [p for p in ("pod-a", "pod-b") if p != out.pod]
        publish(d, _objects(testbed, rest))  # the flow's endpoint goes: its flow is deleted

        deleted = "kubeproxy_conntrack_reconciler_deleted_entries_total"
        wait_until(lambda: sample(proc, deleted, **v4) >= 1, 5.0, "the stale flow deleted")
        assert sample(proc, deleted, ip_family="IPv6") == 0
        took = "kubeproxy_conntrack_reconciler_sync_duration_seconds_count"
        assert sample(proc, took, **v4) >= 1
        assert sample(proc, took, ip_family="IPv6") == 0
        after = sample(proc, "kubeproxy_sync_partial_proxy_rules_duration_seconds_count", **v4)
        assert after > partial


def _lb(tb: Testbed, lb: str, ports: int) -> list[dict[str, Any]]:
    """``v`` with ``ports`` TCP ports on pod-a and pod-b, ``nlproxy.io/load-balancing: lb``."""
    svc = topo.service(
        "v",
        VIP_U,
        [
            {"name": f"p{i}", "port": 80 + i, "targetPort": 8080, "protocol": "TCP"}
            for i in range(ports)
        ],
    )
    svc["metadata"]["annotations"] = {"nlproxy.io/load-balancing": lb}
    eps = [topo.endpoint(str(tb.pod(p).ipv4), tb.node.name) for p in ("pod-a", "pod-b")]
    slice_ports = [{"name": f"p{i}", "port": 8080, "protocol": "TCP"} for i in range(ports)]
    return [tb.node_manifest(), svc, topo.endpoint_slice("v", eps, slice_ports)]


def test_load_balancing_defaults_are_counted_by_reason(testbed: Testbed, tmp_path: Path) -> None:
    """A misspelt annotation, then a Service past the element budget (five consistent-hash
    ports), then one within it: the gauge follows, and the Service answers throughout."""
    name = "nlproxy_load_balancing_defaulted_services"
    d = publish(tmp_path / "m", _lb(testbed, "roundrobin", 1))
    with daemon(testbed, d) as proc:
        assert sample(proc, name, reason="unknown annotation") == 1
        assert sample(proc, name, reason="service budget") == 0
        publish(d, _lb(testbed, "consistent-hash", 5))
        wait_until(
            lambda: sample(proc, name, reason="service budget") == 1, 30, "the budget counted"
        )
        assert sample(proc, name, reason="unknown annotation") == 0
        answered = answered_by(testbed, VIP_U, 4)
        assert answered, "the Service answers past the budget"
        assert answered <= {"pod-a", "pod-b"}
        publish(d, _lb(testbed, "consistent-hash", 4))
        wait_until(lambda: sample(proc, name, reason="service budget") == 0, 30, "within it")
        assert "jhash" in nft(testbed, "list", "ruleset")
