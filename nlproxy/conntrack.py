"""Conntrack cleanup after a commit: find and delete flows that point at backends that are gone.

Sits after the kernel backend in the sync loop (DESIGN §6): :func:`stale_flow_filters` is a pure
function of the frontends → backends that were programmed before and after a commit, and
:class:`Conntrack` applies its result over ctnetlink. ``nlproxy conntrack list|flush`` uses the
same machinery. Runs only after a successful commit; never touches nftables, never execs
``conntrack``, and never holds the whole table in memory: the kernel pre-selects flows (CTA_FILTER
dumps), the survivors are re-checked here and deleted one by one by tuple and id, in batches.

Kernel behaviour this relies on (measured on Linux 6.18):
- a dump pass over the table costs about the same however few flows it returns (~30 ms at 100k
  flows), so filters are grouped into as few passes as possible;
- tuple filters compare IPv6 addresses inverted (``!ipv6_addr_cmp`` in
  ``ctnetlink_filter_match_tuple``), so IPv6 addresses are never sent as kernel filters and are
  checked here instead; ports are compared only for TCP and UDP;
- a filtered DELETE-all (CTA_FILTER on IPCTNL_MSG_CT_DELETE, Linux >= 6.12) exists but reports
  no count and inherits the IPv6 inversion, so it is not used.
"""

from __future__ import annotations

import errno as errno_mod
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields, replace

from nlproxy.conntrack_msg import (
    Flow,
    FlowFilter,
    FlowTuple,
    IPAddress,
    decode_flow,
    encode_delete,
    encode_dump,
)
from nlproxy.errors import NlproxyError
from nlproxy.log import get_logger
from nlproxy.nft.nlsock import NLMSG_ERROR, NetfilterSocket

__all__ = [
    "Backend",
    "Conntrack",
    "ConntrackError",
    "Flow",
    "FlowFilter",
    "FlowTuple",
    "Frontend",
    "stale_flow_filters",
]

DELETE_BATCH = 1024
"""Flows deleted per netlink send."""
MAX_PASSES = 32
"""More kernel-filtered passes than this, and one looser pass per family is cheaper: a pass costs
~30 ms at 100k flows, decoding a flow here ~15 µs."""


class ConntrackError(NlproxyError):
    """The kernel refused a conntrack request; ``ref`` names the flow or filter."""


@dataclass(frozen=True, slots=True)
class Frontend:
    """Where clients send: ``proto`` (tcp/udp/sctp), a service address (None: a NodePort, on
    every node address) and a port."""

    proto: str
    addr: IPAddress | None
    port: int

    def __str__(self) -> str:
        where = "nodeport" if self.addr is None else str(self.addr)
        return f"{self.proto}/{where}:{self.port}"


@dataclass(frozen=True, slots=True)
class Backend:
    """An endpoint that answers for a frontend: its address and (target) port."""

    addr: IPAddress
    port: int


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
class _Pass:
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


def _common(members: Sequence[FlowFilter]) -> FlowFilter:
    """The filter made of the fields every member agrees on."""
    first = members[0]
    agreed = {
        fl.name: getattr(first, fl.name)
        for fl in fields(first)
        if all(getattr(m, fl.name) == getattr(first, fl.name) for m in members)
    }
    return FlowFilter(**agreed)


def _group(filters: Iterable[FlowFilter], key: Callable[[FlowFilter], object]) -> list[_Pass]:
    groups: dict[object, list[FlowFilter]] = defaultdict(list)
    for f in filters:
        groups[key(f)].append(f)
    return [_Pass(_common(ms), tuple(ms)) for ms in groups.values()]


def plan_passes(filters: Sequence[FlowFilter], *, max_passes: int = MAX_PASSES) -> list[_Pass]:
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


def _kernel_filter(flt: FlowFilter, family: int) -> FlowFilter:
    """What the kernel can be trusted to pre-select for ``family`` (see the module docstring)."""
    if family == 6:
        return replace(flt, orig_dst=None, reply_src=None, family=6)
    return replace(flt, family=family)


# ---------------------------------------------------------------------------------------------
# The kernel side


class Conntrack:
    """The conntrack table of network namespace ``netns`` (None: the current one).

    Attributes:
        deleted_total: flows deleted by this object so far; the daemon exports it as
            ``kubeproxy_conntrack_reconciler_deleted_entries_total``.

    Args:
        on_deleted: called with the number of flows each :meth:`delete` removed.
    """

    def __init__(
        self, netns: str | None = None, *, on_deleted: Callable[[int], None] | None = None
    ) -> None:
        self.netns = netns
        self.deleted_total = 0
        self._on_deleted = on_deleted
        self._log = get_logger("conntrack")

    def list(self, flt: FlowFilter | None = None) -> Iterator[Flow]:
        """Yield the flows ``flt`` selects (all flows without one), IPv4 then IPv6.

        Raises:
            ConntrackError: the kernel refused the dump (e.g. a filter it does not support).
        """
        flt = flt or FlowFilter()
        yield from self._scan(_Pass(flt, (flt,)))

    def delete(self, filters: Sequence[FlowFilter]) -> int:
        """Delete the flows any of ``filters`` selects; return how many were deleted.

        An empty filter (which would select every flow) is refused: use :meth:`delete_flows`
        with :meth:`list` to clear everything on purpose.

        Raises:
            ConntrackError: the kernel refused a dump or a delete, or a filter is empty.
        """
        for f in filters:
            if f.is_empty:
                raise ConntrackError(str(f), "refusing to delete every flow")
        started = time.perf_counter()
        passes = plan_passes(filters)
        count = sum(self.delete_flows(self._scan(p)) for p in passes)
        self._log.info(
            "conntrack.flushed",
            filters=len(filters),
            passes=len(passes),
            deleted=count,
            duration_ms=round((time.perf_counter() - started) * 1000, 2),
        )
        return count

    def delete_flows(self, flows: Iterable[Flow]) -> int:
        """Delete these exact flows (by tuple, zone and id), streaming; return how many went.

        A flow that is already gone is not counted.

        Raises:
            ConntrackError: the kernel refused a delete for another reason than ENOENT.
        """
        count = 0
        batch: list[Flow] = []
        with NetfilterSocket(self.netns, bufsize=8 << 20) as sock:
            for flow in flows:
                batch.append(flow)
                if len(batch) >= DELETE_BATCH:
                    count += _delete_batch(sock, batch)
                    batch.clear()
            count += _delete_batch(sock, batch)
        self.deleted_total += count
        if self._on_deleted is not None and count:
            self._on_deleted(count)
        return count

    def _scan(self, p: _Pass) -> Iterator[Flow]:
        match = p.matcher()
        families = [p.kernel.family] if p.kernel.family else [4, 6]
        with NetfilterSocket(self.netns, bufsize=8 << 20) as sock:
            for family in families:
                kflt = _kernel_filter(p.kernel, family)
                seq = sock.next_seq()
                try:
                    for msg in sock.dump(encode_dump(kflt, family, seq), seq):
                        flow = decode_flow(msg.payload)
                        if match(flow):
                            yield flow
                except OSError as exc:
                    raise ConntrackError(str(kflt), f"dump: {exc.strerror}") from exc


def _delete_batch(sock: NetfilterSocket, flows: Sequence[Flow]) -> int:
    if not flows:
        return 0
    first = sock.next_seq(len(flows))
    sock.send(b"".join(encode_delete(f, first + i) for i, f in enumerate(flows)))
    pending = set(range(first, first + len(flows)))
    deleted = 0
    while pending:
        for msg in sock.recv(timeout=10.0):
            if msg.type != NLMSG_ERROR or msg.seq not in pending:
                continue
            pending.discard(msg.seq)
            if msg.error == 0:
                deleted += 1
            elif msg.error != errno_mod.ENOENT:
                flow = flows[msg.seq - first]
                raise ConntrackError(f"flow {flow}", f"delete: {errno_mod.errorcode[msg.error]}")
    return deleted
