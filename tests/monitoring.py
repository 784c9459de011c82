"""The shipped monitoring and DaemonSet manifests, as the monitoring tests read them."""

from __future__ import annotations

import shutil
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


def down_rule(rules: dict[str, Any]) -> dict[str, Any]:
    """The NlproxyDown rule of the PrometheusRule."""
    groups = rules["spec"]["groups"]
    [down] = [r for g in groups for r in g["rules"] if r.get("alert") == "NlproxyDown"]
    return dict(down)
