"""``nlproxy status``: is the daemon on this node up and ready, and how is it doing?

Thin wiring over :mod:`nlproxy.operate.status` (the client) and
:mod:`nlproxy.operate.status_render`: asks the daemon's health port (``/healthz``) and metrics
port (``/metrics``), prints one line per fact or ``--json``. Exit status 0 when the daemon is
up and ready and both ports answered, 1 otherwise (the last line says which port and why), 2 for
a bad flag or a network namespace that does not exist. Read only.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime

from nlproxy.operate.status import (
    DEFAULT_HEALTHZ,
    DEFAULT_METRICS,
    HEALTHZ_PORT,
    METRICS_PORT,
    parse_port,
    query,
)
from nlproxy.operate.status_render import render_text, to_json
from nlproxy.operate.text import printable_lines

NAME = "status"
HELP = "ask the running daemon: up, ready, last sync, pending changes, problems (exit 1 if not ok)"
LOGS = False
"""It reports by printing; logging is set up only if something on its path logs after all."""
EXIT_NOT_OK = 1
MAX_TIMEOUT = 3600.0


def _seconds(text: str) -> float:
    """A positive, finite number of seconds: -1, nan and inf reached the socket layer and
    ended as internal errors."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= MAX_TIMEOUT:  # also false for nan
        raise argparse.ArgumentTypeError(f"{text!r} is not in (0, {MAX_TIMEOUT:.0f}] seconds")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-address",
        default=DEFAULT_METRICS,
        metavar="HOST:PORT",
        help=f"the daemon's --metrics-bind-address (default {DEFAULT_METRICS}; an address "
        f"alone means port {METRICS_PORT})",
    )
    parser.add_argument(
        "--healthz-address",
        default=DEFAULT_HEALTHZ,
        metavar="HOST:PORT",
        help=f"the daemon's --healthz-bind-address (default {DEFAULT_HEALTHZ}; an address "
        f"alone means port {HEALTHZ_PORT}; a wildcard address is dialled on loopback)",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=5.0,
        metavar="SECONDS",
        help=f"per request (default 5, at most {MAX_TIMEOUT:.0f})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.epilog = (
        "With --netns, the ports are dialled inside that namespace (a daemon started there "
        "with `ip netns exec`; `nlproxy --netns NS run` serves its ports where it was started)."
    )


def run(args: argparse.Namespace) -> int:
    metrics = parse_port("--metrics-address", args.metrics_address, METRICS_PORT)
    healthz = parse_port("--healthz-address", args.healthz_address, HEALTHZ_PORT)
    st = query(metrics, healthz, netns=args.netns, timeout=args.timeout)
    if args.json:
        print(json.dumps(to_json(st), indent=2))
    else:
        print(printable_lines(render_text(st, datetime.now(UTC))))
    return 0 if st.ok else EXIT_NOT_OK
