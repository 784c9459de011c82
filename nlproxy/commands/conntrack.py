"""``nlproxy conntrack list|flush``: show or delete conntrack flows, selected by filters.

Thin wiring over :mod:`nlproxy.conntrack.kernel`. ``--service`` and ``--all-stale`` are resolved
from
what nlproxy programmed in the kernel (its ``ip``/``ip6 nlproxy`` tables, read back), never from
the Kubernetes API. ``flush`` refuses to run without a filter. ``list`` prints each flow as
``conntrack -L -o extended`` does (family, protocol, timeout, TCP/SCTP state, both tuples,
``[UNREPLIED]``/``[ASSURED]``, mark, zone, use count), or JSON with the same fields.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from ipaddress import ip_address
from typing import Any

from nlproxy.conntrack.kernel import (
    MAX_PASSES,
    Backend,
    Conntrack,
    ConntrackError,
    Flow,
    Frontend,
    Programmed,
    programmed_frontends,
)
from nlproxy.conntrack.messages import IPS_DST_NAT, FlowFilter, IPAddress, conntrack_line
from nlproxy.errors import ConfigError

NAME = "conntrack"
HELP = "list or delete conntrack flows (stale ones included)"
LOGS = False
"""Nothing here logs (errors end the command as one line), so logging is left unloaded."""
EXIT_USAGE = 2
TABLE = "nlproxy"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["list", "flush"], help="show or delete the flows")
    parser.add_argument("--dst", type=ip_address, help="original destination address")
    parser.add_argument("--dport", type=int, help="original destination port")
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


def run(args: argparse.Namespace) -> int:
    try:
        base = FlowFilter(
            proto=args.proto, orig_dst=args.dst, orig_dport=args.dport, reply_src=args.endpoint
        )
    except ValueError as exc:
        raise ConfigError("conntrack filter", str(exc)) from exc
    if args.action == "flush" and base.is_empty and not (args.service or args.all_stale):
        print(
            "nlproxy: conntrack flush needs a filter (--dst, --dport, --proto, --endpoint, "
            "--service or --all-stale); refusing to delete every flow",
            file=sys.stderr,
        )
        return EXIT_USAGE
    ct = Conntrack(args.netns)
    if args.action == "list" and not (args.json or args.service or args.all_stale):
        return _print_lines(ct.lines(base))
    flows = _selected(ct, base, args)
    if args.action == "list":
        return _print_list(flows, as_json=args.json)
    counted = _Counted(flows)
    deleted = ct.delete_flows(counted)
    if args.json:
        print(json.dumps({"matched": counted.count, "deleted": deleted}))
    else:
        print(f"{counted.count} flows matched, {deleted} deleted")
    return 0


class _Counted:
    """Passes flows through, counting them."""

    def __init__(self, flows: Iterable[Flow]) -> None:
        self.flows = flows
        self.count = 0

    def __iter__(self) -> Iterator[Flow]:
        for flow in self.flows:
            self.count += 1
            yield flow


def _print_lines(batches: Iterable[list[str]]) -> int:
    """As :func:`_print_list` prints flows, a batch of lines per write (100k ``print`` calls
    were a tenth of the command's time)."""
    count = 0
    for lines in batches:
        if lines:
            count += len(lines)
            sys.stdout.write("\n".join(lines) + "\n")
    print(f"{count} flows matched")
    return 0


def _print_list(flows: Iterable[Flow], *, as_json: bool) -> int:
    count = 0
    listed: list[dict[str, Any]] = []
    for flow in flows:
        count += 1
        if as_json:
            listed.append(flow.as_dict())
        else:
            print(conntrack_line(flow))
    if as_json:
        print(json.dumps({"matched": count, "flows": listed}))
    else:
        print(f"{count} flows matched")
    return 0


def _selected(ct: Conntrack, base: FlowFilter, args: argparse.Namespace) -> Iterator[Flow]:
    if not (args.service or args.all_stale):
        return ct.list(base)
    programmed = load_programmed(args.netns)
    frontends = programmed.frontends_of(args.service) if args.service else list(programmed)
    if args.service and not frontends:
        raise ConfigError(f"service {args.service}", "nlproxy programmed no frontend for it")
    if args.all_stale and args.proto is None:
        frontends = [fe for fe in frontends if fe.proto != "tcp"]
    nodeports = any(fe.addr is None for fe in frontends)
    node_addrs = node_addresses(args.netns) if nodeports else []
    return _flows_of(ct, base, frontends, programmed, node_addrs, stale=args.all_stale)


def _flows_of(
    ct: Conntrack,
    base: FlowFilter,
    frontends: Sequence[Frontend],
    programmed: Programmed,
    node_addrs: Sequence[IPAddress],
    *,
    stale: bool,
) -> Iterator[Flow]:
    """Flows selected by ``base`` sent to one of ``frontends`` (stale ones only if ``stale``)."""
    index: dict[tuple[str, IPAddress, int], Frontend] = {}
    for fe in frontends:
        for dst in [fe.addr] if fe.addr is not None else node_addrs:
            index.setdefault((fe.proto, dst, fe.port), fe)
    # Past MAX_PASSES frontends, one pass matched here is cheaper: a kernel pass costs about as
    # much as a whole-table one.
    few = len(index) <= MAX_PASSES
    kernel_filters = [_narrow(base, key) for key in index] if few else [base]
    for flt in kernel_filters:
        if flt is None:
            continue
        for flow in ct.list(flt):
            hit = index.get((flow.proto, flow.orig.dst, flow.orig.dport))
            if hit is not None and (not stale or is_stale(flow, programmed[hit])):
                yield flow


def _narrow(base: FlowFilter, key: tuple[str, IPAddress, int]) -> FlowFilter | None:
    """``base`` restricted to one frontend destination, or None where they contradict."""
    proto, dst, port = key
    if (
        base.proto not in (None, proto)
        or base.orig_dst not in (None, dst)
        or base.orig_dport not in (None, port)
        or base.family not in (None, dst.version)
    ):
        return None
    return replace(base, proto=proto, orig_dst=dst, orig_dport=port, family=dst.version)


def is_stale(flow: Flow, backends: frozenset[Backend]) -> bool:
    """A flow to a frontend is stale when its backend is gone, or when it was never DNAT'd
    (UDP sent while there were no backends) and there are backends now."""
    if flow.status & IPS_DST_NAT:
        return Backend(flow.reply.src, flow.reply.sport) not in backends
    return flow.proto == "udp" and bool(backends)


def load_programmed(netns: str | None) -> Programmed:
    """Frontends and backends from nlproxy's tables in ``netns``, as read back from the kernel.

    Raises:
        ConntrackError: neither ``ip nlproxy`` nor ``ip6 nlproxy`` exists.
    """
    from nlproxy.nft.ir import Family
    from nlproxy.nft.readback import read_ruleset

    rulesets = [
        rs
        for family in (Family.IP, Family.IP6)
        if (rs := read_ruleset(family, TABLE, netns=netns)) is not None
    ]
    if not rulesets:
        raise ConntrackError(f"table ip/ip6 {TABLE}", "not found: nlproxy has programmed nothing")
    return programmed_frontends(rulesets)


def node_addresses(netns: str | None) -> list[IPAddress]:
    """This node's addresses (NodePort destinations), IPv6 link-local ones left out."""
    from nlproxy.inspect.rtnl import interface_addresses

    return [a for a in interface_addresses(netns) if not a.is_link_local]
