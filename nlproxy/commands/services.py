"""``nlproxy services``: one table of every service port's frontends and backends on this node.

Thin wiring over :mod:`nlproxy.operate.services`: reads what is programmed (tables ``ip``/``ip6
nlproxy``, read back from the kernel and decoded by ``operate.programmed.kernel_frontends`` through
``proxy/layout.py``, the one copy of the ruleset read backwards), classifies each backend with
the inspector, and with ``--manifests DIR`` takes backend conditions and traffic policies from
the Services and EndpointSlices there. Exit status 0, 2 for a bad or unknown ``--service``.
Read only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nlproxy.operate.text import printable_lines

NAME = "services"
HELP = "list every service frontend with its backends, their state and the policies"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--service", metavar="NS/NAME", help="only this Service")
    parser.add_argument(
        "--manifests",
        type=Path,
        metavar="DIR",
        help="take backend conditions (ready/serving/terminating) and traffic policies from the "
        "Services and EndpointSlices in DIR: the kernel's maps only tell which backends are in "
        "use, not why",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list, one per frontend")
    parser.epilog = (
        "Without --manifests a backend's state is 'in use' (ready, or serving while "
        "terminating when no backend is ready: the kernel cannot tell), and an internal "
        "traffic policy is known only when it drops ('?' otherwise). Local/remote and "
        "reachable come from this node's routes, as in `nlproxy inspect`."
    )


def run(args: argparse.Namespace) -> int:
    from nlproxy.operate.services import render_table, row_json, services

    rows = services(args.service, netns=args.netns, manifests=args.manifests)
    if args.json:
        print(json.dumps([row_json(r) for r in rows], indent=2))
    elif not rows:
        print("nlproxy has programmed no service here")
    else:
        print(printable_lines(render_table(rows)))
    return 0
