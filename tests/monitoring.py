"""The shipped monitoring and DaemonSet manifests, as the monitoring tests read them."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.configs import ROOT

MONITORING = ROOT / "deploy/monitoring"
ALERTS = MONITORING / "nlproxy-alerts.yaml"


def one(path: Path, kind: str) -> dict[str, Any]:
    (obj,) = [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == kind]
    return dict(obj)


def daemonset_pod() -> dict[str, Any]:
    ds = one(ROOT / "deploy/kubernetes/daemonset.yaml", "DaemonSet")
    return dict(ds["spec"]["template"])


def metrics_port() -> dict[str, Any]:
    (proxy,) = daemonset_pod()["spec"]["containers"]
    (port,) = [p for p in proxy["ports"] if p["name"] == "metrics"]
    return dict(port)


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: install Debian's prometheus (scripts/install-debs.sh)")
    return found


def run_promtool(*args: str) -> str:
    """``promtool ARGS``'s output, after asserting it succeeded."""
    out = subprocess.run([promtool(), *args], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def alert_rules(rules: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rule of a PrometheusRule, group after group."""
    return [dict(r) for g in rules["spec"]["groups"] for r in g["rules"]]


def alert_job() -> str:
    rules = one(ALERTS, "PrometheusRule")
    expr = str(down_rule(rules)["expr"])
    assert expr.startswith('up{job="'), expr
    assert expr.endswith('"} == 0'), expr
    return expr.split('"')[1]


def down_rule(rules: dict[str, Any], *, absent: bool = False) -> dict[str, Any]:
    """The NlproxyDown rule of the PrometheusRule for a target that stops answering (``up ==
    0``), or with ``absent`` the one for no target at all (``absent(up)``)."""
    [down] = [
        r
        for r in alert_rules(rules)
        if r.get("alert") == "NlproxyDown" and str(r["expr"]).startswith("absent(") == absent
    ]
    return down


def render(template: str, labels: dict[str, str], value: float) -> str:
    """An annotation as Prometheus renders it, for the templates the shipped rules use:
    ``{{ $labels.NAME }}`` and ``{{ $value }}`` (anything else fails the test that asks)."""
    out = re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: labels[m.group(1)], template)
    out = re.sub(r"\{\{\s*\$value\s*\}\}", f"{value:g}", out)
    assert "{{" not in out, f"a template this renderer does not know: {template!r}"
    return out


def firing(rule: dict[str, Any], labels: dict[str, str], value: float) -> dict[str, Any]:
    """``rule``'s alert as Prometheus fires it for a series with ``labels`` whose value is
    ``value``: the rule's own labels added, its annotations rendered (promtool's
    ``exp_alerts`` entry)."""
    full = {**labels, **rule["labels"]}
    return {
        "exp_labels": full,
        "exp_annotations": {k: render(v, full, value) for k, v in rule["annotations"].items()},
    }


def rule_groups_file(directory: Path) -> Path:
    """The shipped PrometheusRule's groups as a rules file in ``directory`` (``rules.yaml``),
    for promtool."""
    rules = one(ALERTS, "PrometheusRule")
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rules["spec"]["groups"]}))
    return path


def alert_test(
    series: list[dict[str, str]], checks: list[tuple[int, str, list[dict[str, Any]]]]
) -> dict[str, Any]:
    """One promtool rule test: ``series`` (``input_series``) sampled every minute, and at each
    ``(minute, alert, alerts expected firing)`` of ``checks`` that alert checked (``[]``: not
    firing, whether pending or quiet)."""
    return {
        "interval": "1m",
        "input_series": series,
        "alert_rule_test": [
            {"eval_time": f"{minute}m", "alertname": name, "exp_alerts": expected}
            for minute, name, expected in checks
        ],
    }


def promtool_test_rules(tmp_path: Path, tests: list[dict[str, Any]]) -> str:
    """``promtool test rules`` of ``tests`` against the shipped PrometheusRule's groups; its
    output, after asserting it passed."""
    rules = rule_groups_file(tmp_path)
    doc = {"rule_files": [rules.name], "evaluation_interval": "1m", "tests": tests}
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump(doc))
    return run_promtool("test", "rules", str(path))
