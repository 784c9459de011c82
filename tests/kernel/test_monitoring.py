"""``deploy/monitoring/``: the Grafana dashboard and the PrometheusRule load, have the right
shape, and every metric their PromQL uses is one a running daemon exports; ``promtool check
rules`` accepts the rule groups."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics_core import Metric

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import running_daemon_families
from tests.monitoring import alert_job, down_rule, one, promtool

testbed = topo.testbed

MONITORING = Path(__file__).parent.parent.parent / "deploy" / "monitoring"
DASHBOARD = MONITORING / "nlproxy-dashboard.json"
ALERTS = MONITORING / "nlproxy-alerts.yaml"
SYNTHETIC = {"up"}
"""Series Prometheus makes itself for every target."""
_NOT_METRICS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
                "unless", "bool", "offset", "inf", "nan"}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, label names, label
    values, grouping labels, ranges and ``$variables`` left out)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    names = set()
    for m in re.finditer(r"(?<![\w$.])[A-Za-z_:][\w:]*", e):
        if e[m.end() :].lstrip().startswith("(") or m.group().lower() in _NOT_METRICS:
            continue
        names.add(m.group())
    return names


def test_metric_names_of_an_expression() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (instance, le) (rate(a_bucket{job="x",le!="1e3"}'
        "[$__rate_interval]))) > 1e3 and on (instance) time() - b_seconds offset 5m > 2 * 60"
    )
    assert metric_names(expr) == {"a_bucket", "b_seconds"}


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in doc["panels"]:
        yield p
        yield from p.get("panels", [])


def dashboard_exprs(doc: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in panels(doc) for t in p.get("targets", [])]
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\(\s*([\w:]+)\s*,\s*\w+\s*\)", var["query"]["query"])
            assert m, var["query"]
            exprs.append(m.group(1))
    return exprs


def rules() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(ALERTS.read_text())
    return doc


def test_dashboard_shape() -> None:
    doc = dashboard()
    assert doc["uid"]
    assert doc["title"]
    assert isinstance(doc["schemaVersion"], int)
    ids = [p["id"] for p in panels(doc)]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    graphs = [p for p in panels(doc) if p["type"] != "row"]
    assert graphs
    for p in graphs:
        assert p["title"]
        assert set(p["gridPos"]) == {"h", "w", "x", "y"}
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["expr"], p["title"]
            assert t["refId"], p["title"]
    titles = " ".join(p["title"].lower() for p in graphs)
    for topic in ("sync duration", "programming", "failures", "rejected", "drift", "unreachable",
                  "conntrack", "memory", "cpu"):  # fmt: skip
        assert topic in titles, topic


ALERTS_WANTED = {
    "NlproxyDown",
    "NlproxyNoRecentSync",
    "NlproxySyncFailuresRising",
    "NlproxyProgrammingLatencyHigh",
    "NlproxyRejectedServices",
}


def test_rules_shape() -> None:
    doc = rules()
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert doc["kind"] == "PrometheusRule"
    assert doc["metadata"]["name"]
    alerts = [r for g in doc["spec"]["groups"] for r in g["rules"]]
    assert {r["alert"] for r in alerts} >= ALERTS_WANTED
    for r in alerts:
        assert r["expr"], r["alert"]
        assert r["labels"]["severity"], r["alert"]
        assert r["annotations"]["summary"], r["alert"]


def test_promtool_accepts_the_rule_groups(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: install Debian's prometheus (scripts/install-debs.sh)")
    groups = tmp_path / "rules.yaml"
    groups.write_text(yaml.safe_dump({"groups": rules()["spec"]["groups"]}))
    out = subprocess.run([promtool, "check", "rules", str(groups)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def exported(families: dict[str, Metric]) -> set[str]:
    names = set(SYNTHETIC)
    for name, family in families.items():
        names.add(name)
        if family.type == "histogram":
            names |= {f"{family.name}_bucket", f"{family.name}_sum", f"{family.name}_count"}
    return names


def test_every_metric_used_is_exported(testbed: Testbed, tmp_path: Path) -> None:
    families, _ = running_daemon_families(testbed, tmp_path)
    have = exported(families)
    used = {
        "dashboard": {n for e in dashboard_exprs(dashboard()) for n in metric_names(e)},
        "alerts": {
            n
            for g in rules()["spec"]["groups"]
            for r in g["rules"]
            for n in metric_names(r["expr"])
        },
    }
    for where, names in used.items():
        assert names, where
        assert not names - have, f"{where} uses metrics no daemon exports: {names - have}"


def test_promtool_accepts_the_plain_scrape_job(tmp_path: Path) -> None:
    doc = yaml.safe_load((MONITORING / "prometheus-scrape.yaml").read_text())
    (job,) = doc["scrape_configs"]
    # Debian's promtool is built without Kubernetes discovery: the rest of the job (relabeling,
    # paths, intervals) is checked with a static target in its place.
    checked = {**job, "static_configs": [{"targets": ["192.0.2.1:10249"]}]}
    del checked["kubernetes_sd_configs"]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump({"scrape_configs": [checked]}))
    out = subprocess.run(
        [promtool(), "check", "config", str(path)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_nlproxy_down_fires_when_a_target_stops_answering(tmp_path: Path) -> None:
    rules = one(MONITORING / "nlproxy-alerts.yaml", "PrometheusRule")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rules["spec"]["groups"]}))
    job = alert_job()
    up = f'up{{job="{job}",instance="192.0.2.1:10249",node="node-a"}}'
    other = f'up{{job="{job}",instance="192.0.2.2:10249",node="node-b"}}'
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": up, "values": "1 1 0x10"},  # stops answering at 2m
                    {"series": other, "values": "1x12"},
                ],
                "alert_rule_test": [
                    {"eval_time": "4m", "alertname": "NlproxyDown", "exp_alerts": []},  # pending
                    {
                        "eval_time": "8m",
                        "alertname": "NlproxyDown",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "critical",
                                    "job": job,
                                    "instance": "192.0.2.1:10249",
                                    "node": "node-a",
                                },
                                "exp_annotations": {
                                    k: v.replace("{{ $labels.instance }}", "192.0.2.1:10249")
                                    for k, v in down_rule(rules)["annotations"].items()
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump(tests))
    out = subprocess.run(
        [promtool(), "test", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
