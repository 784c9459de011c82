"""kube-proxy's ``KubeProxyConfiguration`` file (``--config``), read within its limits
(``read.py``) and mapped onto a :class:`DaemonConfig`: fields nlproxy honours are taken, the
others named once in a warning, an invalid value is a :class:`ConfigError` naming the field."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from ipaddress import ip_address
from pathlib import Path
from typing import Any

from nlproxy.config.duplicates import Duplicate
from nlproxy.config.read import read_config
from nlproxy.config.values import (
    HEALTHZ_PORT,
    METRICS_PORT,
    DaemonConfig,
    bind_address,
    bounded_period,
    parse_duration,
    with_field,
)
from nlproxy.conntrack.sysctl import ConntrackConfig
from nlproxy.errors import ConfigError

API_VERSIONS = ("kubeproxy.config.k8s.io/v1alpha1", "kubeproxy.config.k8s.io/v1alpha2")
LENIENT_API_VERSION = API_VERSIONS[0]
"""The version kube-proxy still decodes leniently when its strict decoding fails (a key
written twice: the last value wins, and it logs why); a file of any other is refused."""


def _get(doc: Mapping[str, Any], path: str) -> Any:
    cur: Any = doc
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


# Fields nlproxy honours, by path in the file, in some version and mode (what one file is read
# at: honoured_fields()).
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
    "detectLocal.bridgeInterface",
    "detectLocal.interfaceNamePrefix",
    "bindAddress",
    "conntrack",
    "clientConnection.qps",
    "clientConnection.burst",
    "oomScoreAdj",
    "linux.masqueradeAll",
}
# Values kubeadm writes that mean "kube-proxy's default": not worth a warning.
DEFAULTS = {
    ("bindAddress", "0.0.0.0"),
    ("bindAddress", "::"),
    ("logging.format", "text"),
    ("logging.flushFrequency", "5s"),
    ("logging.options.json.infoBufferSize", "0"),
    ("logging.options.text.infoBufferSize", "0"),
    # kube-proxy's defaults, which kubeadm writes into the sections of the modes not used
    *((f"{s}.syncPeriod", "30s") for s in ("iptables", "ipvs", "nftables")),
    *((f"{s}.minSyncPeriod", "1s") for s in ("iptables", "nftables")),
    *((f"{s}.masqueradeBit", 14) for s in ("iptables", "nftables")),
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
IPTABLES_MODE_WARNING = (
    "mode 'iptables': nlproxy programs nftables in iptables mode's place (the iptables "
    "section's masqueradeAll, masqueradeBit and sync periods carry over); remove iptables "
    "mode's rules with 'nlproxy cleanup --kube-proxy'"
)
MODE_WARNINGS = {"ipvs": IPVS_MODE_WARNING, "iptables": IPTABLES_MODE_WARNING}
"""The modes nlproxy runs in the place of, each with its one warning."""
MODES = ("nftables", *MODE_WARNINGS)
DETECT_LOCAL_MODES = ("ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix")
"""kube-proxy's ``detectLocalMode`` values (``proxy/config.py``'s ``DetectLocal``)."""
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
        elif not _empty(v) and not (isinstance(v, str | int) and (path, v) in DEFAULTS):
            out.append(path)
    return out


def sections(mode: object) -> tuple[str, str]:
    """The sections a file of ``mode`` takes its sync periods and its masquerade mark (and
    ``masqueradeAll``) from, as kube-proxy converts them: ``nftables`` for nftables; ``ipvs``
    and the mark of ``iptables`` for IPVS; ``iptables`` for iptables and for an empty mode
    (kube-proxy's default on Linux), although nlproxy programs nftables for all of them."""
    if mode == "nftables":
        return "nftables", "nftables"
    if mode == "ipvs":
        return "ipvs", "iptables"
    return "iptables", "iptables"


MODE_FIELDS = frozenset(
    f"{s}.{k}"
    for s in ("iptables", "ipvs", "nftables")
    for k in ("syncPeriod", "minSyncPeriod", "masqueradeBit", "masqueradeAll")
)
"""Fields read only when the mode reads their section (:func:`mode_fields`); set in another
section, one is named in a warning."""


PERIODS = frozenset(
    f"{s}{k}"
    for s in ("", "iptables.", "ipvs.", "nftables.")
    for k in ("syncPeriod", "minSyncPeriod")
)
"""Every place a sync period may be written; one file version reads one pair
(:func:`period_paths`)."""


def mode_fields(mode: object) -> set[str]:
    """The mark fields of :data:`MODE_FIELDS` a file of ``mode`` reads (its periods:
    :func:`period_paths`)."""
    _, marks = sections(mode)
    return {f"{marks}.masqueradeBit", f"{marks}.masqueradeAll"}


def _period(value: object, path: str, attr: str) -> float | None:
    """A sync period of the file in seconds; None for 0 or unset, which kube-proxy's defaulting
    replaces by its default before validating (kubeadm writes ``0s`` for every period).

    Raises:
        ConfigError: not a duration, negative (kube-proxy: ``syncPeriod`` must be greater
            than 0, ``minSyncPeriod`` at least 0), or beyond :func:`bounded_period`'s bounds.
    """
    if value is None or value == "":
        return None
    negative = isinstance(value, str) and value.startswith("-")
    seconds = parse_duration(value[1:] if isinstance(value, str) and negative else value, path)
    if negative and seconds:
        least = "greater than 0" if attr == "sync_period" else "at least 0"
        raise ConfigError("KubeProxyConfiguration", f"{value!r}: must be {least}", field=path)
    return bounded_period(seconds, attr, path) if seconds else None


def _mark_bit(value: object, path: str) -> int | None:
    """A ``masqueradeBit`` (0..31, kube-proxy's validation); None when unset.

    Raises:
        ConfigError: not an integer in 0..31, naming ``path``.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 31:
        raise ConfigError("KubeProxyConfiguration", f"{value!r} is not in 0..31", field=path)
    return value


def period_paths(doc: Mapping[str, Any]) -> tuple[str, str]:
    """Where ``doc`` keeps ``syncPeriod`` and ``minSyncPeriod``: in the mode's section in
    ``v1alpha1`` (:func:`sections`), at the top level in ``v1alpha2``, which has them nowhere
    else; kube-proxy knows no other place in either version."""
    if doc.get("apiVersion") == LENIENT_API_VERSION:
        section, _ = sections(_get(doc, "mode"))
        return f"{section}.syncPeriod", f"{section}.minSyncPeriod"
    return "syncPeriod", "minSyncPeriod"


def masquerade_all_paths(doc: Mapping[str, Any]) -> tuple[str, ...]:
    """Where ``doc`` sets ``masqueradeAll``: the mode's mark section (:func:`sections`), and in
    ``v1alpha2`` its ``linux`` section too (``v1alpha1`` has none: kube-proxy's conversion
    takes the mode's section alone)."""
    _, marks = sections(_get(doc, "mode"))
    if doc.get("apiVersion") == LENIENT_API_VERSION:
        return (f"{marks}.masqueradeAll",)
    return f"{marks}.masqueradeAll", "linux.masqueradeAll"


def honoured_fields(doc: Mapping[str, Any]) -> set[str]:
    """The paths of :data:`HONOURED` that ``doc`` (a file of its version and mode) is read at:
    its mode's sections only (a field of another is named as unused)."""
    return (
        (HONOURED - MODE_FIELDS - PERIODS - {"linux.masqueradeAll"})
        | mode_fields(_get(doc, "mode"))
        | set(period_paths(doc))
        | set(masquerade_all_paths(doc))
    )


def _decodes(doc: Mapping[str, Any]) -> None:
    """Every period and mark of the file's version has a value of its type, read or not:
    kube-proxy decodes the whole file before it looks at the mode, so ``minSyncPeriod: often``
    in a section the mode does not read still stops it (v1alpha1 has periods in its sections
    only and no IPVS mark, fields it ignores; v1alpha2 refuses any field it does not know).

    Raises:
        ConfigError: a period that is not a Go duration, a mark that is not an integer.
    """
    lenient = doc.get("apiVersion") == LENIENT_API_VERSION
    for path in sorted(PERIODS):
        value = _get(doc, path)
        if value not in (None, "") and not (lenient and "." not in path):
            text = value[1:] if isinstance(value, str) and value.startswith("-") else value
            parse_duration(text, path)
    marks = ("iptables", "nftables") if lenient else ("iptables", "ipvs", "nftables")
    for path in (f"{s}.masqueradeBit" for s in marks):
        value = _get(doc, path)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError("KubeProxyConfiguration", f"{value!r} is not an integer", field=path)


def _merge_periods(doc: Mapping[str, Any], cfg: DaemonConfig) -> DaemonConfig:
    """Sync periods (:func:`period_paths`), the masquerade mark and ``masqueradeAll`` (from
    the mode's sections, :func:`sections`)."""
    _, marks = sections(_get(doc, "mode"))
    _decodes(doc)
    for path, attr in zip(period_paths(doc), ("sync_period", "min_sync_period"), strict=True):
        seconds = _period(_get(doc, path), path, attr)
        if seconds is not None:
            cfg = with_field(cfg, attr, seconds)
    # kube-proxy validates the iptables section's mark whatever the mode, the nftables one's
    # in nftables mode (the one it then uses).
    _mark_bit(_get(doc, "iptables.masqueradeBit"), "iptables.masqueradeBit")
    bit = _mark_bit(_get(doc, f"{marks}.masqueradeBit"), f"{marks}.masqueradeBit")
    if bit is not None:
        cfg = replace(cfg, masquerade_bit=bit)
    for path in masquerade_all_paths(doc):
        value = _get(doc, path)
        if value is not None and not isinstance(value, bool):
            raise ConfigError(
                "KubeProxyConfiguration", f"{value!r} is not true or false", field=path
            )
        if value:
            cfg = replace(cfg, masquerade_all=True)
    return cfg


def _client(doc: Mapping[str, Any], cfg: DaemonConfig) -> DaemonConfig:
    """``clientConnection.qps`` and ``burst``: the API client's request rate."""
    qps, burst = _get(doc, "clientConnection.qps"), _get(doc, "clientConnection.burst")
    if qps is not None:
        if isinstance(qps, bool) or not isinstance(qps, int | float):
            raise ConfigError(
                "KubeProxyConfiguration", f"{qps!r} is not a number", field="clientConnection.qps"
            )
        if qps:  # 0: the default (kubeadm writes 0)
            cfg = replace(cfg, kube_api_qps=float(qps))
    if burst is not None:
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 0:
            raise ConfigError(
                "KubeProxyConfiguration", f"{burst!r} is not a count",
                field="clientConnection.burst",
            )  # fmt: skip
        if burst:
            cfg = replace(cfg, kube_api_burst=burst)
    oom = _get(doc, "oomScoreAdj")
    if oom is not None:
        cfg = replace(cfg, oom_score_adj=oom_score_adj(oom, "KubeProxyConfiguration oomScoreAdj"))
    return cfg


def oom_score_adj(value: object, name: str) -> int:
    """An ``oom_score_adj`` value, -1000..1000 (``name``: the flag or field it came from).

    Raises:
        ConfigError: not an integer in range.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not -1000 <= value <= 1000:
        raise ConfigError(name, f"{value!r} is not an integer in -1000..1000")
    return value


def _detect_local(doc: Mapping[str, Any], cfg: DaemonConfig) -> DaemonConfig:
    """``detectLocalMode`` and the ``detectLocal`` section (checked together with the flags in
    ``config/__init__.py``)."""
    detect = _get(doc, "detectLocalMode")
    if detect not in (None, "", *DETECT_LOCAL_MODES):
        raise ConfigError(
            "KubeProxyConfiguration",
            f"{detect!r} is not one of {', '.join(DETECT_LOCAL_MODES)}",
            field="detectLocalMode",
        )
    if detect:
        cfg = replace(cfg, detect_local_mode=detect)
    return _strings(
        doc,
        cfg,
        ("detectLocal.bridgeInterface", "pod_bridge_interface"),
        ("detectLocal.interfaceNamePrefix", "pod_interface_name_prefix"),
    )


def _strings(doc: Mapping[str, Any], cfg: DaemonConfig, *fields: tuple[str, str]) -> DaemonConfig:
    """``cfg`` with each ``(path, attribute)`` of ``fields`` the file sets (non-empty) taken.

    Raises:
        ConfigError: a value that is not a string, naming its field.
    """
    for path, attr in fields:
        value = _get(doc, path)
        if value:
            if not isinstance(value, str):
                raise ConfigError(
                    "KubeProxyConfiguration", f"{value!r} is not a string", field=path
                )
            cfg = with_field(cfg, attr, value)
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


def load_kube_proxy_config(path: Path, base: DaemonConfig | None = None) -> DaemonConfig:
    """Read a KubeProxyConfiguration YAML file on top of ``base`` (defaults).

    Raises:
        ConfigError: unreadable file, wrong kind/apiVersion, or an invalid value (names the field).
    """
    cfg = base or DaemonConfig()
    doc, duplicates = _document(path)
    mode = _get(doc, "mode")
    if mode not in (None, "", *MODES):
        raise ConfigError(
            "KubeProxyConfiguration",
            f"{mode!r}: nlproxy programs nftables; set mode: nftables (or leave it empty)",
            field="mode",
        )
    cfg = _detect_local(doc, cfg)
    cfg = _client(doc, cfg)
    cfg = _addresses(doc, cfg)
    if _get(doc, "clientConnection.kubeconfig"):
        cfg = replace(cfg, kubeconfig_from_file=True)
    cfg = _strings(
        doc,
        cfg,
        ("hostnameOverride", "node_name"),
        ("clientConnection.kubeconfig", "kubeconfig"),
        ("clusterCIDR", "cluster_cidr"),
    )
    npa = _get(doc, "nodePortAddresses")
    if npa:
        if not isinstance(npa, list) or not all(isinstance(a, str) for a in npa):
            raise ConfigError(
                "KubeProxyConfiguration", "must be a list of strings", field="nodePortAddresses"
            )
        cfg = replace(cfg, nodeport_addresses=",".join(npa))
    cfg = _merge_periods(doc, cfg)
    cfg = replace(cfg, conntrack=_conntrack(doc.get("conntrack")))
    honoured = honoured_fields(doc)
    unused = sorted(
        p for p in _leaves(doc) if p not in honoured and p.split(".")[0] not in IGNORED_QUIETLY
    )
    warnings = [f"config {path}: {d}; the last value is used" for d in duplicates]
    warnings += [_unused(p, doc) for p in unused]
    cfg, scheduler_warning = _scheduler(doc, cfg)
    warnings += scheduler_warning
    if mode in MODE_WARNINGS:
        warnings.insert(0, MODE_WARNINGS[mode])
    return replace(cfg, warnings=tuple(warnings))


def _document(path: Path) -> tuple[Mapping[str, Any], list[Duplicate]]:
    """The file's document and its duplicate keys, checked to be a KubeProxyConfiguration of a
    version nlproxy reads (duplicates are an error but in the lenient version).

    Raises:
        ConfigError: naming the file.
    """
    doc, duplicates = read_config(path)
    if not isinstance(doc, Mapping):
        raise ConfigError(f"config {path}", "is not a YAML mapping")
    if doc.get("kind") != "KubeProxyConfiguration" or doc.get("apiVersion") not in API_VERSIONS:
        raise ConfigError(
            f"config {path}", f"expected kind KubeProxyConfiguration, apiVersion {API_VERSIONS[0]}"
        )
    if duplicates and doc.get("apiVersion") != LENIENT_API_VERSION:
        raise ConfigError(
            f"config {path}", f"{duplicates[0]}; {doc['apiVersion']} allows each key once"
        )
    return doc, duplicates


def _addresses(doc: Mapping[str, Any], cfg: DaemonConfig) -> DaemonConfig:
    """The HTTP bind addresses and ``bindAddress`` (this node's IP when it is one address).

    Raises:
        ConfigError: naming the field.
    """
    for path_, attr, port in (
        ("healthzBindAddress", "healthz_bind_address", HEALTHZ_PORT),
        ("metricsBindAddress", "metrics_bind_address", METRICS_PORT),
    ):
        if doc.get(path_):  # empty in a file means kube-proxy's default (kubeadm writes "")
            field_ = f"KubeProxyConfiguration {path_}"
            cfg = with_field(cfg, attr, bind_address(doc[path_], port, field_))
    bind = _get(doc, "bindAddress")
    if bind is not None and not isinstance(bind, str):  # YAML reads 167772161 as a number
        raise ConfigError(
            "KubeProxyConfiguration", f"{bind!r} is not an IP address", field="bindAddress"
        )
    if bind and bind not in ("0.0.0.0", "::"):
        try:
            cfg = replace(cfg, node_ip=str(ip_address(bind)))
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                "KubeProxyConfiguration", f"{bind!r} is not an IP address", field="bindAddress"
            ) from exc
    return cfg


def _scheduler(doc: Mapping[str, Any], cfg: DaemonConfig) -> tuple[DaemonConfig, list[str]]:
    """``ipvs.scheduler`` as a load-balancing choice where nlproxy has one; else a warning.

    Raises:
        ConfigError: not a string.
    """
    scheduler = _get(doc, "ipvs.scheduler")
    if not scheduler:
        return cfg, []
    if not isinstance(scheduler, str):
        raise ConfigError(
            "KubeProxyConfiguration", f"{scheduler!r} is not a string", field="ipvs.scheduler"
        )
    if scheduler in IPVS_SCHEDULERS:
        return replace(cfg, load_balancing=IPVS_SCHEDULERS[scheduler]), []
    return cfg, [
        f"ipvs.scheduler {scheduler!r} has no nlproxy equivalent (rr, sh and mh do): "
        "endpoints are chosen at random"
    ]


def _unused(path: str, doc: Mapping[str, Any]) -> str:
    hint = HINTS.get(path.split(".")[0])
    mode = _get(doc, "mode")
    periods, marks = sections(mode)
    if path in PERIODS and doc.get("apiVersion") != LENIENT_API_VERSION:
        hint = f"{doc.get('apiVersion')} has its sync periods at the top level"
    elif path == "linux.masqueradeAll":
        hint = f"{LENIENT_API_VERSION} sets masqueradeAll in the mode's section"
    elif path in PERIODS and "." not in path:
        hint = f"{LENIENT_API_VERSION} has its sync periods in the mode's section"
    elif path in MODE_FIELDS | PERIODS:
        section = marks if path.endswith(("masqueradeBit", "masqueradeAll")) else periods
        hint = f"{'an empty mode' if not mode else f'mode {mode}'} reads the {section} section"
    return f"{path} is not used by nlproxy" + (f" ({hint})" if hint else "")
