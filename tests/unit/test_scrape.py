"""Monitoring as shipped: the DaemonSet exposes its metrics on the node's addresses on a named
port, and the scrape configurations (PodMonitor, plain Prometheus job, pod annotations) find
that port and name the job as the alerts select it. promtool's checks of the same files are in
``tests/kernel/test_monitoring.py`` (promtool is not on the unit tests' PATH)."""

from __future__ import annotations

from pathlib import Path

import yaml

from nlproxy.config import load_kube_proxy_config
from tests.configs import ROOT, shipped_config
from tests.monitoring import MONITORING, alert_job, daemonset_pod, metrics_port, one


def test_metrics_are_served_on_the_nodes_addresses_at_the_named_port(tmp_path: Path) -> None:
    cfg = load_kube_proxy_config(shipped_config(tmp_path))
    assert cfg.metrics_bind_address is not None
    host, _, port = cfg.metrics_bind_address.rpartition(":")
    assert host in ("0.0.0.0", "[::]")  # hostNetwork: not loopback, or nothing can scrape it
    assert metrics_port() == {"name": "metrics", "containerPort": int(port), "hostPort": int(port)}
    annotations = daemonset_pod()["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == port


def test_the_podmonitor_scrapes_the_pods_and_names_the_job_as_the_alerts_do() -> None:
    pm = one(MONITORING / "nlproxy-podmonitor.yaml", "PodMonitor")
    pod = daemonset_pod()
    labels = pod["metadata"]["labels"]
    ds = one(ROOT / "deploy/kubernetes/daemonset.yaml", "DaemonSet")
    assert pm["metadata"]["namespace"] == ds["metadata"]["namespace"]  # its own namespace
    assert pm["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert labels[pm["spec"]["jobLabel"]] == alert_job()  # the job label's value
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == metrics_port()["name"]


def test_the_plain_scrape_job_is_valid_and_named_as_the_alerts_select(tmp_path: Path) -> None:
    doc = yaml.safe_load((MONITORING / "prometheus-scrape.yaml").read_text())
    (job,) = doc["scrape_configs"]
    assert job["job_name"] == alert_job()
    (sd,) = job["kubernetes_sd_configs"]
    ds = one(ROOT / "deploy/kubernetes/daemonset.yaml", "DaemonSet")
    assert sd["namespaces"]["names"] == [ds["metadata"]["namespace"]]
    (selector,) = sd["selectors"]
    key, _, value = selector["label"].partition("=")
    assert daemonset_pod()["metadata"]["labels"][key] == value
    [keep] = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    assert keep["source_labels"] == ["__meta_kubernetes_pod_container_port_name"]
    assert keep["regex"] == metrics_port()["name"]
