"""The values of ``nlproxy run``'s configuration that the ``--config`` file and the flags share:
:class:`DaemonConfig` and the readers of one address, URL or duration, each naming the flag or
field it came from in a :class:`ConfigError`."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from ipaddress import IPv4Network, IPv6Network, ip_address, ip_network
from typing import Any
from urllib.parse import urlsplit

from nlproxy.conntrack.sysctl import ConntrackConfig
from nlproxy.errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class DaemonConfig:
    """Settings of ``nlproxy run`` beyond the planner's (see ``proxy/config.py``).

    Defaults: ``min_sync_period`` 100 ms (kube-proxy: 1 s) — a sync of an endpoint change costs
    nlproxy a few element operations, so it can afford to sync 10 times a second and still bound
    the work under churn; ``sync_period`` 60 s for the full read-back verify (drift is also caught
    at once by netlink notifications, so the timer is only a backstop).
    """

    node_name: str = ""
    kubeconfig: str | None = None
    api_server: str | None = None
    """The API server's own URL (``https://host:port``), overriding the one of the kubeconfig or
    of the in-cluster configuration (kube-proxy's ``--master``); the credentials stay theirs.
    From ``--master``, else ``$NLPROXY_API_SERVER`` (docs/api-server.md)."""
    cluster_cidr: str = ""
    nodeport_addresses: str = "primary"
    masquerade_bit: int = 14
    min_sync_period: float = 0.1
    sync_period: float = 60.0
    healthz_bind_address: str | None = "0.0.0.0:10256"
    """``host:port``; None turns the server off (an empty ``--healthz-bind-address``, as in
    kube-proxy; an empty field in a KubeProxyConfiguration means the default)."""
    metrics_bind_address: str | None = "127.0.0.1:10249"
    node_ip: str = ""
    """From ``bindAddress`` when it names one address (kube-proxy takes it as the node's IP)."""
    conntrack: ConntrackConfig = field(default_factory=ConntrackConfig)
    """kube-proxy's ``conntrack`` section (``conntrack/sysctl.py``)."""
    external_ip_cidrs: tuple[str, ...] = ()
    """The ranges ``spec.externalIPs`` may take (``--external-ip-cidrs``; empty: any), checked
    CIDRs."""
    node_port_range: tuple[int, int] = (30000, 32767)
    """The API server's ``--service-node-port-range`` (``--service-node-port-range`` here):
    a ``healthCheckNodePort`` outside it is not listened on."""
    kubeconfig_from_file: bool = False
    """``kubeconfig`` came from ``clientConnection.kubeconfig``: a missing file falls back to the
    in-cluster configuration (the DaemonSet may not mount kubeadm's path)."""
    load_balancing: str = "random"
    """The endpoint choice of Services without ``nlproxy.io/load-balancing`` (``LoadBalancing``);
    a file's ``ipvs.scheduler`` sets it where the meaning carries over (:data:`IPVS_SCHEDULERS`)."""
    masquerade_all: bool = False
    """Masquerade every packet to a ClusterIP (``masqueradeAll``, ``--masquerade-all``)."""
    detect_local_mode: str = "ClusterCIDR"
    """How pods are told apart (``detectLocalMode``; ``proxy/config.py``'s ``DetectLocal``)."""
    pod_bridge_interface: str = ""
    """``detectLocal.bridgeInterface`` (``--pod-bridge-interface``)."""
    pod_interface_name_prefix: str = ""
    """``detectLocal.interfaceNamePrefix`` (``--pod-interface-name-prefix``)."""
    kube_api_qps: float = 5.0
    """Requests per second the API client may make (``clientConnection.qps``, ``--kube-api-qps``;
    kube-proxy's default; a negative value: no limit, as in client-go)."""
    kube_api_burst: int = 10
    """Requests the client may make at once above ``kube_api_qps`` (``clientConnection.burst``)."""
    oom_score_adj: int | None = None
    """The process's ``/proc/self/oom_score_adj`` (``oomScoreAdj``, ``--oom-score-adj``); None
    leaves it alone."""
    warnings: tuple[str, ...] = field(default=())


def external_networks(cfg: DaemonConfig) -> tuple[IPv4Network | IPv6Network, ...]:
    """``cfg.external_ip_cidrs`` as networks (checked when the flag was read)."""
    return tuple(ip_network(c) for c in cfg.external_ip_cidrs)


HEALTHZ_PORT, METRICS_PORT = 10256, 10249
"""kube-proxy's default ports, added to a bind address given as a host only."""


def bind_address(value: object, default_port: int, name: str) -> str | None:
    """A bind address as kube-proxy reads it: ``host:port``, a host alone (the default port is
    added), or empty (the server is off → None).

    Raises:
        ConfigError: not an address, or a port outside 0..65535 (names ``name``).
    """
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(name, f"{value!r} is not an address")
    try:
        host = ip_address(value.strip("[]"))
    except ValueError:
        host = None
    if host is not None:  # a host alone
        return f"[{host}]:{default_port}" if host.version == 6 else f"{host}:{default_port}"
    head, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(name, f"{value!r} is not host:port")
    if not 0 <= int(port) <= 65535:  # 0: any free port
        raise ConfigError(name, f"port {port} is not in 0..65535")
    if head:
        try:
            ip_address(head.strip("[]"))
        except ValueError as exc:
            raise ConfigError(name, f"{head!r} is not an IP address") from exc
    return value


API_SERVER_ENV = "NLPROXY_API_SERVER"
"""The environment variable naming the API server (the DaemonSet sets it from its ConfigMap)."""


def api_server_url(value: str, name: str) -> str:
    """``https://host:port`` from a URL or a bare ``host[:port]`` (port 443 when absent), as
    kube-proxy's ``--master`` takes it; plain ``http://`` is kept (a test or local server).

    Raises:
        ConfigError: not a URL with a host, or a port outside 1..65535 (names ``name``).
    """
    text = value.strip()
    try:  # an unclosed "[" of an IPv6 address is refused already by urlsplit
        url = urlsplit(text if "://" in text else f"https://{text}")
        port = url.port
    except ValueError as exc:
        raise ConfigError(name, f"{value!r}: {exc}") from exc
    if url.scheme not in ("https", "http") or not url.hostname or url.path not in ("", "/"):
        raise ConfigError(name, f"{value!r} is not https://HOST[:PORT]")
    if port == 0:
        raise ConfigError(name, f"{value!r}: port 0 is not in 1..65535")
    host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
    return f"{url.scheme}://{host}:{port or (443 if url.scheme == 'https' else 80)}"


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_duration(text: object, name: str) -> float:
    """A Go duration (``1m30s``, ``100ms``, or ``0`` alone, as Go reads it) in seconds."""
    if text == "0":
        return 0.0
    if not isinstance(text, str) or not text:
        raise ConfigError("KubeProxyConfiguration", f"{text!r} is not a duration", field=name)
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT[m.group(2)]
        pos = m.end()
    if pos != len(text) or not math.isfinite(total):
        raise ConfigError("KubeProxyConfiguration", f"{text!r} is not a duration", field=name)
    return total


MAX_MIN_SYNC_PERIOD = 60.0
"""The longest ``minSyncPeriod``: every change waits up to it (kube-proxy's default is 1 s)."""
MAX_SYNC_PERIOD = 86400.0
"""The longest ``syncPeriod`` (the full read-back's interval): a day."""


def bounded_period(seconds: float, attr: str, name: str) -> float:
    """A sync period within its bounds (``name``: the flag or field it came from).

    Raises:
        ConfigError: ``minSyncPeriod`` over a minute (every change would wait for it), or
            ``syncPeriod`` over a day.
    """
    if attr == "min_sync_period" and seconds > MAX_MIN_SYNC_PERIOD:
        raise ConfigError(name, f"{seconds:g}s is more than 1m; every change would wait for it")
    if seconds > MAX_SYNC_PERIOD:
        raise ConfigError(name, f"{seconds:g}s is more than 24h")
    return seconds


def with_field(cfg: DaemonConfig, attr: str, value: object) -> DaemonConfig:
    """``cfg`` with one field replaced by name (values were checked by the caller)."""
    changes: dict[str, Any] = {attr: value}
    return replace(cfg, **changes)
