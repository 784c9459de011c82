"""``nlproxy preflight``: what would bite when a kube-proxy node switches to nlproxy, one screen.

Read only, run on the node before the switch. Each check is a pure function from facts to
findings (tested without a kernel); the ``read_*`` functions gather the facts from the node
(netlink, ``/proc``; nothing is exec'd, nothing is changed), and :func:`preflight` runs them all:

- ``leftovers``: every kube-proxy mode's rules (``inspect/foreign.py``, ``inspect/ipvs.py``),
  and iptables-legacy tables, which nftables cannot show;
- ``api-server`` (:mod:`~nlproxy.operate.preflight_api`): the API server ``run`` would use
  (found as ``run`` finds it) is reachable, and without a ClusterIP (a node with no proxy
  rules — new, rebooted, cleaned — otherwise never syncs);
- ``conntrack``: the conntrack sysctls nlproxy would set that differ from the node's;
- ``config``: the KubeProxyConfiguration translated: honoured, warned, refused;
- ``kernel``: the kernel release and whether nftables answers over netlink;
- ``clash``: another service proxy's tables or chains beside kube-proxy's (a CNI's own rules,
  Cilium's, kube-router's, Antrea's, Calico's, are told apart and shown as ``ok``);
- ``changes``: the settings whose behaviour changes with the switch (IPVS schedulers,
  localhost NodePorts, NodePorts on every address).

A ``FAIL`` finding means the switch would break traffic; ``preflight`` exits 1 then.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from ipaddress import ip_network
from pathlib import Path
from typing import Any

from nlproxy.config import (
    DaemonConfig,
    honoured_fields,
    load_kube_proxy_config,
    parse_networks,
)
from nlproxy.config.read import read_config as read_document
from nlproxy.errors import ConfigError
from nlproxy.inspect.foreign import Leftovers
from nlproxy.netlink import netns
from nlproxy.operate.findings import Finding, Level, checked
from nlproxy.operate.preflight_api import api_server_findings

KUBEADM_SERVICE_CIDR = ip_network("10.96.0.0/12")
"""kubeadm's default ``--service-cidr``: assumed when none is given."""

CNI_TABLES = {"cilium": "Cilium", "kube-router": "kube-router", "antrea": "Antrea",
              "calico": "Calico"}  # fmt: skip
"""nftables table names (a substring, any family) of CNIs: their own packet filtering and
routing, not a service proxy."""
CNI_CHAINS = {"CILIUM_": "Cilium", "KUBE-ROUTER-": "kube-router", "ANTREA-": "Antrea",
              "cali-": "Calico"}  # fmt: skip
"""iptables-nft chain prefixes of the same CNIs."""
SERVICE_PROXY_CHAINS = {"KUBE-ROUTER-SERVICES": "kube-router"}
"""Chains only a CNI's own service proxy makes (kube-router's ``--run-service-proxy``)."""
CNI_PROXY_SWITCH = {
    "Cilium": "kubeProxyReplacement: false (its replacement is BPF, invisible here)",
    "kube-router": "--run-service-proxy=false",
    "Antrea": "antreaProxy.proxyAll: false",
    "Calico": "its eBPF dataplane off (bpfKubeProxy*)",
}
"""What keeps each CNI's service proxy off, named in the finding."""


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
    fields = honoured_fields(doc)
    honoured = sorted(p for p in _paths(doc, fields) if p in fields or p.split(".")[0] in fields)
    out = [Finding("config", Level.OK, "honoured: " + (", ".join(honoured) or "nothing set"))]
    out += [Finding("config", Level.WARN, w) for w in cfg.warnings]
    return out


def _paths(doc: Mapping[str, Any], fields: set[str], prefix: str = "") -> Iterable[str]:
    for key, value in doc.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value and path not in fields:
            yield from _paths(value, fields, path + ".")
        elif value not in (None, "", [], {}):
            yield path


def changes(
    doc: Mapping[str, Any],
    cfg: DaemonConfig | None,
    *,
    found: Leftovers | None = None,
    route_localnet: int | None = None,
) -> list[Finding]:
    """The settings whose behaviour changes with the switch, each named: an IPVS scheduler
    nlproxy has no equivalent for, the localhost NodePorts iptables mode serves, and
    NodePorts on every address where nlproxy (as kube-proxy's nftables mode) serves its
    primary address only.

    Args:
        doc: the KubeProxyConfiguration (empty: none given; the mode is then told from the
            leftovers on the node).
        cfg: what nlproxy makes of it (None: refused).
        found: kube-proxy's rules on the node.
        route_localnet: ``net.ipv4.conf.all.route_localnet`` (kube-proxy's iptables mode sets
            it to serve NodePorts on 127.0.0.1).
    """
    if doc:
        mode = str(doc.get("mode") or "iptables")  # kube-proxy's default on Linux
    elif found is not None and found.ipvs:
        mode = "ipvs"
    elif found is not None and any(t.mode == "iptables-nft" for t in found.tables):
        mode = "iptables"
    else:
        return [Finding("changes", Level.OK, "kube-proxy's mode is not known (no --config, no "
                        "rules): give --config to have its settings compared")]  # fmt: skip
    out: list[Finding] = []
    assumed = "" if doc else " (no --config: kube-proxy's default assumed)"
    if mode == "ipvs" and not doc:
        why = "IPVS mode, scheduler unknown: give --config; nlproxy chooses at random unless "
        out.append(Finding("changes", Level.WARN, why + "ipvs.scheduler is rr, sh or mh"))
    elif mode == "ipvs":
        out += _scheduler(doc, cfg)
    npa = doc.get("nodePortAddresses") or []
    if mode == "iptables" and _localhost_node_ports(doc, npa, route_localnet):
        out.append(
            Finding("changes", Level.WARN, "NodePorts on 127.0.0.1: kube-proxy's iptables mode "
                    "serves them (route_localnet), nlproxy serves none (as kube-proxy's nftables "
                    "mode); clients on the node must use the node's address")
        )  # fmt: skip
    if mode in ("iptables", "ipvs") and not npa:
        out.append(
            Finding("changes", Level.WARN, f"nodePortAddresses unset{assumed}: kube-proxy's "
                    f"{mode} mode serves NodePorts on every address of the node, nlproxy on "
                    "its primary addresses only (as kube-proxy's nftables mode); set "
                    "nodePortAddresses: [0.0.0.0/0, ::/0] to keep every address")
        )  # fmt: skip
    return out or [Finding("changes", Level.OK, f"no setting of {mode} mode changes behaviour")]


def _scheduler(doc: Mapping[str, Any], cfg: DaemonConfig | None) -> list[Finding]:
    from nlproxy.config.kubeproxy import IPVS_SCHEDULERS

    ipvs = doc.get("ipvs")
    given = ipvs.get("scheduler") if isinstance(ipvs, Mapping) else None
    scheduler = given or "rr"  # IPVS mode's default
    nlproxy = cfg.load_balancing if cfg is not None else "random"
    if scheduler in IPVS_SCHEDULERS and nlproxy == IPVS_SCHEDULERS[scheduler]:
        return [Finding("changes", Level.OK, f"ipvs.scheduler {scheduler}: nlproxy balances "
                        f"{nlproxy}, its equivalent")]  # fmt: skip
    if scheduler in IPVS_SCHEDULERS:
        why = (f"unset: IPVS's default is rr, nlproxy's {nlproxy}; set ipvs.scheduler: rr to "
               "keep round-robin")  # fmt: skip
    else:
        why = (f"{scheduler!r}: nlproxy has no equivalent (rr, sh and mh map to round-robin and "
               "consistent hashing): endpoints are chosen at random")  # fmt: skip
    return [Finding("changes", Level.WARN, f"ipvs.scheduler {why}")]


def _localhost_node_ports(doc: Mapping[str, Any], npa: Any, route_localnet: int | None) -> bool:
    if not doc:
        return route_localnet == 1
    section = doc.get("iptables")
    if isinstance(section, Mapping) and section.get("localhostNodePorts") is False:
        return False
    if not npa:
        return True
    for text in npa if isinstance(npa, list) else ():
        try:
            if ip_network(str(text), strict=False).overlaps(ip_network("127.0.0.0/8")):
                return True
        except ValueError:
            continue
    return False


KERNEL_FEATURES: tuple[tuple[str, str, tuple[int, int]], ...] = (
    ("CTA_FILTER", "conntrack deletions filtered in the kernel by tuple", (5, 8)),
    ("CTA_STATUS_MASK", "conntrack deletions filtered in the kernel by status", (5, 15)),
    ("NFT_TABLE_F_OWNER", "--owned-table", (5, 12)),
    ("NFT_TABLE_F_PERSIST", "--owned-table tables that outlive the daemon", (6, 9)),
    ("destroy", "destroy (delete if present) in batches", (6, 3)),
)
"""docs/support.md's kernel feature table: (identifier, what it gives, the Linux version that
added it). tests/unit/test_preflight_kernel.py holds the two equal."""


def kernel_version(release: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a release such as ``6.1.0-18-amd64``; None if it has no
    ``MAJOR.MINOR`` prefix."""
    head = release.split("-", 1)[0].split(".")
    if len(head) < 2 or not (head[0].isdigit() and head[1].isdigit()):
        return None
    return int(head[0]), int(head[1])


def kernel(release: str, nft_error: str | None) -> list[Finding]:
    if nft_error is not None:
        return [Finding("kernel", Level.FAIL, f"{release}: nftables does not answer: {nft_error}")]
    out = [Finding("kernel", Level.OK, f"{release}: nftables answers over netlink")]
    version = kernel_version(release)
    if version is None:
        out.append(
            Finding(
                "kernel",
                Level.WARN,
                f"release {release!r} has no MAJOR.MINOR version: its features were not "
                "compared with docs/support.md's table",
            )
        )
        return out
    lacking = [
        f"{what} ({ident}, Linux >= {major}.{minor})"
        for ident, what, (major, minor) in KERNEL_FEATURES
        if version < (major, minor)
    ]
    if lacking:
        out.append(
            Finding(
                "kernel",
                Level.WARN,
                f"Linux {version[0]}.{version[1]} lacks {len(lacking)} feature(s) of "
                f"docs/support.md's table: {'; '.join(lacking)}",
            )
        )
    return out


def clash(tables: Iterable[tuple[str, str]], chains: Iterable[str]) -> list[Finding]:
    """Other CNIs' tables and chains, told apart from another service proxy's.

    A CNI's filtering and routing rules (Cilium's ``CILIUM_*``, kube-router's ``KUBE-ROUTER-*``,
    Antrea's ``ANTREA-*`` chains and ``antrea`` table, Calico's ``cali-*``) live beside any
    service proxy and are fine; a chain only a CNI's service proxy makes is a clash.
    """
    cni: dict[str, set[str]] = {}
    proxy: dict[str, set[str]] = {}
    for family, table in tables:
        for key, name in CNI_TABLES.items():
            if key in table.lower():
                cni.setdefault(name, set()).add(f"table {family} {table}")
    for chain in chains:
        if chain in SERVICE_PROXY_CHAINS:
            proxy.setdefault(SERVICE_PROXY_CHAINS[chain], set()).add(f"chain {chain}")
            continue
        for prefix, name in CNI_CHAINS.items():
            if chain.startswith(prefix):
                cni.setdefault(name, set()).add(f"chain {chain}")
    out = [
        Finding("clash", Level.WARN, f"{name}'s service proxy ({_some(what)}): two service "
                "proxies on one node answer the same Services; turn it off first "
                f"({CNI_PROXY_SWITCH[name]})")
        for name, what in sorted(proxy.items())
    ]  # fmt: skip
    out += [
        Finding("clash", Level.OK, f"{name}'s CNI rules ({_some(what)}): not a service proxy; "
                f"keep {CNI_PROXY_SWITCH[name]}")
        for name, what in sorted(cni.items())
        if name not in proxy
    ]  # fmt: skip
    return out or [Finding("clash", Level.OK, "no other service proxy's tables")]


def _some(what: set[str]) -> str:
    return ", ".join(sorted(what)[:3]) + (", …" if len(what) > 3 else "")


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


def read_route_localnet(netns_name: str | None) -> int | None:
    with netns.entered(netns_name):
        try:
            return int(Path("/proc/sys/net/ipv4/conf/all/route_localnet").read_text())
        except (OSError, ValueError):
            return None


def read_config(path: Path) -> tuple[Mapping[str, Any], list[Finding], DaemonConfig | None]:
    """The file's document, its translation, and its configuration when it loads; the file
    read as ``run`` reads it (``config.read``: a regular file, bounded, one YAML document), so
    a file it refuses is its refusal, in its words."""
    try:
        doc, _ = read_document(path)
    except ConfigError as exc:
        return {}, [Finding("config", Level.FAIL, f"refused: {exc}")], None
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
    """Every check on this node (or in ``netns_name``), in the order they are shown. Each
    check ends in findings: one that cannot look (an unreadable file, a kernel that refuses)
    says so as a ``FAIL`` of its own, and the others still run.

    Args:
        config: the KubeProxyConfiguration file nlproxy would start with.
        kubeconfig: the kubeconfig nlproxy would use (default: the config's
            ``clientConnection.kubeconfig``, else in-cluster).
        api_server: the API server address nlproxy would be given (``run``'s ``--master``;
            default ``$NLPROXY_API_SERVER``).
        service_cidr: the cluster's service CIDRs, comma separated ("": kubeadm's default).
        netns_name: the network namespace to look in.

    Raises:
        ConfigError: ``service_cidr`` is not a list of CIDRs.
    """
    from nlproxy.conntrack.sysctl import ConntrackConfig
    from nlproxy.inspect.foreign import find, names

    cidrs = tuple(parse_networks(service_cidr, "--service-cidr")) or (KUBEADM_SERVICE_CIDR,)
    findings: list[Finding] = []
    doc: Mapping[str, Any] = {}
    cfg: DaemonConfig | None = DaemonConfig()
    if config:
        doc, translated, cfg = read_config(Path(config))
        findings += translated
    found = Leftovers()

    def read_leftovers() -> list[Finding]:
        nonlocal found
        found = find(netns_name)
        return leftovers(found, read_legacy_tables(netns_name))

    findings += checked("leftovers", read_leftovers)
    findings += checked(
        "api-server", lambda: api_server_findings(config, kubeconfig, api_server, netns_name, cidrs)
    )
    wanted = (cfg.conntrack if cfg is not None else ConntrackConfig()).wanted(os.cpu_count() or 1)
    findings += checked("conntrack", lambda: conntrack(wanted, read_sysctls(wanted, netns_name)))
    findings += checked("kernel", lambda: kernel(os.uname().release, _nft_error(netns_name)))
    findings += checked("clash", lambda: clash(*names(netns_name)))
    findings += checked("packages", packages)
    findings += checked(
        "changes",
        lambda: changes(doc, cfg, found=found, route_localnet=read_route_localnet(netns_name)),
    )
    return findings


def packages() -> Finding:
    """Whether the packages nlproxy imports only later (pyroute2, at its first rtnetlink dump:
    the inspector, ``nodePortAddresses`` CIDRs) import here: a broken install is found before
    the switch, not by the daemon's first dump."""
    try:
        import nlproxy.inspect.pyroute  # noqa: F401 - imported for the check alone
    except ConfigError as exc:
        return Finding(
            "packages", Level.FAIL, f"{exc}: the inspector and nodePortAddresses CIDRs would fail"
        )
    return Finding("packages", Level.OK, "pyroute2 imports")


def _nft_error(netns_name: str | None) -> str | None:
    from nlproxy.netlink.nlsock import NetfilterSocket
    from nlproxy.nft.dump import generation

    try:
        with NetfilterSocket(netns_name, bufsize=1 << 20) as sock:
            generation(sock)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None
