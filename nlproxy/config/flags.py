"""kube-proxy's command line as nlproxy reads it: the flags beyond nlproxy's own, each with the
reader of its value and where it goes, so a kube-proxy DaemonSet's arguments run unchanged.

A flag is honoured (``dest`` names the ``Flags`` field it sets) or, where nothing in nlproxy
corresponds, named once in a warning with why (``why``); either way its value is read as
kube-proxy's flag library reads it, and one it would refuse is refused (exit 2, the flag named).
``commands/run.py`` turns this table into its parser's options; nothing here knows argparse.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from ipaddress import ip_network

from nlproxy.config.values import parse_duration
from nlproxy.errors import ConfigError

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def go_bool(text: str) -> bool:
    """A boolean as Go's ``strconv.ParseBool`` reads it (what ``--flag=false`` takes).

    Raises:
        ValueError: anything else.
    """
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{text!r} is not true or false")


def duration(text: str) -> float:
    """A Go duration in seconds (``30s``, ``1m30s``; ``0`` alone is zero, as in Go)."""
    try:
        return parse_duration(text, "value")
    except ConfigError:
        raise ValueError(f"{text!r} is not a duration (such as 30s or 1m30s)") from None


def integer(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise ValueError(f"{text!r} is not an integer") from None


def number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{text!r} is not a number")
    return value


def text_value(text: str) -> str:
    return text


def feature_gates(text: str) -> dict[str, bool]:
    """``Key=true,Other=false`` (``--feature-gates``)."""
    gates: dict[str, bool] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, eq, value = part.partition("=")
        if not eq or not key:
            raise ValueError(f"{part!r} is not Key=true|false")
        gates[key] = go_bool(value)
    return gates


def cidrs(text: str) -> list[str]:
    out = []
    for part in (p.strip() for p in text.split(",")):
        if part:
            try:
                out.append(str(ip_network(part)))
            except ValueError as exc:
                raise ValueError(f"{part!r} is not a CIDR: {exc}") from None
    return out


_QUANTITY = re.compile(r"\d+(\.\d+)?([KMGTPE]i?|[kmun]|e\d+)?")


def quantity(text: str) -> str:
    """A Kubernetes quantity (``0``, ``64Ki``, ``1M``: the log buffer sizes)."""
    if not _QUANTITY.fullmatch(text):
        raise ValueError(f"{text!r} is not a quantity (such as 0 or 64Ki)")
    return text


_VERSION = re.compile(r"(\d+\.\d+)?")


def metrics_version(text: str) -> str:
    """``--show-hidden-metrics-for-version``: empty, or ``MAJOR.MINOR``."""
    if not _VERSION.fullmatch(text):
        raise ValueError(f"{text!r} is not MAJOR.MINOR (such as 1.35)")
    return text


_VMODULE = re.compile(r"[^=,]+=\d+")


def vmodule(text: str) -> str:
    """``pattern=N,...`` (klog's ``--vmodule``)."""
    for part in text.split(","):
        if part and not _VMODULE.fullmatch(part):
            raise ValueError(f"{part!r} is not PATTERN=N")
    return text


@dataclass(frozen=True, slots=True)
class KubeProxyFlag:
    """One kube-proxy flag nlproxy has no option of its own for.

    Attributes:
        name: its spelling (``--oom-score-adj``).
        read: reads (and checks) its value; raises ValueError saying what is wrong.
        switch: a boolean flag: given alone it means true, or ``--flag=false``.
        dest: the ``Flags`` field it sets; None: not used, named in a warning.
        why: what the warning says nlproxy does instead.
        help: the help text.
        metavar: the value's name in the help.
    """

    name: str
    read: Callable[[str], object]
    switch: bool = False
    dest: str | None = None
    why: str = ""
    help: str = ""
    metavar: str | None = None


_IPVS = "nlproxy programs no IPVS"
_LOG_NOW = "nlproxy writes each log line at once"

KUBE_PROXY_FLAGS: tuple[KubeProxyFlag, ...] = (
    # Honoured.
    KubeProxyFlag(
        "--masquerade-all", go_bool, switch=True, dest="masquerade_all",
        help="masquerade all traffic to ClusterIPs, whatever its source (kube-proxy's flag)",
    ),
    KubeProxyFlag(
        "--detect-local-mode", text_value, dest="detect_local_mode", metavar="MODE",
        help="how pods are told apart: ClusterCIDR (default: sources in --cluster-cidr), "
        "NodeCIDR (the Node's spec.podCIDRs, followed as it changes), BridgeInterface (in on "
        "--pod-bridge-interface) or InterfaceNamePrefix (in on --pod-interface-name-prefix*)",
    ),
    KubeProxyFlag(
        "--pod-bridge-interface", text_value, dest="pod_bridge_interface", metavar="NAME",
        help="with --detect-local-mode BridgeInterface: the pods' bridge",
    ),
    KubeProxyFlag(
        "--pod-interface-name-prefix", text_value, dest="pod_interface_name_prefix",
        metavar="PREFIX",
        help="with --detect-local-mode InterfaceNamePrefix: the pods' interfaces' name prefix",
    ),
    KubeProxyFlag(
        "--kube-api-qps", number, dest="kube_api_qps", metavar="QPS",
        help="requests per second to the API server (default 5)",
    ),
    KubeProxyFlag(
        "--kube-api-burst", integer, dest="kube_api_burst", metavar="N",
        help="requests to the API server at once above --kube-api-qps (default 10)",
    ),
    KubeProxyFlag(
        "--oom-score-adj", integer, dest="oom_score_adj", metavar="N",
        help="the process's oom_score_adj, -1000..1000 (default: left alone; kube-proxy sets "
        "-999)",
    ),
    KubeProxyFlag(
        "--ipvs-scheduler", text_value, dest="ipvs_scheduler", metavar="NAME",
        help="rr, sh and mh choose endpoints as --load-balancing round-robin and "
        "consistent-hash do; any other is warned about",
    ),
    KubeProxyFlag(
        "--ipvs-sync-period", text_value, dest="ipvs_sync_period", metavar="DURATION",
        help="with --proxy-mode ipvs: --sync-period",
    ),
    KubeProxyFlag(
        "--ipvs-min-sync-period", text_value, dest="ipvs_min_sync_period", metavar="DURATION",
        help="with --proxy-mode ipvs: --min-sync-period",
    ),
    KubeProxyFlag(
        "--healthz-port", integer, dest="healthz_port", metavar="PORT",
        help="deprecated in kube-proxy: the port of --healthz-bind-address",
    ),
    KubeProxyFlag(
        "--metrics-port", integer, dest="metrics_port", metavar="PORT",
        help="deprecated in kube-proxy: the port of --metrics-bind-address",
    ),
    # Read, checked and named in a warning.
    KubeProxyFlag("--feature-gates", feature_gates, why="nlproxy has no feature gates"),
    KubeProxyFlag(
        "--kube-api-content-type", text_value, why="nlproxy's client reads JSON"
    ),
    KubeProxyFlag(
        "--bind-address-hard-fail", go_bool, switch=True,
        why="an address nlproxy cannot bind always stops it, exit 2",
    ),
    KubeProxyFlag("--profiling", go_bool, switch=True, why="nlproxy serves no profiling"),
    KubeProxyFlag(
        "--show-hidden-metrics-for-version", metrics_version, why="nlproxy hides no metrics"
    ),
    KubeProxyFlag(
        "--config-sync-period", duration,
        why="nlproxy's sources watch and relist on their own, never on a timer",
    ),
    KubeProxyFlag(
        "--iptables-localhost-nodeports", go_bool, switch=True,
        why="nftables mode serves no NodePorts on localhost, as kube-proxy's",
    ),
    KubeProxyFlag("--ipvs-exclude-cidrs", cidrs, why=_IPVS),
    KubeProxyFlag("--ipvs-strict-arp", go_bool, switch=True, why=_IPVS),
    KubeProxyFlag("--ipvs-tcp-timeout", duration, why=f"{_IPVS}; see --conntrack-*"),
    KubeProxyFlag("--ipvs-tcpfin-timeout", duration, why=f"{_IPVS}; see --conntrack-*"),
    KubeProxyFlag("--ipvs-udp-timeout", duration, why=f"{_IPVS}; see --conntrack-*"),
    KubeProxyFlag(
        "--vmodule", vmodule, why="nlproxy has one level for all: --log-level or -v"
    ),
    KubeProxyFlag("--log-flush-frequency", duration, why=_LOG_NOW),
    KubeProxyFlag(
        "--log-text-split-stream", go_bool, switch=True, why="nlproxy logs to stderr"
    ),
    KubeProxyFlag("--log-text-info-buffer-size", quantity, why=_LOG_NOW),
    KubeProxyFlag(
        "--log-json-split-stream", go_bool, switch=True, why="nlproxy logs to stderr"
    ),
    KubeProxyFlag("--log-json-info-buffer-size", quantity, why=_LOG_NOW),
)  # fmt: skip
"""The kube-proxy v1.36 flags nlproxy has no option of its own for. The others are nlproxy's
own options (``--config``, ``--kubeconfig``, ``--conntrack-*``, …) or their aliases
(``--iptables-sync-period`` is ``--sync-period``, ``--iptables-masquerade-bit``
``--masquerade-bit``, ``--logging-format`` ``--log-format``)."""

LOGGING_FORMATS = {"text": "console", "json": "json"}
"""kube-proxy's ``--logging-format`` values as nlproxy's ``--log-format``."""
