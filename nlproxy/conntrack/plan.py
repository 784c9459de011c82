"""The pure half of conntrack cleanup: which flows are stale, and how to find them in few passes.

Sits between the sync (which knows the frontends → backends programmed before and after a
commit) and :class:`nlproxy.conntrack.kernel.Conntrack` (which talks to the kernel). Pure: no I/O,
no clock, no logging. Three parts:

- :func:`stale_flow_filters`: old and new frontends → filters for the flows left pointing nowhere;
- :func:`plan_passes`: those filters → few kernel dump passes (each costs a walk of the table);
- :func:`programmed_frontends` (from :mod:`nlproxy.proxy.layout`, which reads the ruleset's shape
  back): frontends and backends as nlproxy programmed them, from read-back
  :class:`~nlproxy.nft.ir.Ruleset` values.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from nlproxy.conntrack.messages import Flow, FlowFilter, IPAddress

if TYPE_CHECKING:
    from nlproxy.proxy.layout import (
        Backend,
        Frontend,
        Programmed,
        UnexpectedElement,
        programmed_frontends,
    )

__all__ = [
    "MAX_PASSES",
    "Backend",
    "Frontend",
    "Pass",
    "Programmed",
    "UnexpectedElement",
    "plan_passes",
    "programmed_frontends",
    "stale_flow_filters",
    "still_stale",
]

FROM_LAYOUT = frozenset(
    {"Backend", "Frontend", "Programmed", "UnexpectedElement", "programmed_frontends"}
)
"""Re-exported from :mod:`nlproxy.proxy.layout`, loaded on first use: the layout reader pulls in
the nftables IR, the cluster model and the naming module, a third of ``nlproxy conntrack flush``
by filters, which uses none of them."""


def __getattr__(name: str) -> object:
    if name in FROM_LAYOUT:
        from nlproxy.proxy import layout

        value = getattr(layout, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


MAX_PASSES = 32
"""More kernel-filtered passes than this, and one looser pass per family is cheaper: a pass costs
~30 ms at 100k flows, decoding a flow here ~15 µs."""
PREFILTER_MAX_MEMBERS = 16
"""Up to this many filters in a pass, raw messages are screened for their addresses first."""


def stale_flow_filters(
    old: Mapping[Frontend, frozenset[Backend]],
    new: Mapping[Frontend, frozenset[Backend]],
    *,
    node_addrs: Sequence[IPAddress],
    flush_tcp: bool = False,
) -> list[FlowFilter]:
    """Filters for the flows a change from ``old`` to ``new`` leaves pointing nowhere.

    - A backend that served a frontend in ``old`` and does not in ``new``: flows whose original
      destination is the frontend (each node address for a NodePort) and whose reply comes from
      that backend. UDP and SCTP only, TCP too with ``flush_tcp`` (a TCP client sees a reset).
    - A UDP frontend with no backends in ``old`` (or absent) and some in ``new``: its flows that
      were not DNAT'd. They were confirmed while nothing answered (blackholed or rejected) and
      would keep bypassing the new DNAT rules until they time out.

    Pure. The result is sorted, so the same input gives the same filters.
    """
    out: set[FlowFilter] = set()
    for fe, backends in old.items():
        if fe.proto == "tcp" and not flush_tcp:
            continue
        for be in backends - new.get(fe, frozenset()):
            for dst in _destinations(fe, node_addrs, be.addr.version):
                out.add(
                    FlowFilter(
                        proto=fe.proto,
                        orig_dst=dst,
                        orig_dport=fe.port,
                        reply_src=be.addr,
                        reply_sport=be.port,
                    )
                )
    for fe, backends in new.items():
        if fe.proto == "udp" and backends and not old.get(fe):
            for dst in _destinations(fe, node_addrs, None):
                out.add(FlowFilter(proto="udp", orig_dst=dst, orig_dport=fe.port, dnat=False))
    return sorted(out, key=_filter_sort_key)


def still_stale(
    filters: Sequence[FlowFilter],
    now: Mapping[Frontend, frozenset[Backend]],
    *,
    node_addrs: Sequence[IPAddress],
) -> list[FlowFilter]:
    """The ``filters`` (of :func:`stale_flow_filters`, left undone earlier) whose backend
    does not serve their frontend in ``now``: one that came back since has new flows that
    must stay. Filters of flows that were not DNAT'd are kept as they are.

    Pure.
    """
    served: set[tuple[str, IPAddress, int, IPAddress, int]] = set()
    for fe, backends in now.items():
        for be in backends:
            for dst in _destinations(fe, node_addrs, be.addr.version):
                served.add((fe.proto, dst, fe.port, be.addr, be.port))
    out = []
    for f in filters:
        if f.reply_src is not None and f.orig_dst is not None:
            key = (f.proto, f.orig_dst, f.orig_dport, f.reply_src, f.reply_sport)
            if key in served:
                continue
        out.append(f)
    return out


def _destinations(
    fe: Frontend, node_addrs: Sequence[IPAddress], version: int | None
) -> list[IPAddress]:
    if fe.addr is not None:
        return [fe.addr] if version in (None, fe.addr.version) else []
    return [a for a in node_addrs if version in (None, a.version)]


def _filter_sort_key(f: FlowFilter) -> tuple[str, ...]:
    return tuple(str(getattr(f, fl.name)) for fl in fields(f))


# ---------------------------------------------------------------------------------------------
# Planning kernel passes


@dataclass(frozen=True, slots=True)
class Pass:
    """One kernel dump: ``kernel`` pre-selects, a flow is kept if any of ``members`` matches."""

    kernel: FlowFilter
    members: tuple[FlowFilter, ...]

    def matcher(self) -> Callable[[Flow], bool]:
        if len(self.members) == 1:
            return self.members[0].matches
        by_dst: dict[tuple[IPAddress, int], list[FlowFilter]] = defaultdict(list)
        rest: list[FlowFilter] = []
        for m in self.members:
            if m.orig_dst is not None and m.orig_dport is not None:
                by_dst[(m.orig_dst, m.orig_dport)].append(m)
            else:
                rest.append(m)

        def match(flow: Flow) -> bool:
            near = by_dst.get((flow.orig.dst, flow.orig.dport), ())
            return any(m.matches(flow) for m in near) or any(m.matches(flow) for m in rest)

        return match

    def prefilter(self) -> Callable[[bytes], bool] | None:
        """A cheap check on a raw dump message that every flow :meth:`matcher` keeps passes.

        Each member needs its addresses somewhere in the message's bytes. Where the kernel cannot
        pre-select by address (IPv6, loose passes) this skips decoding nearly every other flow.
        None when a member names no address or there are too many members for it to pay.
        """
        needles = []
        for m in self.members:
            need = tuple(a.packed for a in (m.orig_dst, m.reply_src) if a is not None)
            if not need:
                return None
            needles.append(need)
        if len(needles) > PREFILTER_MAX_MEMBERS:
            return None
        if len(needles) == 1:
            (only,) = needles

            def check_one(payload: bytes) -> bool:
                return all(n in payload for n in only)

            return check_one

        def check(payload: bytes) -> bool:
            return any(all(n in payload for n in need) for need in needles)

        return check


def _common(members: Sequence[FlowFilter]) -> FlowFilter:
    """The filter made of the fields every member agrees on."""
    first = members[0]
    agreed = {
        fl.name: getattr(first, fl.name)
        for fl in fields(first)
        if all(getattr(m, fl.name) == getattr(first, fl.name) for m in members)
    }
    return FlowFilter(**agreed)


def _group(filters: Iterable[FlowFilter], key: Callable[[FlowFilter], object]) -> list[Pass]:
    groups: dict[object, list[FlowFilter]] = defaultdict(list)
    for f in filters:
        groups[key(f)].append(f)
    return [Pass(_common(ms), tuple(ms)) for ms in groups.values()]


def plan_passes(filters: Sequence[FlowFilter], *, max_passes: int = MAX_PASSES) -> list[Pass]:
    """Group filters into few kernel passes.

    Filters are grouped by their original destination (one pass per frontend) or by their reply
    source (one pass per removed backend, covering its ClusterIP and every NodePort address),
    whichever needs fewer passes; past ``max_passes``, one pass per family and protocol.
    """
    unique = list(dict.fromkeys(filters))
    if not unique:
        return []
    by_orig = _group(unique, lambda f: (f.family, f.proto, f.orig_dst, f.orig_dport, f.dnat))

    def reply_key(f: FlowFilter) -> object:
        if f.reply_src is None:
            return ("orig", f.family, f.proto, f.orig_dst, f.orig_dport, f.dnat)
        return ("reply", f.family, f.proto, f.reply_src, f.reply_sport)

    by_reply = _group(unique, reply_key)
    best = min(by_orig, by_reply, key=len)
    if len(best) <= max_passes:
        return best
    return _group(unique, lambda f: (f.family, f.proto))
