"""The operator's view of the conntrack table: ``nlproxy conntrack list|flush``.

Selects flows by a :class:`FlowQuery` (address, port and protocol filters, a Service, or every
stale flow) and prints or deletes them. ``--service`` and ``--all-stale`` are resolved from what
nlproxy programmed in the kernel (its ``ip``/``ip6`` tables, read back), never from the
Kubernetes API. A listing prints each flow as ``conntrack -L -o extended`` does (family,
protocol, timeout, TCP/SCTP state, both tuples, ``[UNREPLIED]``/``[ASSURED]``, mark, zone, use
count), or JSON with the same fields.

Uses the sync's own conntrack machinery (``conntrack/kernel``, ``conntrack/plan``); it parses
no command line (``commands/conntrack.py`` does).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TextIO

from nlproxy.conntrack.kernel import MAX_PASSES, Conntrack, ConntrackError, Flow
from nlproxy.conntrack.messages import IPS_DST_NAT, FlowFilter, IPAddress, conntrack_line
from nlproxy.errors import ConfigError

if TYPE_CHECKING:  # the layout reader is loaded only where nlproxy's tables are read back
    from nlproxy.proxy.layout import Backend, Frontend, Programmed


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowQuery:
    """Which flows to list or delete; every filter given must match.

    Attributes:
        proto: layer-4 protocol (``tcp``, ``udp``, ``sctp``).
        dst: original destination address.
        dport: original destination port.
        endpoint: reply source address: the backend.
        service: ``NS/NAME`` or ``NS/NAME:PORT/PROTO``: flows to its programmed frontends.
        all_stale: flows to a programmed frontend answered by a backend it no longer has, and
            un-NATed UDP flows to a frontend that has backends now (UDP and SCTP unless
            ``proto``).
    """

    proto: str | None = None
    dst: IPAddress | None = None
    dport: int | None = None
    endpoint: IPAddress | None = None
    service: str | None = None
    all_stale: bool = False

    def base(self) -> FlowFilter:
        """The address, port and protocol filters as one kernel filter.

        Raises:
            ConfigError: the filters contradict each other (an IPv4 and an IPv6 address).
        """
        try:
            return FlowFilter(
                proto=self.proto, orig_dst=self.dst, orig_dport=self.dport,
                reply_src=self.endpoint,
            )  # fmt: skip
        except ValueError as exc:
            raise ConfigError("conntrack filter", str(exc)) from exc

    def selects_every_flow(self) -> bool:
        """No filter at all (``flush`` refuses that).

        Raises:
            ConfigError: as :meth:`base`.
        """
        return self.base().is_empty and not (self.service or self.all_stale)


def list_flows(query: FlowQuery, netns: str | None, out: TextIO, *, as_json: bool = False) -> None:
    """Print the flows ``query`` selects, then how many matched.

    Raises:
        ConfigError: a bad filter, or a Service nlproxy programmed no frontend for.
        ConntrackError: the kernel refused the dump, or nlproxy programmed nothing.
    """
    ct = Conntrack(netns)
    if not (as_json or query.service or query.all_stale):
        _print_lines(ct.lines(query.base()), out)
        return
    _print_list(selected(ct, query, netns), out, as_json=as_json)


def flush_flows(query: FlowQuery, netns: str | None, out: TextIO, *, as_json: bool = False) -> None:
    """Delete the flows ``query`` selects and print how many matched and went.

    Raises:
        ConfigError, ConntrackError: as :func:`list_flows`.
    """
    ct = Conntrack(netns)
    counted = _Counted(selected(ct, query, netns))
    deleted = ct.delete_flows(counted)
    if as_json:
        import json  # loaded only for --json

        print(json.dumps({"matched": counted.count, "deleted": deleted}), file=out)
    else:
        print(f"{counted.count} flows matched, {deleted} deleted", file=out)


class _Counted:
    """Passes flows through, counting them."""

    def __init__(self, flows: Iterable[Flow]) -> None:
        self.flows = flows
        self.count = 0

    def __iter__(self) -> Iterator[Flow]:
        for flow in self.flows:
            self.count += 1
            yield flow


def _print_lines(batches: Iterable[list[str]], out: TextIO) -> None:
    """As :func:`_print_list` prints flows, a batch of lines per write (100k ``print`` calls
    were a tenth of the command's time)."""
    count = 0
    for lines in batches:
        if lines:
            count += len(lines)
            out.write("\n".join(lines) + "\n")
    print(f"{count} flows matched", file=out)


def _print_list(flows: Iterable[Flow], out: TextIO, *, as_json: bool) -> None:
    count = 0
    listed: list[dict[str, Any]] = []
    for flow in flows:
        count += 1
        if as_json:
            listed.append(flow.as_dict())
        else:
            print(conntrack_line(flow), file=out)
    if as_json:
        import json  # loaded only for --json

        print(json.dumps({"matched": count, "flows": listed}), file=out)
    else:
        print(f"{count} flows matched", file=out)


def selected(ct: Conntrack, query: FlowQuery, netns: str | None) -> Iterator[Flow]:
    """The flows of ``ct`` that ``query`` selects.

    Raises:
        ConfigError: a bad filter, or a Service nlproxy programmed no frontend for.
        ConntrackError: nlproxy programmed nothing (with ``service`` or ``all_stale``).
    """
    base = query.base()
    if not (query.service or query.all_stale):
        return ct.list(base)
    programmed = load_programmed(netns)
    frontends = programmed.frontends_of(query.service) if query.service else list(programmed)
    if query.service and not frontends:
        raise ConfigError(f"service {query.service}", "nlproxy programmed no frontend for it")
    if query.all_stale and query.proto is None:
        frontends = [fe for fe in frontends if fe.proto != "tcp"]
    node_addrs: list[IPAddress] = []
    if any(fe.addr is None for fe in frontends):  # node ports: every node address but IPv6
        from nlproxy.inspect.rtnl import interface_addresses  # link-local ones

        node_addrs = [a for a in interface_addresses(netns) if not a.is_link_local]
    return _flows_of(ct, base, frontends, programmed, node_addrs, stale=query.all_stale)


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
    from nlproxy.proxy.layout import Backend

    if flow.status & IPS_DST_NAT:
        return Backend(flow.reply.src, flow.reply.sport) not in backends
    return flow.proto == "udp" and bool(backends)


def load_programmed(netns: str | None) -> Programmed:
    """Frontends and backends from nlproxy's tables in ``netns``, as read back from the kernel.

    Raises:
        ConntrackError: neither ``ip nlproxy`` nor ``ip6 nlproxy`` exists.
    """
    # Imported here: proxy/naming loads the cluster model, a fifth of a plain listing's start.
    from nlproxy.nft.ir import FAMILIES
    from nlproxy.operate.rules import programmed
    from nlproxy.proxy.layout import programmed_frontends
    from nlproxy.proxy.naming import TABLE

    rulesets = programmed(FAMILIES, netns)
    if not rulesets:
        raise ConntrackError(f"table ip/ip6 {TABLE}", "not found: nlproxy has programmed nothing")
    return programmed_frontends(rulesets)
