"""kube-proxy's metrics as nlproxy records them: no-local-endpoints counts, no ``_created``."""

from __future__ import annotations

import os
import platform
import threading
import time
from collections.abc import Mapping
from ipaddress import ip_network

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from nlproxy import __version__
from nlproxy.cluster.model import ServiceKey
from nlproxy.nft.counters import Counts
from nlproxy.nft.ir import DataType, Family
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.planner import plan
from nlproxy.serve.metrics import (
    REST_CLIENT_BUCKETS,
    Metrics,
    NoLocalEndpoints,
    ServiceCounters,
    build_info,
)
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


HOST = "10.96.0.1:443"


def _family(m: Metrics, name: str) -> Metric:
    for family in text_string_to_metric_families(m.exposition().decode()):
        if family.name == name:
            return family
    raise AssertionError(f"no family {name}")


def test_kube_client_families_as_client_go_exports_them() -> None:
    m = Metrics(CollectorRegistry())
    m.kube_request("GET", HOST, 200, 0.03)
    m.kube_request("GET", HOST, 410, 0.2)
    m.kube_request("GET", HOST, None, 1.5)  # no answer
    requests = _family(m, "rest_client_requests")
    assert requests.type == "counter"
    counted = {
        (s.labels["code"], s.labels["method"], s.labels["host"]): s.value
        for s in requests.samples
        if s.name == "rest_client_requests_total"
    }
    assert counted == {
        ("200", "GET", HOST): 1,
        ("410", "GET", HOST): 1,
        ("<error>", "GET", HOST): 1,
    }
    duration = _family(m, "rest_client_request_duration_seconds")
    assert duration.type == "histogram"
    assert {k for s in duration.samples for k in s.labels if k != "le"} == {"verb", "host"}
    buckets = {
        float(s.labels["le"]): s.value for s in duration.samples if s.name.endswith("_bucket")
    }
    assert sorted(buckets) == [*REST_CLIENT_BUCKETS, float("inf")]
    assert (buckets[0.025], buckets[0.1], buckets[0.25], buckets[2.0]) == (0, 1, 2, 3)


def test_build_info_names_this_nlproxy() -> None:
    m = Metrics(CollectorRegistry())
    (sample,) = _family(m, "kubernetes_build_info").samples
    assert sample.value == 1
    labels = sample.labels
    assert set(labels) == {
        "major",
        "minor",
        "git_version",
        "git_commit",
        "git_tree_state",
        "build_date",
        "go_version",
        "compiler",
        "platform",
    }
    major, minor, _ = __version__.split(".", 2)
    assert (labels["major"], labels["minor"]) == (major, minor)
    assert labels["git_version"] == f"v{__version__}"
    assert labels["go_version"] == f"python{platform.python_version()}"
    assert labels["compiler"] == "cpython"
    arch = {"x86_64": "amd64", "aarch64": "arm64"}[os.uname().machine]
    assert labels["platform"] == f"linux/{arch}"
    assert build_info("1.36.3")["minor"] == "36"


def test_service_counters_read_the_kernel_once_at_a_time() -> None:
    """Concurrent scrapes hold one netlink socket between them: one reading at a time, and a
    scrape that waited for another's reading reports it rather than reading again."""
    in_flight, most, calls = 0, 0, 0
    guard = threading.Lock()

    def read(
        family: Family,
        table: str,
        sets: Mapping[str, tuple[DataType, ...]],
        *,
        netns: str | None = None,
    ) -> dict[str, Counts]:
        nonlocal in_flight, most, calls
        with guard:
            in_flight += 1
            calls += 1
            most = max(most, in_flight)
        time.sleep(0.02)  # a dump takes a while: the other scrapes arrive meanwhile
        with guard:
            in_flight -= 1
        return {}

    counters = ServiceCounters(CollectorRegistry(), read=read)
    start = threading.Barrier(8)

    def scrape() -> None:
        start.wait()
        counters.refresh([])

    threads = [threading.Thread(target=scrape) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most == 1
    assert calls == 2 * counters.readings  # each reading: both families
    assert 1 <= counters.readings <= 8
