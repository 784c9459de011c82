"""``nlproxy conntrack list|flush``: show or delete conntrack flows, selected by filters.

Argument parsing only; the selection, printing and deletion are
:mod:`nlproxy.operate.conntrack`'s. ``flush`` refuses to run without a filter.
"""

from __future__ import annotations

import argparse
import sys
from ipaddress import ip_address

from nlproxy.operate.conntrack import FlowQuery, flush_flows, list_flows

NAME = "conntrack"
HELP = "list or delete conntrack flows (stale ones included)"
LOGS = False
"""Nothing here logs (errors end the command as one line), so logging is left unloaded."""
EXIT_USAGE = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["list", "flush"], help="show or delete the flows")
    parser.add_argument("--dst", type=ip_address, help="original destination address")
    parser.add_argument("--dport", type=_port, help="original destination port (1-65535)")
    parser.add_argument("--proto", choices=["tcp", "udp", "sctp"], help="layer-4 protocol")
    parser.add_argument("--endpoint", type=ip_address, help="reply source: the backend")
    parser.add_argument(
        "--service",
        metavar="NS/NAME",
        help="flows to this service's addresses and node ports (NS/NAME or NS/NAME:PORT/PROTO)",
    )
    parser.add_argument(
        "--all-stale",
        action="store_true",
        help="flows to a programmed frontend answered by a backend it no longer has, and "
        "un-NATed UDP flows to a frontend that has backends now (UDP and SCTP unless --proto)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON")


def _port(text: str) -> int:
    """A destination port as ``--dport`` takes it: 1..65535 (no flow has port 0 as its
    destination, and the kernel's filter would silently match nothing past 65535)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not in 1..65535")
    return port


def run(args: argparse.Namespace) -> int:
    query = FlowQuery(
        proto=args.proto,
        dst=args.dst,
        dport=args.dport,
        endpoint=args.endpoint,
        service=args.service,
        all_stale=args.all_stale,
    )
    if args.action == "list":
        list_flows(query, args.netns, sys.stdout, as_json=args.json)
        return 0
    if query.selects_every_flow():
        print(
            "nlproxy: conntrack flush needs a filter (--dst, --dport, --proto, --endpoint, "
            "--service or --all-stale); refusing to delete every flow",
            file=sys.stderr,
        )
        return EXIT_USAGE
    flush_flows(query, args.netns, sys.stdout, as_json=args.json)
    return 0
