"""``nlproxy preflight``: on a kube-proxy node, before switching, everything that would bite.

Thin wiring over :mod:`nlproxy.operate.preflight`: gathers the node's facts (kube-proxy's
leftovers of every mode, the API server nlproxy would use, the conntrack sysctls, the
KubeProxyConfiguration, nftables, other proxies' tables) and prints one screen, or ``--json``.
Exit status 0 when nothing would break traffic, 1 when something would (a ``FAIL`` line says
what), 2 for a bad flag. A file that cannot be read or used is a finding, not an exit: every
check ends in one. Read only: nothing on the node is changed.
"""

from __future__ import annotations

import argparse
import json

from nlproxy.operate.text import printable_lines

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
    from nlproxy.operate import preflight as pf

    findings = pf.preflight(
        config=args.config,
        kubeconfig=args.kubeconfig,
        api_server=args.api_server,
        service_cidr=args.service_cidr,
        netns_name=args.netns,
    )
    if args.json:
        rows = [{"check": f.check, "level": f.level.value, "text": f.text} for f in findings]
        print(json.dumps({"findings": rows, "breaks_traffic": pf.failed(findings)}, indent=2))
    else:
        print(printable_lines(pf.render(findings)))
    return 1 if pf.failed(findings) else 0
