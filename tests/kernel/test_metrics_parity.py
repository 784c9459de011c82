"""A running daemon exports kube-proxy 1.36's metric families (nftables mode) with kube-proxy's
types, label names and buckets, the process collector's ``process_*`` series, and no
``_created`` series (``tests/data/kube-proxy-1.36-metrics.json`` lists the families)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prometheus_client.metrics_core import Metric

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import daemon, objects, publish, running_daemon_families

testbed = topo.testbed

DATA = Path(__file__).parent.parent / "data" / "kube-proxy-1.36-metrics.json"


def upstream_families() -> list[dict[str, Any]]:
    families: list[dict[str, Any]] = json.loads(DATA.read_text())["families"]
    return families


def label_names(family: Metric) -> set[str]:
    return {k for s in family.samples for k in s.labels if k != "le"}


def test_every_kube_proxy_family_is_exported_alike(testbed: Testbed, tmp_path: Path) -> None:
    got, text = running_daemon_families(testbed, tmp_path)
    problems = []
    for want in upstream_families():
        family = got.get(want["name"])
        if family is None:
            problems.append(f"{want['name']}: missing")
            continue
        if family.type != want["type"]:
            problems.append(f"{want['name']}: {family.type}, upstream {want['type']}")
        if not family.samples:
            problems.append(f"{want['name']}: no series")
        if label_names(family) != set(want["labels"]):
            problems.append(f"{want['name']}: labels {sorted(label_names(family))}")
    assert not problems, "\n".join(problems)
    assert "_created" not in text
    families = {
        s.labels["ip_family"] for s in got["kubeproxy_sync_proxy_rules_duration_seconds"].samples
    }
    assert families == {"IPv4", "IPv6"}
    codes = {s.labels["code"]: s.value for s in got["kubeproxy_proxy_healthz_total"].samples}
    assert codes.get("200", 0) >= 1


def bounds(family: Metric) -> list[float]:
    les = {s.labels["le"] for s in family.samples if s.name.endswith("_bucket")}
    return sorted(float(le) for le in les)


def test_buckets_are_upstreams(testbed: Testbed, tmp_path: Path) -> None:
    got, _ = running_daemon_families(testbed, tmp_path)
    sync = bounds(got["kubeproxy_sync_proxy_rules_duration_seconds"])
    assert sync == [*(0.001 * 2**i for i in range(15)), float("inf")]
    programming = bounds(got["kubeproxy_network_programming_duration_seconds"])
    assert programming[:4] == [0.0, 0.25, 0.5, 1.0]
    assert programming[-3:] == [270.0, 300.0, float("inf")]
    assert len(programming) == 1 + 2 + 59 + 12 + 7 + 1


def test_configz_and_proxy_mode_on_the_metrics_port(testbed: Testbed, tmp_path: Path) -> None:
    d = publish(tmp_path / "m", objects(testbed, ["pod-a"]))
    with daemon(testbed, d) as proc:
        assert proc.get(proc.metrics, "/proxyMode") == (200, "nftables")
        status, body = proc.get(proc.metrics, "/configz")
    assert status == 200
    doc = json.loads(body)["kubeproxy.config.k8s.io"]
    assert doc["hostnameOverride"] == testbed.node.name
    assert doc["minSyncPeriod"] == "50ms"  # the flag's value, not the default
    assert doc["metricsBindAddress"] == f"127.0.0.1:{proc.metrics}"
