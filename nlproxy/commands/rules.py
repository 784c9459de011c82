"""``nlproxy rules``: what nlproxy has programmed in the kernel, as nft-like text or JSON.

Thin wiring over :mod:`nlproxy.operate.rules`, which reads the kernel (not a cache).
``--family`` narrows it to one family.
"""

from __future__ import annotations

import argparse
import json

from nlproxy.operate.text import printable_lines

NAME = "rules"
HELP = "print what nlproxy has programmed (nft-like text, or --json)"
LOGS = False
"""Nothing here logs (errors end the command as one line), so logging is left unloaded."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--family", choices=["ip", "ip6"], help="only this family")


def run(args: argparse.Namespace) -> int:
    from nlproxy.nft.ir import FAMILIES, Family
    from nlproxy.operate.rules import programmed, render_text, to_json

    found = programmed([Family(args.family)] if args.family else FAMILIES, args.netns)
    if args.json:
        print(json.dumps(to_json(found), indent=2, sort_keys=True))
    else:
        print(printable_lines(render_text(found, args.netns)), end="")
    return 0
