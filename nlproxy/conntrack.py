"""Conntrack cleanup after a commit: find and delete flows that point at backends that are gone.

Sits after the kernel backend in the sync loop (DESIGN §6): :func:`stale_flow_filters` (pure, in
``conntrack_plan.py``, re-exported here with the rest of the API) turns the frontends → backends
programmed before and after a commit into filters, and :class:`Conntrack` applies them over
ctnetlink; ``nlproxy conntrack list|flush`` uses the same machinery. Runs only after a successful
commit; never touches nftables, never execs ``conntrack``, and never holds the whole table in
memory: the kernel pre-selects flows (CTA_FILTER dumps), the survivors are re-checked here and
deleted one by one by tuple and id, in batches.

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
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace

from nlproxy.conntrack_msg import (
    Flow,
    FlowFilter,
    FlowTuple,
    LineFormatter,
    decode_flow,
    encode_delete,
    encode_dump,
)
from nlproxy.conntrack_plan import (
    MAX_PASSES,
    Backend,
    Frontend,
    Pass,
    Programmed,
    UnexpectedElement,
    plan_passes,
    programmed_frontends,
    stale_flow_filters,
)
from nlproxy.errors import NlproxyError
from nlproxy.log import get_logger
from nlproxy.nft.nlsock import NLMSG_DONE, NLMSG_ERROR, NetfilterSocket

__all__ = [
    "MAX_PASSES",
    "Backend",
    "Conntrack",
    "ConntrackError",
    "Flow",
    "FlowFilter",
    "FlowTuple",
    "Frontend",
    "Programmed",
    "UnexpectedElement",
    "plan_passes",
    "programmed_frontends",
    "stale_flow_filters",
]

_NLMSGHDR = struct.Struct("=IHHII")

DELETE_BATCH = 1024
"""Flows deleted per netlink send."""


class ConntrackError(NlproxyError):
    """The kernel refused a conntrack request; ``ref`` names the flow or filter."""


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
        on_deleted: called with the number of flows deleted, each time some are (a metrics
            counter's ``inc``).
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
        yield from self._scan(Pass(flt, (flt,)))

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

    def lines(self, flt: FlowFilter | None = None) -> Iterator[str]:
        """The flows :meth:`list` yields, each as :func:`conntrack_line` shows it, made
        straight from the kernel's messages (``nlproxy conntrack list``).

        Raises:
            ConntrackError: the kernel refused the dump.
        """
        flt = flt or FlowFilter()
        p = Pass(flt, (flt,))
        line = LineFormatter().line
        if flt.is_empty:  # every flow of the families dumped: nothing to decode for a match
            for payload in self._payloads(p):
                yield line(payload)
            return
        match = p.matcher()
        for payload in self._payloads(p):
            if match(decode_flow(payload)):
                yield line(payload)

    def _scan(self, p: Pass) -> Iterator[Flow]:
        match = p.matcher()
        for payload in self._payloads(p):
            flow = decode_flow(payload)
            if match(flow):
                yield flow

    def _payloads(self, p: Pass) -> Iterator[bytes]:
        """The flow messages of ``p``'s dumps that pass its prefilter, undecoded."""
        screen = p.prefilter()
        families = [p.kernel.family] if p.kernel.family else [4, 6]
        with NetfilterSocket(self.netns, bufsize=8 << 20) as sock:
            for family in families:
                kflt = _kernel_filter(p.kernel, family)
                seq = sock.next_seq()
                try:
                    yield from _dump(sock, encode_dump(kflt, family, seq), seq, screen)
                except OSError as exc:
                    raise ConntrackError(str(kflt), f"dump: {exc.strerror}") from exc


def _dump(
    sock: NetfilterSocket, request: bytes, seq: int, screen: Callable[[bytes], bool] | None
) -> Iterator[bytes]:
    """Payloads of the dump's flow messages that pass ``screen``.

    Screens whole datagrams first (a datagram without the addresses holds no wanted flow), so
    at 100k flows most are never split into messages: where the kernel cannot pre-select (IPv6)
    this is what keeps a pass well under a second.

    Raises:
        OSError: the kernel answered the dump with an error.
    """
    sock.send(request)
    sock.sock.settimeout(10.0)
    while True:
        buf = sock.sock.recv(1 << 20)
        wanted = screen is None or screen(buf)
        off = 0
        while off + _NLMSGHDR.size <= len(buf):
            length, mtype, _flags, mseq, _pid = _NLMSGHDR.unpack_from(buf, off)
            if length < _NLMSGHDR.size:
                break
            if mseq == seq:
                if mtype == NLMSG_DONE:
                    return
                if mtype == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", buf, off + _NLMSGHDR.size)[0]
                    if code:
                        raise OSError(code, errno_mod.errorcode.get(code, "?"))
                    return
                if wanted:
                    payload = buf[off + _NLMSGHDR.size : off + length]
                    if screen is None or screen(payload):
                        yield payload
            off += (length + 3) & ~3


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
