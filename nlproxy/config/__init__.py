"""The one configuration of ``nlproxy run``: defaults, then kube-proxy's
``KubeProxyConfiguration`` file, then flags, merged here into a typed :class:`Settings`.

An existing kube-proxy ConfigMap works unchanged: fields that apply to nlproxy are honoured,
fields that do not are named once in a warning, and an invalid value is a :class:`ConfigError`
naming the field (exit status 2). Flags given on the command line override the file.

``commands/run.py`` turns its parsed arguments into :class:`Flags` and calls
:func:`build_settings`; the daemon receives the :class:`Settings` and never sees argparse.

The file is read and mapped in ``kubeproxy.py``; the values both the file and the flags give
(:class:`DaemonConfig`, addresses, durations) are read in ``values.py``; kube-proxy's flags beyond
nlproxy's own options, with the readers of their values, are listed in ``flags.py``;
``export.py`` writes the settings back as a KubeProxyConfiguration (``--write-config-to``);
``watch.py`` turns a changed ``--config`` file into what changed, for a running daemon, and
``notify.py`` tells it when to look (inotify over the file's directories);
``read.py`` reads the file within its limits and ``duplicates.py`` finds the keys it writes
twice. Their public names are imported from here.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, replace
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

from nlproxy.cluster.model import IPAddress, IPNetwork, LoadBalancing
from nlproxy.config.kubeproxy import (
    DETECT_LOCAL_MODES,
    HONOURED,
    IPVS_SCHEDULERS,
    MODE_WARNINGS,
    honoured_fields,
    load_kube_proxy_config,
    oom_score_adj,
)
from nlproxy.config.read import MAX_CONFIG_BYTES
from nlproxy.config.values import (
    API_SERVER_ENV,
    HEALTHZ_PORT,
    METRICS_PORT,
    DaemonConfig,
    api_server_url,
    bind_address,
    bounded_period,
    external_networks,
    parse_duration,
    with_field,
)
from nlproxy.conntrack.sysctl import ConntrackConfig
from nlproxy.errors import ConfigError
from nlproxy.proxy.config import INTERFACE_MODES, PRIMARY, DetectLocal, ProxyConfig

__all__ = [
    "HONOURED",
    "MAX_CONFIG_BYTES",
    "DaemonConfig",
    "Flags",
    "Settings",
    "bind_address",
    "build_settings",
    "external_networks",
    "honoured_fields",
    "load_kube_proxy_config",
    "parse_duration",
    "parse_networks",
]


def _check_periods(cfg: DaemonConfig) -> None:
    """kube-proxy's rule: ``minSyncPeriod`` no longer than ``syncPeriod``."""
    if cfg.min_sync_period > cfg.sync_period:
        raise ConfigError(
            "minSyncPeriod",
            f"{cfg.min_sync_period:g}s is longer than syncPeriod ({cfg.sync_period:g}s)",
        )


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
    service_node_port_range: str | None = None
    load_balancing: str | None = None
    consistent_hash_seed: int | None = None
    service_counters: bool = False
    conntrack_flush_tcp: bool = False
    owned_table: bool = False
    replace_kube_proxy: bool = False
    service_proxy_name: str | None = None
    exclude_unreachable_endpoints: bool = False
    programming_latency_services: int = 0
    conntrack_max_per_core: int | None = None
    conntrack_min: int | None = None
    conntrack_tcp_timeout_established: str | None = None
    conntrack_tcp_timeout_close_wait: str | None = None
    conntrack_tcp_be_liberal: bool | None = None
    conntrack_udp_timeout: str | None = None
    conntrack_udp_timeout_stream: str | None = None
    once: bool = False
    force: bool = False
    masquerade_all: bool | None = None
    detect_local_mode: str | None = None
    pod_bridge_interface: str | None = None
    pod_interface_name_prefix: str | None = None
    kube_api_qps: float | None = None
    kube_api_burst: int | None = None
    oom_score_adj: int | None = None
    ipvs_scheduler: str | None = None
    ipvs_sync_period: str | None = None
    ipvs_min_sync_period: str | None = None
    healthz_port: int | None = None
    metrics_port: int | None = None
    ignored: tuple[tuple[str, str], ...] = ()
    """kube-proxy flags that were given and that nlproxy has no use for, each with why: named
    once in a warning."""


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
        programming_latency_services: how many of the slowest Services' programming latency
            to export (0: none).
        service_proxy_name: serve only the Services labelled
            ``service.kubernetes.io/service-proxy-name`` with this name, beside kube-proxy,
            which serves the rest (a canary); None: those without the label, as kube-proxy.
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
    programming_latency_services: int = 0
    service_proxy_name: str | None = None


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
        programming_latency_services=_slowest(flags.programming_latency_services),
        service_proxy_name=service_proxy_name(flags),
    )


def _slowest(n: int) -> int:
    if not 0 <= n <= 1000:  # one series each: the label's values stay few
        raise ConfigError("--programming-latency-services", f"{n} is not in 0..1000")
    return n


# A label value, as the API server checks it (apimachinery's IsValidLabelValue).
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def service_proxy_name(flags: Flags) -> str | None:
    """``--service-proxy-name``, checked: a label value, and not with ``--replace-kube-proxy``
    (which would remove the rules of kube-proxy serving every other Service).

    Raises:
        ConfigError: naming the flag.
    """
    name = flags.service_proxy_name
    if name is None:
        return None
    if not _LABEL_VALUE.fullmatch(name):
        raise ConfigError(
            "--service-proxy-name",
            f"{name!r} is not a label value (1 to 63 of A-Z, a-z, 0-9, '-', '_' and '.', "
            "starting and ending with a letter or digit)",
        )
    if flags.replace_kube_proxy:
        raise ConfigError(
            "--service-proxy-name",
            "serves only the Services labelled service.kubernetes.io/service-proxy-name="
            f"{name} beside kube-proxy, which serves the rest: --replace-kube-proxy would "
            "remove kube-proxy's rules; give one or the other",
        )
    return name


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
            cfg = with_field(cfg, attr, bind_address(value, port, flag))
    cfg = replace(cfg, conntrack=_conntrack_flags(flags, cfg.conntrack))
    if flags.external_ip_cidrs:
        nets = parse_networks(flags.external_ip_cidrs, "--external-ip-cidrs")
        cfg = replace(cfg, external_ip_cidrs=tuple(str(n) for n in nets))
    if flags.service_node_port_range:
        cfg = replace(cfg, node_port_range=_port_range(flags.service_node_port_range))
    cfg = _mode_flags(flags, cfg)
    cfg = _kube_proxy_flags(flags, cfg)
    if flags.bind_address and flags.bind_address not in ("0.0.0.0", "::"):
        cfg = replace(cfg, node_ip=str(_addresses(flags.bind_address, "--bind-address")[0]))
    ipvs = flags.proxy_mode == "ipvs"
    for flag, attr, text in (
        ("--ipvs-min-sync-period", "min_sync_period", flags.ipvs_min_sync_period if ipvs else None),
        ("--ipvs-sync-period", "sync_period", flags.ipvs_sync_period if ipvs else None),
        ("--min-sync-period", "min_sync_period", flags.min_sync_period),
        ("--sync-period", "sync_period", flags.sync_period),
    ):
        if text:
            cfg = with_field(cfg, attr, bounded_period(parse_duration(text, flag), attr, flag))
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


def _port_range(text: str) -> tuple[int, int]:
    """``--service-node-port-range`` as kube-apiserver spells it: ``LOW-HIGH`` (or one port).

    Raises:
        ConfigError: not a range of ports in 1..65535, low first.
    """
    flag = "--service-node-port-range"
    low, sep, high = text.strip().partition("-")
    try:
        first = int(low)
        last = int(high) if sep else first
    except ValueError:
        raise ConfigError(flag, f"{text!r} is not LOW-HIGH (e.g. 30000-32767)") from None
    if not 1 <= first <= last <= 65535:
        raise ConfigError(flag, f"{text!r} is not a range of ports in 1..65535, low first")
    return first, last


def _mode_flags(flags: Flags, cfg: DaemonConfig) -> DaemonConfig:
    """``--proxy-mode``: nftables; iptables and ipvs are run in the place of, with a warning."""
    mode = flags.proxy_mode
    if mode not in (None, "", "nftables", *MODE_WARNINGS):
        raise ConfigError("--proxy-mode", f"{mode!r}: nlproxy programs nftables (use 'nftables')")
    if mode in MODE_WARNINGS:
        warning = MODE_WARNINGS[mode].replace("mode", "--proxy-mode", 1)
        others = [w for w in cfg.warnings if w not in MODE_WARNINGS.values()]
        cfg = replace(cfg, warnings=(warning, *others))
    return cfg


def _kube_proxy_flags(flags: Flags, cfg: DaemonConfig) -> DaemonConfig:
    """kube-proxy's flags beyond nlproxy's own: honoured where they apply, the others named."""
    changes: dict[str, Any] = {}
    if flags.masquerade_all is not None:
        changes["masquerade_all"] = flags.masquerade_all
    if flags.detect_local_mode is not None:
        if flags.detect_local_mode not in ("", *DETECT_LOCAL_MODES):
            raise ConfigError(
                "--detect-local-mode",
                f"{flags.detect_local_mode!r} is not one of {', '.join(DETECT_LOCAL_MODES)}",
            )
        changes["detect_local_mode"] = flags.detect_local_mode or "ClusterCIDR"
    for attr in ("pod_bridge_interface", "pod_interface_name_prefix"):
        value = getattr(flags, attr)
        if value is not None:
            changes[attr] = value
    if flags.kube_api_burst is not None and flags.kube_api_burst < 0:
        raise ConfigError("--kube-api-burst", f"{flags.kube_api_burst} is below 0")
    # 0 is the client's default, as in client-go.
    if flags.kube_api_burst:
        changes["kube_api_burst"] = flags.kube_api_burst
    if flags.kube_api_qps:
        changes["kube_api_qps"] = flags.kube_api_qps
    if flags.oom_score_adj is not None:
        changes["oom_score_adj"] = oom_score_adj(flags.oom_score_adj, "--oom-score-adj")
    for flag, attr, port in (
        ("--healthz-port", "healthz_bind_address", flags.healthz_port),
        ("--metrics-port", "metrics_bind_address", flags.metrics_port),
    ):
        if port is not None:  # kube-proxy: the deprecated port flag replaces the address's port
            if not 0 <= port <= 65535:
                raise ConfigError(flag, f"{port} is not in 0..65535")
            host = (getattr(cfg, attr) or "0.0.0.0:0").rpartition(":")[0]
            changes[attr] = f"{host}:{port}"
    warnings = list(cfg.warnings)
    if flags.ipvs_scheduler:
        if flags.ipvs_scheduler in IPVS_SCHEDULERS:
            changes["load_balancing"] = IPVS_SCHEDULERS[flags.ipvs_scheduler]
        else:
            warnings.append(
                f"--ipvs-scheduler {flags.ipvs_scheduler!r} has no nlproxy equivalent (rr, sh and "
                "mh do): endpoints are chosen at random"
            )
    if flags.proxy_mode != "ipvs":
        for flag, given in (
            ("--ipvs-sync-period", flags.ipvs_sync_period),
            ("--ipvs-min-sync-period", flags.ipvs_min_sync_period),
        ):
            if given is not None:
                parse_duration(given, flag)
                warnings.append(f"{flag} is not used by nlproxy (only with --proxy-mode ipvs)")
    warnings += [
        f"{flag} is not used by nlproxy" + (f" ({why})" if why else "")
        for flag, why in flags.ignored
    ]
    return replace(cfg, **changes, warnings=tuple(warnings))


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
    if flags.conntrack_tcp_be_liberal is not None:
        changes["tcp_be_liberal"] = flags.conntrack_tcp_be_liberal
    return replace(ct, **changes)


def proxy_config(flags: Flags, cfg: DaemonConfig) -> ProxyConfig:
    """The planner's part of :func:`build_settings`, from the merged ``cfg`` and the flags
    only the planner reads."""
    seed = flags.consistent_hash_seed
    if seed is not None and not 0 <= seed <= 0xFFFFFFFF:
        raise ConfigError("--consistent-hash-seed", f"{seed} is not in 0..4294967295")
    return ProxyConfig(
        node_name=cfg.node_name,
        cluster_cidrs=parse_networks(cfg.cluster_cidr, "--cluster-cidr"),
        service_cidrs=parse_networks(flags.service_cidr, "--service-cidr"),
        nodeport_addresses=_nodeport_addresses(cfg.nodeport_addresses),
        masquerade_bit=cfg.masquerade_bit,
        node_ips=_addresses(flags.node_ip or cfg.node_ip, "--node-ip"),
        service_counters=flags.service_counters,
        load_balancing=LoadBalancing(cfg.load_balancing),
        hash_seed=seed,
        masquerade_all=cfg.masquerade_all,
        **_detect_local(cfg),
    )


def _detect_local(cfg: DaemonConfig) -> dict[str, Any]:
    """The planner's ``detect_local`` and ``pod_interface`` from the merged file and flags.

    Raises:
        ConfigError: an interface mode without its interface (or with one no interface can be
            named), naming the flag.
    """
    mode = DetectLocal(cfg.detect_local_mode)
    if mode in INTERFACE_MODES:
        bridge = mode is DetectLocal.BRIDGE_INTERFACE
        name = cfg.pod_bridge_interface if bridge else cfg.pod_interface_name_prefix
        flag = "--pod-bridge-interface" if bridge else "--pod-interface-name-prefix"
        if not name:
            raise ConfigError(flag, f"must be given with detectLocalMode {mode}")
        return {"detect_local": mode, "pod_interface": name}
    return {"detect_local": mode}


def _split(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def parse_networks(text: str, flag: str) -> tuple[IPNetwork, ...]:
    """The CIDRs of a comma-separated flag value.

    Raises:
        ConfigError: naming ``flag`` and the part that is not a CIDR.
    """
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


ALL = "all"
"""``nodePortAddresses`` keyword (kube-proxy 1.37): every local address of both families."""
LOCALHOST = "localhost"


def _nodeport_addresses(text: str) -> tuple[str, ...]:
    parts = tuple(_split(text))
    if LOCALHOST in parts:
        raise ConfigError(
            "nodePortAddresses",
            "'localhost': NodePorts on loopback addresses need route_localnet, and nftables "
            "mode serves none (kube-proxy's neither); remove it",
        )
    if ALL in parts:
        if len(parts) > 1:
            raise ConfigError("nodePortAddresses", "'all' must be the only entry")
        return ("0.0.0.0/0", "::/0")
    for part in parts:
        if part != PRIMARY:
            parse_networks(part, "--nodeport-addresses")
    return parts or (PRIMARY,)
