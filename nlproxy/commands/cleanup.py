"""``nlproxy cleanup``: remove nlproxy's tables (``ip nlproxy``, ``ip6 nlproxy``); idempotent.

Touches no other table.
"""

from __future__ import annotations

import argparse

NAME = "cleanup"
HELP = "remove nlproxy's nftables tables (idempotent)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # no options


def run(args: argparse.Namespace) -> int:
    from nlproxy.nft.backend import NftBackend
    from nlproxy.nft.ir import Operation, Table, Verb
    from nlproxy.nft.readback import read_ruleset
    from nlproxy.sync import FAMILIES, TABLE_NAME

    removed = []
    for family in FAMILIES:
        current = read_ruleset(family, TABLE_NAME, netns=args.netns)
        if current is None:
            continue
        table = Table(family=family, name=TABLE_NAME)
        backend = NftBackend(table, netns=args.netns)
        try:
            backend.apply([Operation(Verb.DELETE, table)])
        finally:
            backend.close()
        removed.append(f"{family} {TABLE_NAME}")
    print(f"removed: {', '.join(removed)}" if removed else "nothing to remove")
    return 0
