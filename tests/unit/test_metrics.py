"""kube-proxy's metrics as nlproxy records them: no-local-endpoints counts, no ``_created``."""

from __future__ import annotations

from ipaddress import ip_network

from prometheus_client import CollectorRegistry

from nlproxy.cluster.model import ServiceKey
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.planner import plan
from nlproxy.serve.metrics import Metrics, NoLocalEndpoints
from tests.unit.builders import NODE, endpoint, eps_slice, node, port, service, snapshot

CONFIG = ProxyConfig(node_name=NODE, cluster_cidrs=(ip_network("10.0.0.0/8"),))


def _value(m: Metrics, family: str, policy: str) -> float | None:
    return m.registry.get_sample_value(
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
        {"ip_family": family, "traffic_policy": policy},
    )


def test_no_local_endpoints_counts_as_upstream() -> None:
    remote = [endpoint("10.1.0.5")]  # on another node
    svcs = [
        # internal Local, endpoints elsewhere only: internal traffic dropped → counted.
        service("ns", "itp", "172.30.0.1", internal_policy_local=True),
        # external Local on a NodePort, endpoints elsewhere only → counted as external.
        service(
            "ns",
            "etp",
            "172.30.0.2",
            [port("ns", "etp", node_port=30080)],
            external_policy_local=True,
        ),
        # external Local but nothing external (no node port, no external IP): not counted.
        service("ns", "etp-internal-only", "172.30.0.3", external_policy_local=True),
        # internal Local with a local endpoint: fine.
        service("ns", "itp-local", "172.30.0.4", internal_policy_local=True),
        # internal Local without any endpoint: rejected, not counted.
        service("ns", "itp-none", "172.30.0.5", internal_policy_local=True),
        # IPv6, internal Local, endpoints elsewhere → counted under IPv6.
        service("ns", "itp6", "fd00:30::6", internal_policy_local=True),
    ]
    slices = [
        eps_slice("ns", "itp", remote),
        eps_slice("ns", "etp", remote, [("p80", 80, "TCP")]),
        eps_slice("ns", "etp-internal-only", remote),
        eps_slice("ns", "itp-local", [endpoint("10.1.0.7", NODE)]),
        eps_slice("ns", "itp6", [endpoint("fd00:1::5")]),
    ]
    p = plan(snapshot(svcs, slices, node=node()), CONFIG)
    m = Metrics(CollectorRegistry())
    tracker = NoLocalEndpoints(m.no_local_endpoints)
    tracker.update(p, None)
    assert _value(m, "IPv4", "internal") == 1
    assert _value(m, "IPv4", "external") == 1
    assert _value(m, "IPv6", "internal") == 1
    assert _value(m, "IPv6", "external") == 0

    # A later sync that changed one service recounts that service only.
    fixed = [s for s in svcs if s.key.name != "itp"]
    fixed_slices = [s for s in slices if s.service.name != "itp"]
    p2 = plan(snapshot(fixed, fixed_slices, node=node()), CONFIG)
    tracker.update(p2, {ServiceKey(namespace="ns", name="itp")})
    assert _value(m, "IPv4", "internal") == 0
    assert _value(m, "IPv4", "external") == 1


def test_no_created_series_and_process_collector() -> None:
    m = Metrics(CollectorRegistry())
    m.service_changes_total.inc()
    text = m.exposition().decode()
    assert "_created" not in text
    assert "process_resident_memory_bytes" in text
