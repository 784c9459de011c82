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


def alert_job() -> str:
    rules = one(MONITORING / "nlproxy-alerts.yaml", "PrometheusRule")
    expr = str(down_rule(rules)["expr"])
    assert expr.startswith('up{job="'), expr
    assert expr.endswith('"} == 0'), expr
    return expr.split('"')[1]


def down_rule(rules: dict[str, Any], *, absent: bool = False) -> dict[str, Any]:
    """The NlproxyDown rule of the PrometheusRule for a target that stops answering (``up ==
    0``), or with ``absent`` the one for no target at all (``absent(up)``)."""
    groups = rules["spec"]["groups"]
    [down] = [
        r
        for g in groups
        for r in g["rules"]
        if r.get("alert") == "NlproxyDown" and str(r["expr"]).startswith("absent(") == absent
    ]
    return dict(down)


def render(template: str, labels: dict[str, str], value: float) -> str:
    """An annotation as Prometheus renders it, for the templates the shipped rules use:
    ``{{ $labels.NAME }}`` and ``{{ $value }}`` (anything else fails the test that asks)."""
    out = re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: labels[m.group(1)], template)
    out = re.sub(r"\{\{\s*\$value\s*\}\}", f"{value:g}", out)
    assert "{{" not in out, f"a template this renderer does not know: {template!r}"
    return out


def promtool_test_rules(tmp_path: Path, tests: list[dict[str, Any]]) -> str:
    """``promtool test rules`` of ``tests`` against the shipped PrometheusRule's groups; its
    output, after asserting it passed."""
    rules = one(MONITORING / "nlproxy-alerts.yaml", "PrometheusRule")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rules["spec"]["groups"]}))
    doc = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = subprocess.run(
        [promtool(), "test", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout
