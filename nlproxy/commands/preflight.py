"""``nlproxy preflight``: on a kube-proxy node, before switching, everything that would bite.

Thin wiring over :mod:`nlproxy.operate.preflight`: gathers the node's facts (kube-proxy's
leftovers of every mode, the API server nlproxy would use, the conntrack sysctls, the
KubeProxyConfiguration, nftables, other proxies' tables) and prints one screen, or ``--json``.
Exit status 0 when nothing would break traffic, 1 when something would (a ``FAIL`` line says
what), 2 for a bad flag or file. Read only: nothing on the node is changed.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the command's modules load only when it runs
    from nlproxy.config import DaemonConfig
    from nlproxy.nft.ir import IPNetwork
    from nlproxy.operate.preflight import Finding

NAME = "preflight"
HELP = "before switching a kube-proxy node: what would break or change (exit 1 if it would break)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", metavar="FILE", help="the KubeProxyConfiguration nlproxy would start with"
    )
    parser.add_argument(
        "--kubeconfig", metavar="FILE", help="the kubeconfig nlproxy would use (default: the "
        "config's clientConnection.kubeconfig, else in-cluster)",
    )  # fmt: skip
    parser.add_argument(
        "--api-server", metavar="URL", help="the API server address nlproxy would be given"
    )
    parser.add_argument(
        "--service-cidr",
        metavar="CIDRS",
        default="",
        help="the cluster's service CIDRs, comma separated (default kubeadm's 10.96.0.0/12)",
    )
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")


def run(args: argparse.Namespace) -> int:
    from nlproxy.config import DaemonConfig, _networks
    from nlproxy.conntrack.sysctl import ConntrackConfig
    from nlproxy.inspect.foreign import find, names
    from nlproxy.operate import preflight as pf

    cidrs = tuple(_networks(args.service_cidr, "--service-cidr")) or (pf.KUBEADM_SERVICE_CIDR,)
    findings: list[pf.Finding] = []
    cfg: DaemonConfig | None = DaemonConfig()
    if args.config:
        _, translated, cfg = pf.read_config(Path(args.config))
        findings += translated
    findings += pf.leftovers(find(args.netns), pf.read_legacy_tables(args.netns))
    findings.append(_api_server(args, cfg, cidrs))
    wanted = (cfg.conntrack if cfg is not None else ConntrackConfig()).wanted(os.cpu_count() or 1)
    findings += pf.conntrack(wanted, pf.read_sysctls(wanted, args.netns))
    findings += pf.kernel(os.uname().release, _nft_error(args.netns))
    tables, chains = names(args.netns)
    findings += pf.clash(tables, chains)
    if args.json:
        rows = [{"check": f.check, "level": f.level.value, "text": f.text} for f in findings]
        print(json.dumps({"findings": rows, "breaks_traffic": pf.failed(findings)}, indent=2))
    else:
        print(pf.render(findings))
    return 1 if pf.failed(findings) else 0


def _api_server(
    args: argparse.Namespace, cfg: DaemonConfig | None, cidrs: Sequence[IPNetwork]
) -> Finding:
    from nlproxy.operate import preflight as pf

    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    kubeconfig = args.kubeconfig or (cfg.kubeconfig if cfg is not None else None)
    if args.api_server:
        server, source = args.api_server, "--api-server"
    elif kubeconfig:
        server, source = pf.kubeconfig_server(kubeconfig), f"kubeconfig {kubeconfig}:"
    elif host:
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        server, source = f"https://{host}:{port}", "in-cluster"
    else:
        server, source = None, ""
    reach = pf.try_connect(server, args.netns) if server else None
    return pf.api_server(server, source, cidrs, in_cluster_host=host, reachable=reach)


def _nft_error(netns_name: str | None) -> str | None:
    from nlproxy.netlink.nlsock import NetfilterSocket
    from nlproxy.nft.dump import generation

    try:
        with NetfilterSocket(netns_name, bufsize=1 << 20) as sock:
            generation(sock)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None
