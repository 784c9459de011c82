"""Conntrack cleanup after a commit: find and delete flows that point at backends that are gone.

Sits after the kernel backend in the sync loop (DESIGN §6): :func:`stale_flow_filters` (pure, in
``plan.py``, re-exported here with the rest of the API) turns the frontends → backends
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

import builtins
import errno as errno_mod
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol, TypeVar

from nlproxy.conntrack import plan
from nlproxy.conntrack.messages import (
    Flow,
    FlowFilter,
    FlowTuple,
    decode_flow,
    encode_delete,
    encode_delete_attrs,
    encode_dump,
)
from nlproxy.conntrack.plan import MAX_PASSES, Pass, plan_passes, stale_flow_filters
from nlproxy.conntrack.rows import SweepReader, SweepRow, flow_row, row_matcher
from nlproxy.errors import NlproxyError
from nlproxy.netlink.codec import NLMSG_DONE, NLMSG_ERROR, error_code, headers
from nlproxy.netlink.nlsock import NetfilterSocket

_T = TypeVar("_T")

if TYPE_CHECKING:
    from nlproxy.conntrack.plan import (
        Backend,
        Frontend,
        Programmed,
        UnexpectedElement,
        programmed_frontends,
    )

__all__ = [
    "MAX_PASSES",
    "Backend",
    "Conntrack",
    "ConntrackError",
    "Flow",
    "FlowFilter",
    "FlowTuple",
    "Flows",
    "Frontend",
    "Programmed",
    "UnexpectedElement",
    "plan_passes",
    "programmed_frontends",
    "stale_flow_filters",
]


def __getattr__(name: str) -> object:
    """The layout reader's names, loaded on first use (see ``plan.FROM_LAYOUT``)."""
    if name in plan.FROM_LAYOUT:
        value = getattr(plan, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


DELETE_BATCH = 1024
"""Flows deleted per netlink send."""

TRANSIENT = frozenset(
    {
        errno_mod.EMFILE,
        errno_mod.ENFILE,
        errno_mod.ENOBUFS,
        errno_mod.ENOMEM,
        errno_mod.EAGAIN,
        errno_mod.EINTR,
        errno_mod.ETIMEDOUT,
    }
)
"""Errors of a cleanup that a later try may not meet: out of file descriptors, buffers or
memory, or no answer in time. Its filters are kept and tried again; any other error (the
kernel refusing a filter or a flow) drops them, or every later cleanup would fail the same."""


class ConntrackError(NlproxyError):
    """The kernel refused a conntrack request; ``ref`` names the flow or filter."""


def transient(exc: BaseException) -> bool:
    """``exc`` or what caused it ran out of a resource (:data:`TRANSIENT`) or of time."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, TimeoutError) or (
            isinstance(seen, OSError) and seen.errno in TRANSIENT
        ):
            return True
        seen = seen.__cause__
    return False


def _kernel_filter(flt: FlowFilter, family: int) -> FlowFilter:
    """What the kernel can be trusted to pre-select for ``family`` (see the module docstring)."""
    if family == 6:
        return replace(flt, orig_dst=None, reply_src=None, family=6)
    return replace(flt, family=family)


class Flows(Protocol):
    """What the sync needs of the conntrack table: its flows, and deleting some by filter.
    Real: :class:`Conntrack`; fake: ``conntrack/fake.py``'s ``FakeConntrack``."""

    def list(self, flt: FlowFilter | None = None) -> Iterator[Flow]:
        """The flows ``flt`` selects (every flow without one)."""
        ...

    @property
    def pending(self) -> Sequence[FlowFilter]:
        """Filters a :meth:`delete` could not finish for want of a resource (``EMFILE``...):
        the next call runs them first, ``delete(())`` only them."""
        ...

    def take_pending(self) -> tuple[FlowFilter, ...]:
        """:attr:`pending`, which is emptied: the caller decides which are still worth
        running (an endpoint back meanwhile has new flows that must stay)."""
        ...

    def delete(self, filters: Sequence[FlowFilter]) -> int:
        """Delete the flows any of ``filters`` (and of :attr:`pending`) selects; how many
        were deleted.

        Raises:
            ConntrackError: the kernel refused, a resource ran out (the filters not done are
                kept in :attr:`pending`), or a filter is empty (it would select all).
        """
        ...


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
        self._pending: builtins.list[FlowFilter] = []

    @property
    def pending(self) -> Sequence[FlowFilter]:
        """Filters a :meth:`delete` could not finish (see :data:`TRANSIENT`), tried first by
        the next call; ``delete(())`` tries only them."""
        return tuple(self._pending)

    def take_pending(self) -> tuple[FlowFilter, ...]:
        """:attr:`pending`, which is emptied (see :class:`Flows`)."""
        taken, self._pending = tuple(self._pending), []
        return taken

    def list(self, flt: FlowFilter | None = None) -> Iterator[Flow]:
        """Yield the flows ``flt`` selects (all flows without one), IPv4 then IPv6.

        Raises:
            ConntrackError: the kernel refused the dump (e.g. a filter it does not support).
        """
        flt = flt or FlowFilter()
        yield from self._scan(Pass(flt, (flt,)))

    def delete(self, filters: Sequence[FlowFilter]) -> int:
        """Delete the flows any of ``filters`` selects, and those of the filters an earlier
        call left :attr:`pending`; return how many were deleted.

        An empty filter (which would select every flow) is refused: use :meth:`delete_flows`
        with :meth:`list` to clear everything on purpose. When a resource runs out (a commit
        that hit the fd limit, see :data:`TRANSIENT`), the filters whose passes did not finish
        stay :attr:`pending` for the next call rather than being lost: the caller's retry, or
        its next cleanup, deletes their flows.

        Raises:
            ConntrackError: the kernel refused a dump or a delete, a resource ran out, or a
                filter is empty.
        """
        for f in filters:
            if f.is_empty:
                raise ConntrackError(str(f), "refusing to delete every flow")
        started = time.perf_counter()
        todo = builtins.list(dict.fromkeys([*self._pending, *filters]))
        passes = plan_passes(todo)
        count = 0
        done: set[FlowFilter] = set()
        try:
            for p in passes:
                count += self.delete_flows(self._scan(p))
                done.update(p.members)
        except (OSError, NlproxyError) as exc:  # NlproxyError: also entering the namespace
            self._pending = [f for f in todo if f not in done] if transient(exc) else []
            if not self._pending:
                raise
            reason = exc.reason if isinstance(exc, NlproxyError) else exc.strerror or str(exc)
            raise ConntrackError(
                "conntrack cleanup",
                f"{reason}; {len(self._pending)} filters kept for the next cleanup",
            ) from exc
        self._pending = []
        # The logger is made here, not in __init__: listing flows loads no logging at all.
        from nlproxy.log import get_logger

        get_logger("conntrack").info(
            "conntrack.flushed",
            filters=len(todo),
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
        return self._delete_batched(flows, _delete_batch)

    def sweep_rows(self, flt: FlowFilter) -> Iterator[SweepRow]:
        """The flows ``flt`` selects, as the start-up sweep reads them (:func:`sweep_row`,
        falling back to the full decoder on a message it does not expect).

        Raises:
            ConntrackError: the kernel refused the dump.
        """
        reader = SweepReader()
        match = row_matcher(flt)
        for payload in self._payloads(Pass(flt, (flt,))):
            row = reader.row(payload)
            if row is None:
                row = flow_row(decode_flow(payload))
            if match(row):
                yield row

    def delete_rows(self, rows: Iterable[SweepRow]) -> int:
        """Delete exactly the flows of ``rows`` (by original tuple, zone and id), as
        :meth:`delete_flows` does; how many went.

        Raises:
            ConntrackError: the kernel refused a delete for another reason than ENOENT.
        """
        return self._delete_batched(rows, _delete_rows)

    def _delete_batched(
        self, items: Iterable[_T], send: Callable[[NetfilterSocket, builtins.list[_T]], int]
    ) -> int:
        """``send`` the deletes of ``items`` in batches of ``DELETE_BATCH`` over one socket,
        streaming; how many went (counted, and told to ``on_deleted``)."""
        count = 0
        batch: builtins.list[_T] = []
        with NetfilterSocket(self.netns, bufsize=8 << 20) as sock:
            for item in items:
                batch.append(item)
                if len(batch) >= DELETE_BATCH:
                    count += send(sock, batch)
                    batch.clear()
            count += send(sock, batch)
        self.deleted_total += count
        if self._on_deleted is not None and count:
            self._on_deleted(count)
        return count

    def lines(self, flt: FlowFilter | None = None) -> Iterator[builtins.list[str]]:
        """The flows :meth:`list` yields, each as :func:`conntrack_line` shows it, made
        straight from the kernel's messages (``nlproxy conntrack list``); in batches, about a
        datagram's worth at a time.

        Raises:
            ConntrackError: the kernel refused the dump.
        """
        from nlproxy.conntrack.lines import LineFormatter  # only listings print lines

        flt = flt or FlowFilter()
        p = Pass(flt, (flt,))
        fmt = LineFormatter()
        match = None if flt.is_empty else p.matcher()
        screen = p.prefilter()
        for kflt, seq, datagrams in self._dumps(p):
            try:
                for buf in datagrams:
                    # Every flow of the family: a datagram of one learnt layout goes in one go.
                    whole = fmt.datagram(buf) if match is None else None
                    if whole is not None:
                        yield whole
                        continue
                    payloads, end = _split(buf, seq, screen)
                    yield [
                        fmt.line(payload)
                        for payload in payloads
                        if match is None or match(decode_flow(payload))
                    ]
                    if end is not None:
                        _ended(end)
                        break
            except OSError as exc:
                raise ConntrackError(str(kflt), _failed("dump", exc.errno, exc.strerror)) from exc

    def _scan(self, p: Pass) -> Iterator[Flow]:
        match = p.matcher()
        for payload in self._payloads(p):
            flow = decode_flow(payload)
            if match(flow):
                yield flow

    def _payloads(self, p: Pass) -> Iterator[bytes]:
        """The flow messages of ``p``'s dumps that pass its prefilter, undecoded."""
        screen = p.prefilter()
        for kflt, seq, datagrams in self._dumps(p):
            try:
                for buf in datagrams:
                    payloads, end = _split(buf, seq, screen)
                    yield from payloads
                    if end is not None:
                        _ended(end)
                        break
            except OSError as exc:
                raise ConntrackError(str(kflt), _failed("dump", exc.errno, exc.strerror)) from exc

    def _dumps(self, p: Pass) -> Iterator[tuple[FlowFilter, int, Iterator[bytes]]]:
        """For each family ``p`` spans: the kernel filter, the dump's sequence number and the
        datagrams it answers with (read until the caller stops)."""
        families = [p.kernel.family] if p.kernel.family else [4, 6]
        with NetfilterSocket(self.netns, bufsize=8 << 20) as sock:
            for family in families:
                kflt = _kernel_filter(p.kernel, family)
                seq = sock.next_seq()
                yield kflt, seq, sock.datagrams(encode_dump(kflt, family, seq))


def _split(
    buf: bytes, seq: int, screen: Callable[[bytes], bool] | None
) -> tuple[list[bytes], int | None]:
    """The payloads of dump ``seq``'s flow messages in one datagram that pass ``screen``, and
    how the dump ended in it: None (it goes on), 0 (done) or the errno the kernel answered.

    Screens the whole datagram first (a datagram without the addresses holds no wanted flow),
    so at 100k flows most are never split into messages: where the kernel cannot pre-select
    (IPv6) this is what keeps a pass well under a second.
    """
    wanted = screen is None or screen(buf)
    payloads: list[bytes] = []
    for mtype, _flags, mseq, start, end in headers(buf):
        if mseq == seq:
            if mtype == NLMSG_DONE:
                return payloads, 0
            if mtype == NLMSG_ERROR:
                return payloads, error_code(buf, start)
            if wanted:
                payload = buf[start:end]
                if screen is None or screen(payload):
                    payloads.append(payload)
    return payloads, None


def _failed(what: str, code: int | None, reason: str | None) -> str:
    """The reason a dump or delete failed, naming the capability when the kernel refused one:
    ctnetlink answers a process without CAP_NET_ADMIN (in the flows' network namespace) with
    EPERM, and "EPERM" alone does not tell an operator what to grant."""
    if code in (errno_mod.EPERM, errno_mod.EACCES):
        return f"{what}: {reason}: conntrack flows need CAP_NET_ADMIN (run as root)"
    return f"{what}: {reason}"


def _ended(code: int) -> None:
    """The end of a dump: nothing when it is done, else the kernel's error.

    Raises:
        OSError: the kernel answered the dump with an error.
    """
    if code:
        raise OSError(code, errno_mod.errorcode.get(code, "?"))


def _delete_batch(sock: NetfilterSocket, flows: Sequence[Flow]) -> int:
    if not flows:
        return 0
    first = sock.next_seq(len(flows))
    sock.send(b"".join(encode_delete(f, first + i) for i, f in enumerate(flows)))
    return _acked(sock, first, len(flows), lambda i: f"flow {flows[i]}")


def _delete_rows(sock: NetfilterSocket, rows: Sequence[SweepRow]) -> int:
    """Delete exactly the flows of ``rows`` (:meth:`Conntrack.delete_rows`)."""
    if not rows:
        return 0
    first = sock.next_seq(len(rows))
    sock.send(
        b"".join(encode_delete_attrs(r[6], r[1].version, first + i) for i, r in enumerate(rows))
    )

    def name(i: int) -> str:
        proto, dst, dport, rsrc, rsport, _status, _handle = rows[i]
        return f"flow proto={proto} dst={dst} dport={dport} reply-src={rsrc} reply-sport={rsport}"

    return _acked(sock, first, len(rows), name)


def _acked(sock: NetfilterSocket, first: int, count: int, name: Callable[[int], str]) -> int:
    """Wait for the acks of the ``count`` deletes sent from sequence number ``first``; how many
    deleted a flow (one already gone is not counted). ``name(i)``: what the i-th deletes."""
    pending = set(range(first, first + count))
    deleted = 0
    while pending:
        for msg in sock.recv(timeout=10.0):
            if msg.type != NLMSG_ERROR or msg.seq not in pending:
                continue
            pending.discard(msg.seq)
            if msg.error == 0:
                deleted += 1
            elif msg.error != errno_mod.ENOENT:
                code = errno_mod.errorcode.get(msg.error, str(msg.error))
                raise ConntrackError(
                    name(msg.seq - first), _failed("delete", msg.error, code)
                ) from OSError(msg.error, code)
    return deleted


if TYPE_CHECKING:  # what ``Flows`` declares (mypy checks it)
    _flows: Flows = Conntrack()
