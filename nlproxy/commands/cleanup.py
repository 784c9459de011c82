"""``nlproxy cleanup``: remove nlproxy's tables (``ip nlproxy``, ``ip6 nlproxy``); idempotent.

Thin wiring over :mod:`nlproxy.operate.cleanup`. Touches no other table. ``--kube-proxy``
instead removes what every kube-proxy mode leaves, as kube-proxy's own ``--cleanup`` would;
nlproxy's tables are left alone then.
"""

from __future__ import annotations

import argparse

from nlproxy.operate.text import printable

NAME = "cleanup"
HELP = "remove nlproxy's nftables tables, or with --kube-proxy kube-proxy's rules (idempotent)"
LOGS = False
"""It reports by printing; logging is set up only if something on its path logs after all."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kube-proxy",
        action="store_true",
        help="remove kube-proxy's rules instead (ip/ip6 kube-proxy tables; its KUBE-* chains in "
        "the iptables-nft nat, filter and mangle tables; IPVS mode's ipsets, kube-ipvs0 device "
        "and virtual servers), leaving nlproxy's and the kubelet's",
    )


def run(args: argparse.Namespace) -> int:
    from nlproxy.operate.cleanup import remove_kube_proxy, remove_tables

    if getattr(args, "kube_proxy", False):
        found = remove_kube_proxy(args.netns)
        for line in found:
            print(f"removed: {printable(line)}")
        if not found:
            print("no kube-proxy rules found")
        return 0
    removed = remove_tables(args.netns)
    print(f"removed: {printable(', '.join(removed))}" if removed else "nothing to remove")
    return 0
