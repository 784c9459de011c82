"""``run --write-config-to``: the settings a command line and ``--config`` make, written as a
``KubeProxyConfiguration`` (kube-proxy's flag of the same name), so a DaemonSet's flags can be
turned into a ConfigMap. Reading the file back with ``--config`` gives the same settings for every
field it holds: ``tests/unit/test_write_config.py`` checks that."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from nlproxy.config import Settings
from nlproxy.config.kubeproxy import API_VERSIONS
from nlproxy.errors import ConfigError


def _duration(seconds: float) -> str:
    """Seconds as a Go duration (``1m30s``, ``250ms``)."""
    ms = round(seconds * 1000)
    if ms % 1000:
        return f"{ms}ms"
    s = ms // 1000
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    text = (f"{h}h" if h else "") + (f"{m}m" if m or h else "") + f"{sec}s"
    return text


def _maybe(seconds: int | None) -> str | None:
    return None if seconds is None else _duration(seconds)


def kube_proxy_config(s: Settings) -> dict[str, Any]:
    """The effective settings as a ``KubeProxyConfiguration`` document (``mode: nftables``).

    A server turned off (an empty ``--healthz-bind-address``) cannot be said in the file: an
    empty field there means the default, in kube-proxy's files as in nlproxy's."""
    d, p = s.daemon, s.proxy
    ct = d.conntrack
    periods = {
        "masqueradeAll": d.masquerade_all,
        "masqueradeBit": d.masquerade_bit,
        "minSyncPeriod": _duration(d.min_sync_period),
        "syncPeriod": _duration(d.sync_period),
    }
    doc: dict[str, Any] = {
        "apiVersion": API_VERSIONS[0],
        "kind": "KubeProxyConfiguration",
        "mode": "nftables",
        "hostnameOverride": d.node_name,
        "bindAddress": d.node_ip or "0.0.0.0",
        "healthzBindAddress": d.healthz_bind_address or "",
        "metricsBindAddress": d.metrics_bind_address or "",
        "clientConnection": {
            "kubeconfig": d.kubeconfig or "",
            "qps": d.kube_api_qps,
            "burst": d.kube_api_burst,
        },
        "clusterCIDR": ",".join(str(c) for c in p.cluster_cidrs),
        "detectLocalMode": d.detect_local_mode,
        "detectLocal": {
            "bridgeInterface": d.pod_bridge_interface,
            "interfaceNamePrefix": d.pod_interface_name_prefix,
        },
        "nodePortAddresses": list(p.nodeport_addresses),
        "nftables": periods,
        "conntrack": {
            "maxPerCore": ct.max_per_core,
            "min": ct.min,
            "tcpEstablishedTimeout": _maybe(ct.tcp_established_timeout),
            "tcpCloseWaitTimeout": _maybe(ct.tcp_close_wait_timeout),
            "tcpBeLiberal": ct.tcp_be_liberal,
            "udpTimeout": _maybe(ct.udp_timeout),
            "udpStreamTimeout": _maybe(ct.udp_stream_timeout),
        },
        "oomScoreAdj": d.oom_score_adj,
    }
    if d.load_balancing in ("round-robin", "consistent-hash"):
        doc["ipvs"] = {"scheduler": "rr" if d.load_balancing == "round-robin" else "sh"}
    return doc


def write_kube_proxy_config(s: Settings, path: Path) -> None:
    """Write :func:`kube_proxy_config` to ``path`` (replaced whole: written beside it, then
    renamed).

    Raises:
        ConfigError: the file cannot be written (names ``--write-config-to``).
    """
    text = yaml.safe_dump(kube_proxy_config(s), sort_keys=True, default_flow_style=False)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError("--write-config-to", f"{path}: {exc.strerror or exc}") from None
