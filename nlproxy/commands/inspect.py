"""``nlproxy inspect``: is every endpoint nlproxy DNATs to reachable from this node?

Thin wiring over :func:`nlproxy.operate.inspect.endpoint_report`. Exit status 0 when all are
reachable, 4 when some are not, 2 for a bad or unknown ``--service``. Read only: it never changes
the ruleset or routes.
"""

from __future__ import annotations

import argparse
import json
import sys

from nlproxy.errors import ConfigError
from nlproxy.operate.inspect import endpoint_report, render_table
from nlproxy.operate.status import DEFAULT_METRICS, METRICS_PORT, parse_port
from nlproxy.operate.text import printable, printable_lines

NAME = "inspect"
HELP = "check that every programmed endpoint is reachable from this node (exit 4 if not)"
EXIT_UNREACHABLE = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--service", metavar="NS/NAME", help="only this service")
    parser.add_argument("--json", action="store_true", help="print a JSON list")
    parser.add_argument(
        "--metrics-address",
        default=DEFAULT_METRICS,
        metavar="HOST:PORT",
        help=f"the daemon's --metrics-bind-address, asked which proxy's tables it runs beside "
        f"as a canary: those are not warned about (default {DEFAULT_METRICS}; an address alone "
        f"means port {METRICS_PORT})",
    )


def run(args: argparse.Namespace) -> int:
    service: str | None = args.service
    if service is not None and (service.count("/") != 1 or ":" in service):
        raise ConfigError("--service", f"{service!r} is not NAMESPACE/NAME")
    metrics = parse_port("--metrics-address", args.metrics_address, METRICS_PORT)
    report = endpoint_report(args.netns, service, metrics=metrics)
    for problem in report.warnings:  # stderr: the JSON on stdout stays a list
        print(f"warning: {printable(problem)}", file=sys.stderr)
    if args.json:
        print(json.dumps([row.as_json() for row in report.rows], indent=2))
    else:
        print(
            printable_lines(render_table(report.endpoints, report.rows))
            or "no programmed service ports"
        )
    return 0 if report.reachable else EXIT_UNREACHABLE
