"""``deploy/monitoring/``: the Grafana dashboard and the PrometheusRule load, have the right
shape, and every metric their PromQL uses is one a running daemon exports; ``promtool check
rules`` accepts the rule groups."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics_core import Metric

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import running_daemon_families
from tests.monitoring import (
    ALERTS,
    MONITORING,
    alert_job,
    alert_rules,
    alert_test,
    down_rule,
    firing,
    one,
    promtool_test_rules,
    rule_groups_file,
    run_promtool,
)

testbed = topo.testbed

DASHBOARD = MONITORING / "nlproxy-dashboard.json"
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
                  "conntrack", "memory", "cpu", "foreign proxy", "task restarts"):  # fmt: skip
        assert topic in titles, topic


ALERTS_WANTED = {
    "NlproxyDown",
    "NlproxyNoRecentSync",
    "NlproxySyncFailuresRising",
    "NlproxyProgrammingLatencyHigh",
    "NlproxyRejectedServices",
}
NEW_ALERTS_WANTED = {
    "NlproxyForeignProxyTables",
    "NlproxyUnreachableEndpoints",
    "NlproxyNodePortAddressesMissing",
    "NlproxyAPIKindUnavailable",
    "NlproxyForeignProxyReturning",
    "NlproxyTaskRestarting",
}


def test_rules_shape() -> None:
    doc = rules()
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert doc["kind"] == "PrometheusRule"
    assert doc["metadata"]["name"]
    alerts = alert_rules(doc)
    assert {r["alert"] for r in alerts} >= ALERTS_WANTED | NEW_ALERTS_WANTED
    assert [r["expr"] for r in alerts if r["alert"] == "NlproxyDown"][1:] == [
        f'absent(up{{job="{alert_job()}"}})'
    ]
    for r in alerts:
        assert r["expr"], r["alert"]
        assert r["labels"]["severity"], r["alert"]
        assert r["annotations"]["summary"], r["alert"]


def test_promtool_accepts_the_rule_groups(tmp_path: Path) -> None:
    run_promtool("check", "rules", str(rule_groups_file(tmp_path)))


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
        "alerts": {n for r in alert_rules(rules()) for n in metric_names(r["expr"])},
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
    run_promtool("check", "config", str(path))


def test_nlproxy_down_fires_when_a_target_stops_answering(tmp_path: Path) -> None:
    rules = one(ALERTS, "PrometheusRule")
    job = alert_job()
    up = f'up{{job="{job}",instance="192.0.2.1:10249",node="node-a"}}'
    other = f'up{{job="{job}",instance="192.0.2.2:10249",node="node-b"}}'
    expected = {
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
    series = [
        {"series": up, "values": "1 1 0x10"},  # stops answering at 2m
        {"series": other, "values": "1x12"},
    ]
    checks = [(4, "NlproxyDown", []), (8, "NlproxyDown", [expected])]  # pending at 4m
    promtool_test_rules(tmp_path, [alert_test(series, checks)])


def test_the_rules_carry_kube_prometheus_stacks_release_label() -> None:
    """kube-prometheus-stack's Prometheus selects PodMonitors and PrometheusRules by the
    ``release`` label (its Helm release's name); without it neither is picked up."""
    for path, kind in (
        (MONITORING / "nlproxy-podmonitor.yaml", "PodMonitor"),
        (ALERTS, "PrometheusRule"),
    ):
        labels = one(path, kind)["metadata"]["labels"]
        assert labels["release"] == "kube-prometheus-stack", path.name
        assert labels["k8s-app"] == "nlproxy", path.name


def test_the_release_label_is_documented() -> None:
    doc = (MONITORING.parent.parent / "docs/monitoring.md").read_text()
    assert "release: kube-prometheus-stack" in doc
    assert "kubectl -n kube-system label --overwrite podmonitor/nlproxy" in doc


INSTANCE, OTHER = "192.0.2.1:10249", "192.0.2.2:10249"


def _alert(name: str, labels: dict[str, str], value: float) -> dict[str, Any]:
    """The alert ``name`` as Prometheus would fire it for a series with ``labels`` whose
    value is ``value``: the rule's own labels added, its annotations rendered."""
    [rule] = [
        r
        for r in alert_rules(one(ALERTS, "PrometheusRule"))
        if r.get("alert") == name and not str(r["expr"]).startswith("absent(")
    ]
    return firing(rule, labels, value)


def _series(metric: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in {"job": alert_job(), **labels}.items())
    return {"series": f"{metric}{{{inner}}}", "values": values}


# Each new alert from synthetic series: pending before its ``for:``, firing after it, for the
# one instance whose series crossed the line (the other, healthy, stays quiet).
# (alert, metric, the firing series' extra labels, its values, the healthy one's, eval
# times (pending, firing), the value at firing)
NEW_ALERTS = [
    ("NlproxyForeignProxyTables", "nlproxy_foreign_proxy_tables",
     {"family": "ip", "table": "kube-proxy", "mode": "nftables"}, "_ _ 1x20", None, (5, 12), 1),
    ("NlproxyUnreachableEndpoints", "nlproxy_unreachable_endpoints", {}, "0 0 3x30", "0x32",
     (10, 25), 3),
    ("NlproxyNodePortAddressesMissing", "nlproxy_nodeport_addresses_missing",
     {"ip_family": "IPv6"}, "0 0 1x20", "0x22", (8, 15), 1),
    ("NlproxyAPIKindUnavailable", "nlproxy_source_unavailable_kinds",
     {"kind": "ServiceCIDR", "verb": "list", "reason": "forbidden"}, "_ _ 1x20", None, (8, 15), 1),
    # A removal at 10m: quiet before it, firing (no for:) once the counter has moved.
    ("NlproxyForeignProxyReturning", "nlproxy_foreign_proxy_removals_total",
     {"table": "ip kube-proxy", "mode": "nftables"}, "0x9 1x20", "0x30", (5, 12), 1),
    # The inspector failing from 10m on, restarted every minute: three restarts in 15 minutes
    # (at 12m) are not yet "repeatedly", the fourth is. The other node's one restart is quiet.
    ("NlproxyTaskRestarting", "nlproxy_task_restarts_total", {"task": "inspector"},
     "0x9 1+1x20", "0x5 1x30", (12, 16), 7),
]  # fmt: skip


@pytest.mark.parametrize("case", NEW_ALERTS, ids=[c[0] for c in NEW_ALERTS])
def test_each_new_alert_fires_from_its_series(tmp_path: Path, case: tuple[Any, ...]) -> None:
    name, metric, extra, values, healthy, (pending, fires), value = case
    series = [_series(metric, {"instance": INSTANCE, **extra}, values)]
    if healthy is not None:
        series.append(_series(metric, {"instance": OTHER, **extra}, healthy))
    expected = _alert(name, {"instance": INSTANCE, **extra}, value)
    checks = [(pending, name, []), (fires, name, [expected])]
    promtool_test_rules(tmp_path, [alert_test(series, checks)])


def test_nlproxy_down_fires_when_no_target_is_scraped_at_all(tmp_path: Path) -> None:
    """The ``absent()`` form: no nlproxy target at all (another job's targets are there)."""
    job = alert_job()
    rule = down_rule(one(ALERTS, "PrometheusRule"), absent=True)
    expected = firing(rule, {"job": job}, 1)
    series = [
        {"series": 'up{job="node-exporter",instance="192.0.2.9:9100"}', "values": "1x20"},
        # nlproxy scraped at first, then its DaemonSet goes.
        {"series": f'up{{job="{job}",instance="{INSTANCE}"}}', "values": "1 1"},
    ]
    checks = [(8, "NlproxyDown", []), (20, "NlproxyDown", [expected])]
    promtool_test_rules(tmp_path, [alert_test(series, checks)])


def test_every_new_alert_has_a_promtool_test() -> None:
    assert {c[0] for c in NEW_ALERTS} == NEW_ALERTS_WANTED


def test_the_dashboard_shows_foreign_proxy_tables() -> None:
    [panel] = [p for p in panels(dashboard()) if "foreign proxy tables" in p["title"].lower()]
    assert any("nlproxy_foreign_proxy_tables" in t["expr"] for t in panel["targets"])


def _builds(instance: str, cluster: str, builds: str) -> list[dict[str, str]]:
    """One pod's ``kubernetes_build_info`` over time: ``builds`` is ``VERSION@COMMIT:MINUTES``
    steps separated by spaces (the pod replaced by a rollout at each step), the series of one
    build stale (absent) while another is exported."""
    out = []
    start = 0
    steps = [b.split(":") for b in builds.split()]
    for i, (build, minutes) in enumerate(steps):
        version, commit = build.split("@")
        length = int(minutes)
        end = start + length
        values = " ".join(["_"] * start + ["1"] * length) if start else f"1x{length - 1}"
        if i + 1 < len(steps):  # replaced: the old pod's series goes stale
            values += " stale"
        labels = {"instance": instance, "cluster": cluster, "git_version": version,
                  "git_commit": commit}  # fmt: skip
        out.append(_series("kubernetes_build_info", labels, values))
        start = end
    return out


MIXED = "NlproxyMixedVersions"


def _mixed_alert(cluster: str, value: int) -> dict[str, Any]:
    [rule] = [r for r in alert_rules(rules()) if r.get("alert") == "NlproxyMixedVersions"]
    return firing(rule, {"cluster": cluster}, value)


def test_mixed_versions_fires_for_a_rollout_that_stops(tmp_path: Path) -> None:
    """Three nodes on v0.1.0; a rollout to v0.2.0 at 10m moves two of them and stops there (the
    third's new pod never gets ready): quiet within the hour, firing after it, counting two
    builds. A second cluster, whose rollout finishes in 25 minutes, stays quiet throughout."""
    old, new = "v0.1.0@aaaa", "v0.2.0@bbbb"
    series = [
        *_builds("192.0.2.1:10249", "c1", f"{old}:10 {new}:120"),
        *_builds("192.0.2.2:10249", "c1", f"{old}:12 {new}:118"),
        *_builds("192.0.2.3:10249", "c1", f"{old}:130"),
        *_builds("198.51.100.1:10249", "c2", f"{old}:10 {new}:120"),
        *_builds("198.51.100.2:10249", "c2", f"{old}:35 {new}:95"),
    ]
    checks = [(5, MIXED, []), (60, MIXED, []), (80, MIXED, [_mixed_alert("c1", 2)])]
    promtool_test_rules(tmp_path, [alert_test(series, checks)])


def test_mixed_versions_stays_quiet_for_one_build_per_cluster(tmp_path: Path) -> None:
    """Each cluster on one build (different from the other's), pods restarted on the same
    build (a new instance series): nothing is mixed, nothing fires."""
    series = [
        *_builds("192.0.2.1:10249", "c1", "v0.1.0@aaaa:130"),
        *_builds("192.0.2.2:10249", "c1", "v0.1.0@aaaa:130"),
        *_builds("198.51.100.1:10249", "c2", "v0.2.0@bbbb:130"),
        *_builds("198.51.100.2:10249", "c2", "v0.2.0@bbbb:40 v0.2.0@bbbb:90"),
    ]
    checks: list[tuple[int, str, list[dict[str, Any]]]] = [(t, MIXED, []) for t in (30, 75, 120)]
    promtool_test_rules(tmp_path, [alert_test(series, checks)])
