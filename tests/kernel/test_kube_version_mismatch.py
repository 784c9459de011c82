"""``deploy/monitoring/kube-version-mismatch.yaml``: kubernetes-mixin's ``KubeVersionMismatch``
with nlproxy's ``kubernetes_build_info`` left out. ``promtool test rules`` runs the shipped rule
on a cluster of v1.36 components plus nlproxy (quiet), and of components of two minor versions
(fires, nlproxy still not counted); the stock expression, the same but for nlproxy's job in the
exclusion, fires on the first cluster, which is why the file ships."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from nlproxy.serve.metrics import build_info
from tests.monitoring import MONITORING, alert_job, one, promtool

SHIPPED = MONITORING / "kube-version-mismatch.yaml"


def _rule() -> dict[str, Any]:
    groups = one(SHIPPED, "PrometheusRule")["spec"]["groups"]
    [rule] = [r for g in groups for r in g["rules"] if r.get("alert") == "KubeVersionMismatch"]
    return dict(rule)


def _series(job: str, instance: str, git_version: str) -> dict[str, str]:
    return {
        "series": f'kubernetes_build_info{{job="{job}",instance="{instance}",'
        f'git_version="{git_version}",cluster="c1"}}',
        "values": "1x40",
    }


def _cluster(kubelet_version: str) -> list[dict[str, str]]:
    """An API server and two kubelets at v1.36.3 (one kubelet at ``kubelet_version``), and two
    nlproxy pods exporting this nlproxy's ``kubernetes_build_info``."""
    nlproxy = build_info()["git_version"]
    return [
        _series("apiserver", "192.0.2.1:6443", "v1.36.3"),
        _series("kubelet", "192.0.2.1:10250", "v1.36.3"),
        _series("kubelet", "192.0.2.2:10250", kubelet_version),
        _series("coredns", "10.244.0.5:9153", "v1.12.1"),
        _series(alert_job(), "192.0.2.1:10249", nlproxy),
        _series(alert_job(), "192.0.2.2:10249", nlproxy),
    ]


def _promtool_test(tmp_path: Path, rule: dict[str, Any], tests: list[dict[str, Any]]) -> None:
    (tmp_path / "rules.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "kubernetes-system", "rules": [rule]}]})
    )
    path = tmp_path / "tests.yaml"
    path.write_text(
        yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests})
    )
    out = subprocess.run(
        [promtool(), "test", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


def _fired(value: int, rule: dict[str, Any]) -> dict[str, Any]:
    return {
        "exp_labels": {"severity": "warning", "cluster": "c1"},
        "exp_annotations": {
            k: v.replace("{{ $value }}", str(value)) for k, v in rule["annotations"].items()
        },
    }


def test_nlproxys_version_is_not_counted(tmp_path: Path) -> None:
    rule = _rule()
    assert rule["for"] == "15m"
    assert f"|{alert_job()}" in rule["expr"]
    _promtool_test(
        tmp_path,
        rule,
        [
            {
                "interval": "1m",
                "input_series": _cluster("v1.36.3"),
                "alert_rule_test": [
                    {"eval_time": "30m", "alertname": "KubeVersionMismatch", "exp_alerts": []}
                ],
            },
            {
                "interval": "1m",
                "input_series": _cluster("v1.35.9"),
                "alert_rule_test": [
                    {"eval_time": "10m", "alertname": "KubeVersionMismatch", "exp_alerts": []},
                    {
                        "eval_time": "30m",
                        "alertname": "KubeVersionMismatch",
                        "exp_alerts": [_fired(2, rule)],
                    },
                ],
            },
        ],
    )


def test_the_stock_rule_counts_nlproxy_as_a_version(tmp_path: Path) -> None:
    """The mixin's rule (its selector: every job but kube-dns and coredns) on the same
    single-version cluster: nlproxy's v0.x is a second "version"."""
    shipped = _rule()
    stock = {**shipped, "expr": shipped["expr"].replace(f"|{alert_job()}", "")}
    assert 'job!~"kube-dns|coredns"' in stock["expr"]
    _promtool_test(
        tmp_path,
        stock,
        [
            {
                "interval": "1m",
                "input_series": _cluster("v1.36.3"),
                "alert_rule_test": [
                    {
                        "eval_time": "30m",
                        "alertname": "KubeVersionMismatch",
                        "exp_alerts": [_fired(2, stock)],
                    }
                ],
            }
        ],
    )


def test_promtool_accepts_the_file(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": one(SHIPPED, "PrometheusRule")["spec"]["groups"]}))
    out = subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
