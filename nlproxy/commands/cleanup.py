"""``nlproxy cleanup``: remove nlproxy's tables (``ip nlproxy``, ``ip6 nlproxy``); idempotent.

Touches no other table. ``--kube-proxy`` instead removes what every kube-proxy mode leaves
(its nftables tables; its chains in the iptables-nft tables; IPVS mode's ipsets, ``kube-ipvs0``
device and virtual servers: ``foreign.py``, ``ipvs.py``), as kube-proxy's own ``--cleanup``
would, over netlink and by exact name; nlproxy's tables are left alone then.
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
    if getattr(args, "kube_proxy", False):
        return _kube_proxy(args)
    from nlproxy.nft.backend import NftBackend
    from nlproxy.nft.ir import Family, Operation, Table, Verb
    from nlproxy.nft.readback import read_ruleset
    from nlproxy.proxy.naming import TABLE

    removed = []
    for family in (Family.IP, Family.IP6):  # not the syncer's list: that loads the planner
        current = read_ruleset(family, TABLE, netns=args.netns)
        if current is None:
            continue
        table = Table(family=family, name=TABLE)
        backend = NftBackend(table, netns=args.netns)
        try:
            backend.apply([Operation(Verb.DELETE, table)])
        finally:
            backend.close()
        removed.append(f"{family} {TABLE}")
    print(f"removed: {printable(', '.join(removed))}" if removed else "nothing to remove")
    return 0


def _kube_proxy(args: argparse.Namespace) -> int:
    from nlproxy.inspect.foreign import find, remove_all

    found = find(args.netns)
    if not found:
        print("no kube-proxy rules found")
        return 0
    remove_all(found, args.netns)
    for line in found.describe():
        print(f"removed: {printable(line)}")
    return 0
