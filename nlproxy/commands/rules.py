"""``nlproxy rules``: what nlproxy has programmed in the kernel, as nft-like text or JSON.

Reads the kernel (not a cache), so it shows the truth on any node, also without API access;
the elements of the counting sets (``--service-counters``) show their packet and byte counts,
as nft prints them.
``--service NS/NAME`` narrows the output to that Service's map elements.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from nlproxy.operate.text import printable_lines

if TYPE_CHECKING:
    from nlproxy.nft.counters import Counts
    from nlproxy.nft.ir import Ruleset

NAME = "rules"
HELP = "print what nlproxy has programmed (nft-like text, or --json)"
LOGS = False
"""Nothing here logs (errors end the command as one line), so logging is left unloaded."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--family", choices=["ip", "ip6"], help="only this family")


def run(args: argparse.Namespace) -> int:
    from nlproxy.nft.ir import Family
    from nlproxy.nft.readback import read_ruleset
    from nlproxy.nft.render import render_ruleset, ruleset_to_json
    from nlproxy.proxy.naming import TABLE

    # Both families named here: the syncer's own list would load the planner and logging.
    families = [Family(args.family)] if args.family else [Family.IP, Family.IP6]
    found = [rs for f in families if (rs := read_ruleset(f, TABLE, netns=args.netns))]
    if args.json:
        print(json.dumps([ruleset_to_json(rs) for rs in found], indent=2, sort_keys=True))
    elif not found:
        print("# nlproxy has programmed nothing here")
    else:
        print(
            printable_lines(
                "\n".join(render_ruleset(rs, _counters(rs, args.netns)) for rs in found)
            ),
            end="",
        )
    return 0


def _counters(rs: Ruleset, netns: str | None) -> dict[str, Counts]:
    """The values of the per-element counters of ``rs``'s counting sets (``--service-counters``)."""
    from nlproxy.nft.counters import read_counters
    from nlproxy.nft.ir import Set

    sets = {name: s.key for name, s in rs.sets.items() if isinstance(s, Set) and s.counter}
    if not sets:
        return {}
    return read_counters(rs.table.family, rs.table.name, sets, netns=netns)
