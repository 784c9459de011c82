"""Configuration files the tests load: the shipped ConfigMap, kubeadm's kube-proxy ConfigMap and
kube-proxy's full example (``tests/data/config/``)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "deploy/kubernetes/configmap.yaml"
EXAMPLE = ROOT / "tests/data/config/kube-proxy-example.yaml"
KUBEADM = ROOT / "tests/data/config/kubeadm-kube-proxy.conf"
KUBEADM_CONFIGMAP = KUBEADM.read_text()
"""The ``config.conf`` of the ConfigMap kubeadm writes for kube-proxy."""


def shipped_config(tmp_path: Path) -> Path:
    """The KubeProxyConfiguration inside the shipped ConfigMap, as the DaemonSet mounts it."""
    cm = yaml.safe_load(SHIPPED.read_text())
    path = tmp_path / "config.conf"
    path.write_text(cm["data"]["config.conf"])
    return path
