"""``/configz``: the effective settings as kube-proxy serves them, a KubeProxyConfiguration under
its API group. Built once from the settings (the same document ``run --write-config-to`` writes,
so the two never disagree) and handed to the HTTP side as bytes: ``serve/`` knows no settings.

kube-proxy's v1alpha1 carries the sync periods both in the mode's section and at the top level
(where v1alpha2 moved them); both are given, so a reader of either finds them.
"""

from __future__ import annotations

import json

from nlproxy.config import Settings
from nlproxy.config.export import kube_proxy_config


def go_duration(seconds: float | None) -> str | None:
    """``seconds`` as Go's ``time.Duration.String()`` writes it (``1m0s``, ``100ms``), the form
    kube-proxy's configuration uses; None stays None (unset)."""
    if seconds is None:
        return None
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    if ns < 1_000_000_000:  # below a second Go picks one unit
        for unit, size in (("ms", 1_000_000), ("\u00b5s", 1_000), ("ns", 1)):
            if ns >= size:
                return f"{sign}{ns / size:g}{unit}"
    h, rest = divmod(ns, 3_600_000_000_000)
    m, rest = divmod(rest, 60_000_000_000)
    s = f"{rest / 1e9:.9f}".rstrip("0").rstrip(".")
    if h:
        return f"{sign}{h}h{m}m{s}s"
    if m:
        return f"{sign}{m}m{s}s"
    return f"{sign}{s}s"


def configz(settings: Settings) -> bytes:
    """The ``/configz`` body for ``settings``: ``{"kubeproxy.config.k8s.io": {...}}``."""
    d, p = settings.daemon, settings.proxy
    doc = kube_proxy_config(settings)
    periods = {
        "syncPeriod": go_duration(d.sync_period),
        "minSyncPeriod": go_duration(d.min_sync_period),
    }
    doc.update(periods)
    doc["nftables"] = {**doc["nftables"], **periods}
    doc["detectLocal"] = {**doc["detectLocal"], "clusterCIDRs": [str(c) for c in p.cluster_cidrs]}
    ct = d.conntrack
    doc["conntrack"] = {
        **doc["conntrack"],
        "tcpEstablishedTimeout": go_duration(ct.tcp_established_timeout),
        "tcpCloseWaitTimeout": go_duration(ct.tcp_close_wait_timeout),
        "udpTimeout": go_duration(ct.udp_timeout),
        "udpStreamTimeout": go_duration(ct.udp_stream_timeout),
    }
    return json.dumps({"kubeproxy.config.k8s.io": doc}, indent=2).encode()
