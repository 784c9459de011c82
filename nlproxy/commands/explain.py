"""``nlproxy explain NS/NAME``: why does my Service not work? One report, read only.

Thin wiring over :func:`nlproxy.operate.explain.explain` and
:mod:`nlproxy.operate.explain_render`. Exit status 0 when the Service is reachable through every
frontend (from ``--from`` when given), 4 when a frontend is not programmed, rejects or drops, an
endpoint is unreachable, or another proxy's rules are on the node (unless the daemon at
``--metrics-address`` says it runs beside them as a canary), 2 for usage errors (a bad
``NS/NAME``, ``--from`` or ``--port``, an unknown Service).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nlproxy.operate.status import DEFAULT_METRICS, METRICS_PORT, parse_port
from nlproxy.operate.text import printable_lines

NAME = "explain"
HELP = "explain one Service: objects, programmed rules, flows, endpoints, and a trace (--from)"
LOGS = False
"""It reports by printing; logging is set up only if something on its path logs after all."""
EXIT_UNREACHABLE = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("service", metavar="NS/NAME", help="the Service")
    parser.add_argument("--port", metavar="P", help="only this port (name or number)")
    parser.add_argument(
        "--from", dest="src", metavar="IP", help="trace a new connection from this address"
    )
    parser.add_argument(
        "--manifests", type=Path, metavar="DIR", help="the Service and slices as in DIR"
    )
    parser.add_argument(
        "--metrics-address",
        default=DEFAULT_METRICS,
        metavar="HOST:PORT",
        help=f"the daemon's --metrics-bind-address, asked how long the Service's last change "
        f"took to program and which proxy's tables it runs beside as a canary (default "
        f"{DEFAULT_METRICS}; an address alone means port {METRICS_PORT})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from nlproxy.operate.explain import explain
    from nlproxy.operate.explain_render import render_text, report_to_json

    metrics = parse_port("--metrics-address", args.metrics_address, METRICS_PORT)
    report = explain(
        args.service,
        netns=args.netns,
        port=args.port,
        src=args.src,
        manifests=args.manifests,
        metrics=metrics,
    )
    if args.json:
        print(json.dumps(report_to_json(report), indent=2))
    else:
        print(printable_lines(render_text(report)), end="")
    return EXIT_UNREACHABLE if report.problems else 0
