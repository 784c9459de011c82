"""``nlproxy preflight``: what would bite when a kube-proxy node switches to nlproxy, one screen.

Read only, run on the node before the switch. Each check is a pure function from facts to
findings (tested without a kernel); the ``read_*`` functions gather the facts from the node
(netlink, ``/proc``; nothing is exec'd, nothing is changed), and :func:`preflight` runs them all:

- ``leftovers``: every kube-proxy mode's rules (``inspect/foreign.py``, ``inspect/ipvs.py``),
  and iptables-legacy tables, which nftables cannot show;
- ``api-server``: whether the API server nlproxy would use is reachable without a ClusterIP
  (a node with no proxy rules — new, rebooted, cleaned — otherwise never syncs);
- ``conntrack``: the conntrack sysctls nlproxy would set that differ from the node's;
- ``config``: the KubeProxyConfiguration translated: honoured, warned, refused;
- ``kernel``: the kernel release and whether nftables answers over netlink;
- ``clash``: another service proxy's tables or chains beside kube-proxy's.

A ``FAIL`` finding means the switch would break traffic; ``preflight`` exits 1 then.
"""

from __future__ import annotations

import enum
import errno
import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from nlproxy.config import HONOURED, DaemonConfig, _networks, load_kube_proxy_config
from nlproxy.errors import ConfigError
from nlproxy.inspect.foreign import Leftovers
from nlproxy.netlink import netns
from nlproxy.nft.ir import IPNetwork

KUBEADM_SERVICE_CIDR = ip_network("10.96.0.0/12")
"""kubeadm's default ``--service-cidr``: assumed when none is given."""

OTHER_PROXIES = {
    "cilium": "Cilium",
    "kube-router": "kube-router",
    "antrea": "Antrea",
    "calico": "Calico",
}
"""nftables table names (and, upper-cased with ``_``/``-``, iptables chain prefixes) of other
service proxies and CNIs with a service proxy of their own."""
_CHAIN_PREFIXES = {"CILIUM_": "Cilium", "KUBE-ROUTER-": "kube-router", "ANTREA-": "Antrea"}


class Level(enum.StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "FAIL"


@dataclass(frozen=True, slots=True)
class Finding:
    """One line of the screen: which check, how bad, and what to do."""

    check: str
    level: Level
    text: str


# -- checks (pure) ---------------------------------------------------------------------------


def leftovers(found: Leftovers, legacy: Sequence[str]) -> list[Finding]:
    """kube-proxy's rules of every mode still on the node: expected before the switch, and
    what ``cleanup --kube-proxy`` (or ``--replace-kube-proxy``) removes after it."""
    out = [
        Finding("leftovers", Level.WARN, f"{line}: remove after stopping kube-proxy with "
                "'nlproxy cleanup --kube-proxy' (or run with --replace-kube-proxy)")
        for line in found.describe()
    ]  # fmt: skip
    if legacy:
        out.append(
            Finding(
                "leftovers",
                Level.WARN,
                f"iptables-legacy tables loaded ({', '.join(legacy)}): nlproxy cannot read or "
                "remove legacy rules; if kube-proxy used iptables-legacy, run its "
                "'kube-proxy --cleanup' before the switch",
            )
        )
    if not out:
        out.append(Finding("leftovers", Level.OK, "no kube-proxy rules of any mode"))
    return out


def api_server(
    server: str | None,
    source: str,
    service_cidrs: Sequence[IPNetwork],
    *,
    in_cluster_host: str | None = None,
    reachable: str | None = None,
) -> Finding:
    """Whether ``server`` (a URL) is reachable with no proxy rules on the node.

    Args:
        source: where the address came from (named in the finding).
        in_cluster_host: ``KUBERNETES_SERVICE_HOST``: always the ``kubernetes`` ClusterIP.
        reachable: the outcome of a connection attempt (None: not tried).
    """
    if server is None:
        return Finding(
            "api-server",
            Level.FAIL,
            "no API server address: give --kubeconfig, --config or --api-server (in a pod, "
            "the in-cluster address is the kubernetes Service's ClusterIP)",
        )
    host = urlsplit(server).hostname or server
    why = ""
    try:
        addr = ip_address(host)
    except ValueError:
        if host.endswith((".svc", ".svc.cluster.local")) or host.startswith("kubernetes.default"):
            why = f"{host} is a Service name: it resolves to a ClusterIP"
    else:
        if in_cluster_host is not None and host == in_cluster_host:
            why = f"{host} is KUBERNETES_SERVICE_HOST, the kubernetes Service's ClusterIP"
        for net in service_cidrs:
            if addr in net:
                why = f"{host} is in the service CIDR {net}: a ClusterIP"
    if why:
        return Finding(
            "api-server",
            Level.FAIL,
            f"{source} {server}: {why}, which only a service proxy makes reachable: a node "
            "without proxy rules (new, rebooted, cleaned up) never syncs; use the control "
            "plane's own address (docs/migrating.md)",
        )
    tail = f" ({reachable})" if reachable else ""
    level = Level.OK if reachable in (None, "connected") else Level.WARN
    return Finding("api-server", level, f"{source} {server}: not a ClusterIP{tail}")


def conntrack(wanted: Mapping[str, int], current: Mapping[str, int | None]) -> list[Finding]:
    """The conntrack sysctls nlproxy would set against the node's values (kube-proxy's own
    once it has run). The table size is only ever raised."""
    out = []
    for name, value in sorted(wanted.items()):
        now = current.get(name)
        if now is None:
            out.append(Finding("conntrack", Level.WARN, f"net.netfilter.{name}: unreadable"))
        elif now == value or (name == "nf_conntrack_max" and now > value):
            continue
        else:
            change = "raised" if now < value else "lowered"
            out.append(
                Finding(
                    "conntrack",
                    Level.WARN,
                    f"net.netfilter.{name}: the node has {now}, nlproxy would set {value} "
                    f"({change}; set the conntrack section to keep the node's value)",
                )
            )
    return out or [Finding("conntrack", Level.OK, "the conntrack sysctls already match")]


def translate(doc: Mapping[str, Any], load: Any) -> list[Finding]:
    """A KubeProxyConfiguration as nlproxy reads it: the fields honoured, each warning, or
    the refusal. ``load`` returns the :class:`DaemonConfig` or raises :class:`ConfigError`."""
    try:
        cfg: DaemonConfig = load()
    except ConfigError as exc:
        return [Finding("config", Level.FAIL, f"refused: {exc}")]
    honoured = sorted(p for p in _paths(doc) if p in HONOURED or p.split(".")[0] in HONOURED)
    out = [Finding("config", Level.OK, "honoured: " + (", ".join(honoured) or "nothing set"))]
    out += [Finding("config", Level.WARN, w) for w in cfg.warnings]
    return out


def _paths(doc: Mapping[str, Any], prefix: str = "") -> Iterable[str]:
    for key, value in doc.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value and path not in HONOURED:
            yield from _paths(value, path + ".")
        elif value not in (None, "", [], {}):
            yield path


def kernel(release: str, nft_error: str | None) -> list[Finding]:
    if nft_error is not None:
        return [Finding("kernel", Level.FAIL, f"{release}: nftables does not answer: {nft_error}")]
    return [Finding("kernel", Level.OK, f"{release}: nftables answers over netlink")]


def clash(tables: Iterable[tuple[str, str]], chains: Iterable[str]) -> list[Finding]:
    """Another service proxy's nftables tables or iptables-nft chains."""
    seen: dict[str, set[str]] = {}
    for family, table in tables:
        for key, name in OTHER_PROXIES.items():
            if key in table.lower():
                seen.setdefault(name, set()).add(f"table {family} {table}")
    for chain in chains:
        for prefix, name in _CHAIN_PREFIXES.items():
            if chain.startswith(prefix):
                seen.setdefault(name, set()).add(f"chain {chain}")
    out = [
        Finding(
            "clash",
            Level.WARN,
            f"{name}'s rules ({', '.join(sorted(what)[:3])}{', …' if len(what) > 3 else ''}): "
            "two service proxies on one node answer the same Services; turn its service "
            "proxy off first",
        )
        for name, what in sorted(seen.items())
    ]
    return out or [Finding("clash", Level.OK, "no other service proxy's tables")]


def failed(findings: Iterable[Finding]) -> bool:
    return any(f.level is Level.FAIL for f in findings)


def render(findings: Sequence[Finding]) -> str:
    lines = [f"{f.level.value:<4}  {f.check:<10}  {f.text}" for f in findings]
    verdict = (
        "the switch would break traffic: fix every FAIL first"
        if failed(findings)
        else "nothing stops the switch (docs/migrating.md)"
    )
    return "\n".join([*lines, "", verdict])


# -- facts from the node ---------------------------------------------------------------------


def read_legacy_tables(netns_name: str | None) -> list[str]:
    """The iptables-legacy (x_tables) tables loaded in the namespace, by family."""
    out = []
    with netns.entered(netns_name):
        for family, name in (("ip", "ip_tables_names"), ("ip6", "ip6_tables_names")):
            try:
                text = (Path("/proc/self/net") / name).read_text()
            except OSError:
                continue
            out += [f"{family} {t}" for t in text.split()]
    return out


def read_sysctls(names: Iterable[str], netns_name: str | None) -> dict[str, int | None]:
    from nlproxy.conntrack.sysctl import PROC

    out: dict[str, int | None] = {}
    with netns.entered(netns_name):
        for name in names:
            try:
                out[name] = int((PROC / name).read_text())
            except (OSError, ValueError):
                out[name] = None
    return out


def kubeconfig_server(path: str) -> str | None:
    """The current context's API server URL in a kubeconfig.

    Raises:
        ConfigError: unreadable, or no server for the current context.
    """
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"kubeconfig {path}", str(exc)) from exc
    if not isinstance(doc, Mapping):
        raise ConfigError(f"kubeconfig {path}", "is not a YAML mapping")
    current = doc.get("current-context")
    contexts = {c.get("name"): c.get("context") or {} for c in doc.get("contexts") or []}
    clusters = {c.get("name"): c.get("cluster") or {} for c in doc.get("clusters") or []}
    cluster = contexts.get(current, {}).get("cluster")
    if cluster is None and len(clusters) == 1:
        cluster = next(iter(clusters))
    server = clusters.get(cluster, {}).get("server")
    if not isinstance(server, str):
        raise ConfigError(f"kubeconfig {path}", f"no server for context {current!r}")
    return server


def try_connect(server: str, netns_name: str | None, timeout: float = 2.0) -> str:
    """A TCP connection to the API server through the node's current rules."""
    parts = urlsplit(server)
    host = parts.hostname or server
    port = parts.port or (443 if parts.scheme != "http" else 80)
    try:
        with netns.entered(netns_name):
            conn = socket.create_connection((host, port), timeout=timeout)
        conn.close()
    except OSError as exc:
        why = exc.strerror or errno.errorcode.get(exc.errno or 0, str(exc))
        return f"no connection: {why}"
    return "connected"


def read_config(path: Path) -> tuple[Mapping[str, Any], list[Finding], DaemonConfig | None]:
    """The file's document, its translation, and its configuration when it loads."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        return {}, [Finding("config", Level.FAIL, f"refused: config {path}: {exc}")], None
    loaded: list[DaemonConfig] = []

    def load() -> DaemonConfig:
        loaded.append(load_kube_proxy_config(path))
        return loaded[0]

    findings = translate(doc if isinstance(doc, Mapping) else {}, load)
    return doc if isinstance(doc, Mapping) else {}, findings, (loaded[0] if loaded else None)


# -- every check on the node -----------------------------------------------------------------


def preflight(
    *,
    config: str | None,
    kubeconfig: str | None,
    api_server: str | None,
    service_cidr: str,
    netns_name: str | None,
) -> list[Finding]:
    """Every check on this node (or in ``netns_name``), in the order they are shown.

    Args:
        config: the KubeProxyConfiguration file nlproxy would start with.
        kubeconfig: the kubeconfig nlproxy would use (default: the config's
            ``clientConnection.kubeconfig``, else in-cluster).
        api_server: the API server address nlproxy would be given.
        service_cidr: the cluster's service CIDRs, comma separated ("": kubeadm's default).
        netns_name: the network namespace to look in.

    Raises:
        ConfigError: ``service_cidr`` is not a list of CIDRs.
    """
    from nlproxy.conntrack.sysctl import ConntrackConfig
    from nlproxy.inspect.foreign import find, names

    cidrs = tuple(_networks(service_cidr, "--service-cidr")) or (KUBEADM_SERVICE_CIDR,)
    findings: list[Finding] = []
    cfg: DaemonConfig | None = DaemonConfig()
    if config:
        _, translated, cfg = read_config(Path(config))
        findings += translated
    findings += leftovers(find(netns_name), read_legacy_tables(netns_name))
    findings.append(_api_server(kubeconfig, api_server, netns_name, cfg, cidrs))
    wanted = (cfg.conntrack if cfg is not None else ConntrackConfig()).wanted(os.cpu_count() or 1)
    findings += conntrack(wanted, read_sysctls(wanted, netns_name))
    findings += kernel(os.uname().release, _nft_error(netns_name))
    tables, chains = names(netns_name)
    findings += clash(tables, chains)
    return findings


def _api_server(
    kubeconfig: str | None,
    api_server_url: str | None,
    netns_name: str | None,
    cfg: DaemonConfig | None,
    cidrs: Sequence[IPNetwork],
) -> Finding:
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    server: str | None
    kubeconfig = kubeconfig or (cfg.kubeconfig if cfg is not None else None)
    if api_server_url:
        server, source = api_server_url, "--api-server"
    elif kubeconfig:
        server, source = kubeconfig_server(kubeconfig), f"kubeconfig {kubeconfig}:"
    elif host:
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        server, source = f"https://{host}:{port}", "in-cluster"
    else:
        server, source = None, ""
    reach = try_connect(server, netns_name) if server else None
    return api_server(server, source, cidrs, in_cluster_host=host, reachable=reach)


def _nft_error(netns_name: str | None) -> str | None:
    from nlproxy.netlink.nlsock import NetfilterSocket
    from nlproxy.nft.dump import generation

    try:
        with NetfilterSocket(netns_name, bufsize=1 << 20) as sock:
            generation(sock)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None
