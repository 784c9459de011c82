"""A key written twice in a ``--config`` file, as kube-proxy treats it: its strict decoding
fails, a ``v1alpha1`` file is then read leniently (the last value wins, and it says so), a
``v1alpha2`` file is refused. nlproxy names the key and both lines either way."""

from __future__ import annotations

from pathlib import Path

import pytest

from nlproxy.cli import main
from nlproxy.config import load_kube_proxy_config
from nlproxy.config.duplicates import Duplicate, duplicate_keys
from tests.configs import KUBEADM_CONFIGMAP

V1ALPHA2 = """apiVersion: kubeproxy.config.k8s.io/v1alpha2
kind: KubeProxyConfiguration
clusterCIDR: 10.1.0.0/16
syncPeriod: 45s
minSyncPeriod: 2s
syncPeriod: 50s
"""


def _write(tmp_path: Path, text: str, name: str = "config.conf") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_v1alpha1_duplicate_is_named_with_its_lines_and_the_last_wins(tmp_path: Path) -> None:
    text = KUBEADM_CONFIGMAP.replace(
        "clusterCIDR: 10.244.0.0/16\n", "clusterCIDR: 10.244.0.0/16\nclusterCIDR: 10.9.0.0/16\n"
    )
    line = text.splitlines().index("clusterCIDR: 10.9.0.0/16") + 1
    path = _write(tmp_path, text)
    cfg = load_kube_proxy_config(path)
    assert cfg.cluster_cidr == "10.9.0.0/16"
    assert cfg.warnings == (
        f"config {path}: line {line}: key clusterCIDR is written again (first on line "
        f"{line - 1}); the last value is used",
    )


def test_a_nested_duplicate_is_named_by_its_path(tmp_path: Path) -> None:
    text = KUBEADM_CONFIGMAP.replace(
        "  syncPeriod: 0s\nipvs:", "  syncPeriod: 0s\n  syncPeriod: 40s\nipvs:"
    )
    assert text != KUBEADM_CONFIGMAP
    cfg = load_kube_proxy_config(
        _write(tmp_path, text.replace('mode: "nftables"', "mode: iptables"))
    )
    assert cfg.sync_period == 40.0
    assert any("key iptables.syncPeriod is written again" in w for w in cfg.warnings)


def test_a_v1alpha2_duplicate_exits_2_naming_the_key_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, V1ALPHA2)
    code = main(["run", "--config", str(path), "--manifests", str(tmp_path), "--once"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert (
        f"config {path}: line 6: key syncPeriod is written again (first on line 4); "
        "kubeproxy.config.k8s.io/v1alpha2 allows each key once"
    ) in err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param("a: 1\nb: 2\n", [], id="none"),
        pytest.param("a: {x: 1, x: 2}\n", [Duplicate("a.x", 1, 1)], id="flow-mapping"),
        pytest.param("l:\n- k: 1\n  k: 2\n", [Duplicate("l[0].k", 3, 2)], id="inside-a-list"),
        pytest.param(
            "base: &b {x: 1}\nm:\n  <<: *b\n  x: 2\n", [], id="a-merge-is-overridden-not-repeated"
        ),
        pytest.param(
            "a: &a {x: 1, x: 2}\nb: *a\nc: *a\n",
            [Duplicate("a.x", 1, 1)],
            id="an-aliased-mapping-once",
        ),
        pytest.param(
            '{"a": "\\ud83d\\ude00", "a": 1}',  # a surrogate pair: JSON reads it, YAML not
            [Duplicate("a", 0, 0)],
            id="json-yaml-cannot-read",
        ),
    ],
)
def test_duplicate_keys(text: str, want: list[Duplicate]) -> None:
    assert duplicate_keys(text) == want


def test_kube_proxys_own_files_have_no_duplicates() -> None:
    assert duplicate_keys(KUBEADM_CONFIGMAP) == []
