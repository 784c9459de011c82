"""``/configz``: the effective configuration as kube-proxy shapes it, readable back as a
KubeProxyConfiguration that gives the same settings."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import yaml

from nlproxy.config import Flags, build_settings, load_kube_proxy_config
from nlproxy.config.configz import configz, go_duration

CONFIG = """\
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
hostnameOverride: node-7
clusterCIDR: 10.244.0.0/16
metricsBindAddress: 0.0.0.0:10249
clientConnection:
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
nodePortAddresses: ["192.168.0.0/24"]
nftables:
  masqueradeBit: 12
  syncPeriod: 45s
  minSyncPeriod: 250ms
conntrack:
  maxPerCore: 65536
  tcpEstablishedTimeout: 12h
  udpTimeout: 30s
"""


def test_configz_is_the_effective_configuration_under_its_group(tmp_path: Path) -> None:
    src = tmp_path / "kube-proxy.yaml"
    src.write_text(CONFIG)
    settings = build_settings(Flags(config=src, min_sync_period="50ms"))  # a flag overrides
    cfg = settings.daemon
    assert cfg.min_sync_period == 0.05
    body = json.loads(configz(settings))
    assert list(body) == ["kubeproxy.config.k8s.io"]
    doc = body["kubeproxy.config.k8s.io"]
    assert doc["mode"] == "nftables"
    assert doc["hostnameOverride"] == "node-7"
    assert doc["nftables"] == {
        "masqueradeAll": False,
        "masqueradeBit": 12,
        "syncPeriod": "45s",
        "minSyncPeriod": "50ms",
    }
    assert (doc["syncPeriod"], doc["minSyncPeriod"]) == ("45s", "50ms")
    assert doc["conntrack"]["tcpEstablishedTimeout"] == "12h0m0s"
    assert doc["conntrack"]["udpStreamTimeout"] is None
    assert doc["nodePortAddresses"] == ["192.168.0.0/24"]

    # Read back as a KubeProxyConfiguration, it gives the very same settings.
    again = tmp_path / "configz.yaml"
    again.write_text(yaml.safe_dump(doc))
    assert replace(load_kube_proxy_config(again), warnings=()) == replace(cfg, warnings=())


def test_defaults() -> None:
    doc = json.loads(configz(build_settings(Flags())))["kubeproxy.config.k8s.io"]
    assert doc["syncPeriod"] == "1m0s"
    assert doc["minSyncPeriod"] == "100ms"
    assert doc["healthzBindAddress"] == "0.0.0.0:10256"
    assert doc["nodePortAddresses"] == ["primary"]


def test_configz_says_what_detect_local_and_masquerade_all_are(tmp_path: Path) -> None:
    src = tmp_path / "kube-proxy.yaml"
    text = CONFIG.replace("nftables:\n", "nftables:\n  masqueradeAll: true\n")
    src.write_text(text + "detectLocalMode: NodeCIDR\n")
    doc = json.loads(configz(build_settings(Flags(config=src))))["kubeproxy.config.k8s.io"]
    assert doc["detectLocalMode"] == "NodeCIDR"
    assert doc["nftables"]["masqueradeAll"] is True
    assert doc["detectLocal"]["clusterCIDRs"] == ["10.244.0.0/16"]


def test_go_duration_forms() -> None:
    forms = {0: "0s", 0.1: "100ms", 1.5: "1.5s", 90: "1m30s", 86400: "24h0m0s"}
    assert {s: go_duration(s) for s in forms} == forms
