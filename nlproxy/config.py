"""The one configuration of ``nlproxy run``: defaults, then kube-proxy's
``KubeProxyConfiguration`` file, then flags, merged here into a typed :class:`Settings`.

An existing kube-proxy ConfigMap works unchanged: fields that apply to nlproxy are honoured,
fields that do not are named once in a warning, and an invalid value is a :class:`ConfigError`
naming the field (exit status 2). Flags given on the command line override the file.

``commands/run.py`` turns its parsed arguments into :class:`Flags` and calls
:func:`build_settings`; the daemon receives the :class:`Settings` and never sees argparse.
"""

from __future__ import annotations

import math
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from ipaddress import IPv4Network, IPv6Network, ip_address, ip_network
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from nlproxy.cluster.decode import FileError, documents
from nlproxy.cluster.model import IPAddress, IPNetwork, LoadBalancing
from nlproxy.conntrack.sysctl import ConntrackConfig
from nlproxy.errors import ConfigError
from nlproxy.proxy.config import PRIMARY, ProxyConfig

API_VERSIONS = ("kubeproxy.config.k8s.io/v1alpha1", "kubeproxy.config.k8s.io/v1alpha2")


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
    kubeconfig_from_file: bool = False
    """``kubeconfig`` came from ``clientConnection.kubeconfig``: a missing file falls back to the
    in-cluster configuration (the DaemonSet may not mount kubeadm's path)."""
    load_balancing: str = "random"
    """The endpoint choice of Services without ``nlproxy.io/load-balancing`` (``LoadBalancing``);
    a file's ``ipvs.scheduler`` sets it where the meaning carries over (:data:`IPVS_SCHEDULERS`)."""
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
    url = urlsplit(text if "://" in text else f"https://{text}")
    try:
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
    """A Go duration (``1m30s``, ``100ms``) in seconds."""
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


def _period(seconds: float, attr: str, name: str) -> float:
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


def _check_periods(cfg: DaemonConfig) -> None:
    """kube-proxy's rule: ``minSyncPeriod`` no longer than ``syncPeriod``."""
    if cfg.min_sync_period > cfg.sync_period:
        raise ConfigError(
            "minSyncPeriod",
            f"{cfg.min_sync_period:g}s is longer than syncPeriod ({cfg.sync_period:g}s)",
        )


def _get(doc: Mapping[str, Any], path: str) -> Any:
    cur: Any = doc
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


# Fields nlproxy honours, by path in the file.
HONOURED = {
    "hostnameOverride",
    "clusterCIDR",
    "clientConnection.kubeconfig",
    "healthzBindAddress",
    "metricsBindAddress",
    "nodePortAddresses",
    "ipvs.scheduler",
    "nftables.masqueradeBit",
    "nftables.syncPeriod",
    "nftables.minSyncPeriod",
    "iptables.masqueradeBit",
    "iptables.syncPeriod",
    "iptables.minSyncPeriod",
    "syncPeriod",
    "minSyncPeriod",
    "mode",
    "detectLocalMode",
    "bindAddress",
    "conntrack",
}
# Values kubeadm writes that mean "kube-proxy's default": not worth a warning.
DEFAULTS = {
    ("bindAddress", "0.0.0.0"),
    ("bindAddress", "::"),
    ("logging.format", "text"),
    ("logging.flushFrequency", "5s"),
    ("logging.options.json.infoBufferSize", "0"),
    ("logging.options.text.infoBufferSize", "0"),
}
# Fields that only describe kube-proxy's process or other modes: accepted silently when empty.
IPVS_SCHEDULERS = {"rr": "round-robin", "sh": "consistent-hash", "mh": "consistent-hash"}
"""kube-proxy's IPVS schedulers nlproxy has an equivalent for: round-robin, and source hashing
(``sh``) or Maglev hashing (``mh``) as consistent hashing of the client. Any other is named in a
warning and random choice is used."""

IGNORED_QUIETLY = {"apiVersion", "kind"}
IPVS_MODE_WARNING = (
    "mode 'ipvs': nlproxy programs nftables in IPVS's place (ipvs.scheduler and ipvs "
    "sync periods carry over); remove IPVS mode's leftovers with 'nlproxy cleanup --kube-proxy'"
)
HINTS = {
    "logging": "nlproxy's --log-level (or -v) and --log-format set its logging",
    "featureGates": "nlproxy has no feature gates",
}
"""Why a set field of these sections does nothing, said in its warning."""


def _empty(v: object) -> bool:
    """A value kubeadm and kube-proxy write for "unset" (lists and maps included)."""
    if isinstance(v, list | dict):
        return not v
    return v in (None, "", 0, False, "0s")


def _leaves(doc: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The paths of every set field; a list or a map of values is one field."""
    out: list[str] = []
    for k, v in doc.items():
        path = f"{prefix}{k}"
        if isinstance(v, Mapping) and v and path not in HONOURED:
            out += _leaves(v, path + ".")
        elif not _empty(v) and not (isinstance(v, str) and (path, v) in DEFAULTS):
            out.append(path)
    return out


def _with(cfg: DaemonConfig, attr: str, value: object) -> DaemonConfig:
    """``cfg`` with one field replaced by name (values were checked by the caller)."""
    changes: dict[str, Any] = {attr: value}
    return replace(cfg, **changes)


def _merge_periods(doc: Mapping[str, Any], cfg: DaemonConfig) -> DaemonConfig:
    mode = _get(doc, "mode") or "nftables"
    # IPVS mode takes its periods from the ipvs section and its mark from the iptables one.
    section = mode if mode in ("iptables", "ipvs") else "nftables"
    for key, attr in (("syncPeriod", "sync_period"), ("minSyncPeriod", "min_sync_period")):
        for path in (f"{section}.{key}", key):
            value = _get(doc, path)
            seconds = parse_duration(value, path) if value else 0.0
            if seconds > 0:  # kubeadm writes 0s for "default"
                cfg = _with(cfg, attr, _period(seconds, attr, path))
                break
    marks = "iptables" if section == "ipvs" else section
    bit = _get(doc, f"{marks}.masqueradeBit")
    if bit is not None:
        if not isinstance(bit, int) or not 0 <= bit <= 31:
            raise ConfigError(
                "KubeProxyConfiguration",
                f"{bit!r} is not in 0..31",
                field=f"{marks}.masqueradeBit",
            )
        cfg = replace(cfg, masquerade_bit=bit)
    return cfg


def _conntrack(section: object) -> ConntrackConfig:
    """kube-proxy's ``conntrack`` section: null takes kube-proxy's default, 0 leaves the
    kernel's value alone."""
    default = ConntrackConfig()
    if section is None:
        return default
    if not isinstance(section, Mapping):
        raise ConfigError("KubeProxyConfiguration", "must be a mapping", field="conntrack")
    values: dict[str, Any] = {}
    for key, attr in (("maxPerCore", "max_per_core"), ("min", "min")):
        value = section.get(key)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(
                    "KubeProxyConfiguration", f"{value!r} is not a count", field=f"conntrack.{key}"
                )
            values[attr] = value
    for key, attr in (
        ("tcpEstablishedTimeout", "tcp_established_timeout"),
        ("tcpCloseWaitTimeout", "tcp_close_wait_timeout"),
        ("udpTimeout", "udp_timeout"),
        ("udpStreamTimeout", "udp_stream_timeout"),
    ):
        value = section.get(key)
        if value is not None:
            values[attr] = int(parse_duration(value, f"conntrack.{key}"))
    liberal = section.get("tcpBeLiberal")
    if liberal is not None:
        if not isinstance(liberal, bool):
            raise ConfigError(
                "KubeProxyConfiguration", f"{liberal!r} is not true or false",
                field="conntrack.tcpBeLiberal",
            )  # fmt: skip
        values["tcp_be_liberal"] = liberal
    return replace(default, **values)


MAX_CONFIG_BYTES = 1 << 20
"""A configuration file larger than this is refused (kube-proxy's is a few kilobytes)."""
MAX_CONFIG_VALUES = 100_000
"""Values a configuration file may hold once its YAML aliases are expanded: nine aliases of
nine make a billion, which walking (for the unused fields) or printing would never finish."""


def _read_config(path: Path) -> Any:
    """The one document of a configuration file, read and decoded as manifests are
    (``cluster/decode.py``): a file too large, not UTF-8, not valid YAML (or JSON), with an
    integer of thousands of digits, nested too deeply, or an alias bomb is a ConfigError.

    Raises:
        ConfigError: any of those, naming the file.
    """
    where = f"config {path}"
    try:
        with path.open("rb") as f:  # the operator's path: links followed, a pipe read
            size = os.fstat(f.fileno()).st_size
            if size > MAX_CONFIG_BYTES:
                raise ConfigError(where, f"{size} bytes; at most {MAX_CONFIG_BYTES}")
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(where, exc.strerror or str(exc)) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(where, f"more than {MAX_CONFIG_BYTES} bytes")
    try:
        docs = documents(path, data)
    except FileError as exc:
        reason = " ".join(str(exc).split())  # one line, whatever the parser's text
        raise ConfigError(where, reason.removeprefix(f"{path.name}: ")) from None
    if len(docs) > 1:
        raise ConfigError(where, f"holds {len(docs)} YAML documents; expected one")
    doc = docs[0] if docs else None
    if _values(doc, MAX_CONFIG_VALUES) > MAX_CONFIG_VALUES:
        raise ConfigError(
            where, f"more than {MAX_CONFIG_VALUES} values once its YAML aliases are expanded"
        )
    return doc


def _values(doc: object, most: int) -> int:
    """How many values ``doc`` holds with aliases expanded, counting shared ones once per use
    but each container walked once (so a bomb is measured without being expanded); stops
    counting past ``most``."""
    sizes: dict[int, int] = {}

    def size(node: object) -> int:
        if not isinstance(node, dict | list):
            return 1
        known = sizes.get(id(node))
        if known is None:
            items = node.values() if isinstance(node, dict) else node
            known = 1
            for item in items:
                known += size(item)
                if known > most:
                    break
            sizes[id(node)] = known
        return known

    try:
        return size(doc)
    except RecursionError:  # a YAML document cannot nest this deep (the parser refuses it)
        return most + 1


def load_kube_proxy_config(path: Path, base: DaemonConfig | None = None) -> DaemonConfig:
    """Read a KubeProxyConfiguration YAML file on top of ``base`` (defaults).

    Raises:
        ConfigError: unreadable file, wrong kind/apiVersion, or an invalid value (names the field).
    """
    cfg = base or DaemonConfig()
    doc = _read_config(path)
    if not isinstance(doc, Mapping):
        raise ConfigError(f"config {path}", "is not a YAML mapping")
    if doc.get("kind") != "KubeProxyConfiguration" or doc.get("apiVersion") not in API_VERSIONS:
        raise ConfigError(
            f"config {path}", f"expected kind KubeProxyConfiguration, apiVersion {API_VERSIONS[0]}"
        )
    mode = _get(doc, "mode")
    if mode not in (None, "", "nftables", "ipvs"):
        raise ConfigError(
            "KubeProxyConfiguration",
            f"{mode!r}: nlproxy programs nftables; set mode: nftables (or leave it empty)",
            field="mode",
        )
    detect = _get(doc, "detectLocalMode")
    if detect not in (None, "", "ClusterCIDR"):
        raise ConfigError(
            "KubeProxyConfiguration",
            f"{detect!r} is not supported (only ClusterCIDR)",
            field="detectLocalMode",
        )
    for path_, attr, port in (
        ("healthzBindAddress", "healthz_bind_address", HEALTHZ_PORT),
        ("metricsBindAddress", "metrics_bind_address", METRICS_PORT),
    ):
        if doc.get(path_):  # empty in a file means kube-proxy's default (kubeadm writes "")
            field_ = f"KubeProxyConfiguration {path_}"
            cfg = _with(cfg, attr, bind_address(doc[path_], port, field_))
    bind = _get(doc, "bindAddress")
    if bind and bind not in ("0.0.0.0", "::"):
        try:
            cfg = replace(cfg, node_ip=str(ip_address(bind)))
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                "KubeProxyConfiguration", f"{bind!r} is not an IP address", field="bindAddress"
            ) from exc
    if _get(doc, "clientConnection.kubeconfig"):
        cfg = replace(cfg, kubeconfig_from_file=True)
    for path_, attr in (
        ("hostnameOverride", "node_name"),
        ("clientConnection.kubeconfig", "kubeconfig"),
        ("clusterCIDR", "cluster_cidr"),
    ):
        value = _get(doc, path_)
        if value:
            if not isinstance(value, str):
                raise ConfigError(
                    "KubeProxyConfiguration", f"{value!r} is not a string", field=path_
                )
            cfg = _with(cfg, attr, value)
    npa = _get(doc, "nodePortAddresses")
    if npa:
        if not isinstance(npa, list) or not all(isinstance(a, str) for a in npa):
            raise ConfigError(
                "KubeProxyConfiguration", "must be a list of strings", field="nodePortAddresses"
            )
        cfg = replace(cfg, nodeport_addresses=",".join(npa))
    cfg = _merge_periods(doc, cfg)
    cfg = replace(cfg, conntrack=_conntrack(doc.get("conntrack")))
    honoured = HONOURED | ({"ipvs.syncPeriod", "ipvs.minSyncPeriod"} if mode == "ipvs" else set())
    unused = sorted(
        p for p in _leaves(doc) if p not in honoured and p.split(".")[0] not in IGNORED_QUIETLY
    )
    warnings = [_unused(p) for p in unused]
    scheduler = _get(doc, "ipvs.scheduler")
    if scheduler:
        if not isinstance(scheduler, str):
            raise ConfigError(
                "KubeProxyConfiguration", f"{scheduler!r} is not a string", field="ipvs.scheduler"
            )
        if scheduler in IPVS_SCHEDULERS:
            cfg = replace(cfg, load_balancing=IPVS_SCHEDULERS[scheduler])
        else:
            warnings.append(
                f"ipvs.scheduler {scheduler!r} has no nlproxy equivalent (rr, sh and mh do): "
                "endpoints are chosen at random"
            )
    if mode == "ipvs":
        warnings.insert(0, IPVS_MODE_WARNING)
    return replace(cfg, warnings=tuple(warnings))


def _unused(path: str) -> str:
    hint = HINTS.get(path.split(".")[0])
    return f"{path} is not used by nlproxy" + (f" ({hint})" if hint else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class Flags:
    """The command line of ``nlproxy run`` as given, before any checking: None (or False for
    a switch) means "not given", so the file's value or the default stands.

    Durations, addresses and CIDRs are the text the user typed; :func:`build_settings` reads
    them and names the flag when one is wrong.
    """

    config: Path | None = None
    manifests: Path | None = None
    kubeconfig: str | None = None
    master: str | None = None
    netns: str | None = None
    node_name: str | None = None
    bind_address: str | None = None
    proxy_mode: str | None = None
    node_ip: str = ""
    cluster_cidr: str | None = None
    service_cidr: str = ""
    nodeport_addresses: str | None = None
    masquerade_bit: int | None = None
    min_sync_period: str | None = None
    sync_period: str | None = None
    healthz_bind_address: str | None = None
    metrics_bind_address: str | None = None
    external_ip_cidrs: str | None = None
    load_balancing: str | None = None
    consistent_hash_seed: int | None = None
    service_counters: bool = False
    conntrack_flush_tcp: bool = False
    owned_table: bool = False
    replace_kube_proxy: bool = False
    exclude_unreachable_endpoints: bool = False
    conntrack_max_per_core: int | None = None
    conntrack_min: int | None = None
    conntrack_tcp_timeout_established: str | None = None
    conntrack_tcp_timeout_close_wait: str | None = None
    conntrack_tcp_be_liberal: bool | None = None
    conntrack_udp_timeout: str | None = None
    conntrack_udp_timeout_stream: str | None = None
    once: bool = False
    force: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Everything ``nlproxy run`` runs with, checked: what the daemon and ``--once`` read.

    Attributes:
        daemon: the daemon's settings (what ``/configz`` shows).
        proxy: the planner's.
        manifests: the manifests directory, or None for the Kubernetes API.
        netns: the named network namespace to work in (None: the current one).
        once: reconcile once and exit.
        force: with ``once``, program the namespace even while another nlproxy does.
        owned_table: create the tables owned and persistent.
        conntrack_flush_tcp: also delete TCP flows of removed endpoints.
        exclude_unreachable_endpoints: leave unroutable endpoints out of load balancing.
        replace_kube_proxy: remove kube-proxy's rules whenever they are found.
    """

    daemon: DaemonConfig
    proxy: ProxyConfig
    manifests: Path | None = None
    netns: str | None = None
    once: bool = False
    force: bool = False
    owned_table: bool = False
    conntrack_flush_tcp: bool = False
    exclude_unreachable_endpoints: bool = False
    replace_kube_proxy: bool = False


def build_settings(flags: Flags) -> Settings:
    """Defaults, then ``flags.config`` (a KubeProxyConfiguration), then the other flags.

    Raises:
        ConfigError: an unreadable file or an invalid value, naming the flag or field.
    """
    cfg = daemon_config(flags)
    return Settings(
        daemon=cfg,
        proxy=proxy_config(flags, cfg),
        manifests=flags.manifests,
        netns=flags.netns,
        once=flags.once,
        force=flags.force,
        owned_table=flags.owned_table,
        conntrack_flush_tcp=flags.conntrack_flush_tcp,
        exclude_unreachable_endpoints=flags.exclude_unreachable_endpoints,
        replace_kube_proxy=flags.replace_kube_proxy,
    )


def daemon_config(flags: Flags) -> DaemonConfig:
    """Defaults, then ``--config``, then flags: the daemon's part of :func:`build_settings`."""
    cfg = load_kube_proxy_config(flags.config) if flags.config else DaemonConfig()
    given: dict[str, Any] = {
        "node_name": flags.node_name,
        "kubeconfig": flags.kubeconfig,
        "cluster_cidr": flags.cluster_cidr,
        "nodeport_addresses": flags.nodeport_addresses,
        "masquerade_bit": flags.masquerade_bit,
        "load_balancing": flags.load_balancing,
    }
    cfg = replace(cfg, **{k: v for k, v in given.items() if v is not None})
    if flags.kubeconfig is not None:
        cfg = replace(cfg, kubeconfig_from_file=False)
    for flag, attr, port, value in (
        ("--healthz-bind-address", "healthz_bind_address", HEALTHZ_PORT,
         flags.healthz_bind_address),
        ("--metrics-bind-address", "metrics_bind_address", METRICS_PORT,
         flags.metrics_bind_address),
    ):  # fmt: skip
        if value is not None:
            cfg = _with(cfg, attr, bind_address(value, port, flag))
    cfg = replace(cfg, conntrack=_conntrack_flags(flags, cfg.conntrack))
    if flags.external_ip_cidrs:
        nets = _networks(flags.external_ip_cidrs, "--external-ip-cidrs")
        cfg = replace(cfg, external_ip_cidrs=tuple(str(n) for n in nets))
    if flags.proxy_mode not in (None, "", "nftables", "ipvs"):
        raise ConfigError(
            "--proxy-mode", f"{flags.proxy_mode!r}: nlproxy programs nftables (use 'nftables')"
        )
    if flags.proxy_mode == "ipvs" and IPVS_MODE_WARNING not in cfg.warnings:
        cfg = replace(
            cfg, warnings=(*cfg.warnings, IPVS_MODE_WARNING.replace("mode", "--proxy-mode", 1))
        )
    if flags.bind_address and flags.bind_address not in ("0.0.0.0", "::"):
        cfg = replace(cfg, node_ip=str(_addresses(flags.bind_address, "--bind-address")[0]))
    for flag, attr, text in (
        ("--min-sync-period", "min_sync_period", flags.min_sync_period),
        ("--sync-period", "sync_period", flags.sync_period),
    ):
        if text:
            cfg = _with(cfg, attr, _period(parse_duration(text, flag), attr, flag))
    _check_periods(cfg)
    if not cfg.node_name:
        cfg = replace(cfg, node_name=os.environ.get("NLPROXY_NODE_NAME") or socket.gethostname())
    if flags.master:
        cfg = replace(cfg, api_server=api_server_url(flags.master, "--master"))
    elif os.environ.get(API_SERVER_ENV):  # empty: unset (an optional ConfigMap key left empty)
        cfg = replace(cfg, api_server=api_server_url(os.environ[API_SERVER_ENV], API_SERVER_ENV))
    if not 0 <= cfg.masquerade_bit <= 31:
        raise ConfigError("--masquerade-bit", f"{cfg.masquerade_bit} is not in 0..31")
    return cfg


def _conntrack_flags(flags: Flags, ct: ConntrackConfig) -> ConntrackConfig:
    changes: dict[str, Any] = {}
    for name, attr, count in (
        ("--conntrack-max-per-core", "max_per_core", flags.conntrack_max_per_core),
        ("--conntrack-min", "min", flags.conntrack_min),
    ):
        if count is not None:
            if count < 0:
                raise ConfigError(name, f"{count} is below 0")
            changes[attr] = count
    for name, attr, text in (
        ("--conntrack-tcp-timeout-established", "tcp_established_timeout",
         flags.conntrack_tcp_timeout_established),
        ("--conntrack-tcp-timeout-close-wait", "tcp_close_wait_timeout",
         flags.conntrack_tcp_timeout_close_wait),
        ("--conntrack-udp-timeout", "udp_timeout", flags.conntrack_udp_timeout),
        ("--conntrack-udp-timeout-stream", "udp_stream_timeout",
         flags.conntrack_udp_timeout_stream),
    ):  # fmt: skip
        if text is not None:
            changes[attr] = int(parse_duration(text, name))
    if flags.conntrack_tcp_be_liberal:
        changes["tcp_be_liberal"] = True
    return replace(ct, **changes)


def proxy_config(flags: Flags, cfg: DaemonConfig) -> ProxyConfig:
    """The planner's part of :func:`build_settings`, from the merged ``cfg`` and the flags
    only the planner reads."""
    seed = flags.consistent_hash_seed
    if seed is not None and not 0 <= seed <= 0xFFFFFFFF:
        raise ConfigError("--consistent-hash-seed", f"{seed} is not in 0..4294967295")
    return ProxyConfig(
        node_name=cfg.node_name,
        cluster_cidrs=_networks(cfg.cluster_cidr, "--cluster-cidr"),
        service_cidrs=_networks(flags.service_cidr, "--service-cidr"),
        nodeport_addresses=_nodeport_addresses(cfg.nodeport_addresses),
        masquerade_bit=cfg.masquerade_bit,
        node_ips=_addresses(flags.node_ip or cfg.node_ip, "--node-ip"),
        service_counters=flags.service_counters,
        load_balancing=LoadBalancing(cfg.load_balancing),
        hash_seed=seed,
    )


def _split(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def _networks(text: str, flag: str) -> tuple[IPNetwork, ...]:
    out: list[IPNetwork] = []
    for part in _split(text):
        try:
            out.append(ip_network(part))
        except ValueError as exc:
            raise ConfigError(flag, f"{part!r} is not a CIDR: {exc}") from exc
    return tuple(out)


def _addresses(text: str, flag: str) -> tuple[IPAddress, ...]:
    out: list[IPAddress] = []
    for part in _split(text):
        try:
            out.append(ip_address(part))
        except ValueError as exc:
            raise ConfigError(flag, f"{part!r} is not an IP address") from exc
    return tuple(out)


def _nodeport_addresses(text: str) -> tuple[str, ...]:
    parts = tuple(_split(text))
    for part in parts:
        if part != PRIMARY:
            _networks(part, "--nodeport-addresses")
    return parts or (PRIMARY,)
