"""Drift detection: telling when a process other than nlproxy changed the ruleset.

Two ways, with different costs to everyone on the host:

- :class:`GenerationWatch` (what the daemon runs) asks the kernel for the ruleset's generation id
  (NFT_MSG_GETGEN) a few times a second and reports every move. It joins no multicast group, so
  it costs no commit anything; a move that is not one of nlproxy's own commits is a possible
  drift, which the caller reads back. The kernel names the writer of a transaction only to
  members of NFNLGRP_NFTABLES, so such a drift has no writer.
- :class:`NftMonitor` subscribes to NFNLGRP_NFTABLES. The kernel reports every committed change
  object by object and closes each transaction with NFT_MSG_NEWGEN, which names the writer (pid
  and command). A transaction that touched a table named ``table_name`` and was written by
  another process is a drift. But while any socket on the host is a member, the kernel builds a
  message per committed object, set elements included, for every commit of every process in
  every namespace (the listener check is not per namespace): ~8 KB of unreclaimable slab and
  several microseconds per element (``docs/ruleset.md``, "Watching for drift"). A receive-buffer
  overflow (ENOBUFS) means notifications were lost, so it is reported as a drift by an unknown
  writer: a full verify finds out what changed.

NEWGEN also carries the transaction's generation id. The monitor remembers the last one it
processed; when the kernel's current generation (one GETGEN request) equals it, every transaction
in the namespace has passed through the detector, so nothing can have changed nlproxy's tables
unseen: :meth:`NftMonitor.saw_every_commit` lets the periodic verify skip its read-back then.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

import trio

from nlproxy.errors import NlproxyError
from nlproxy.netlink.codec import (
    NLM_F_REQUEST,
    NLMSG_ERROR,
    be32,
    nfnl_attributes,
    parse_messages,
    text,
)
from nlproxy.netlink.nlsock import NetfilterSocket
from nlproxy.nft.dump import ReadbackError, generation
from nlproxy.nft.uapi import (
    NFNL_SUBSYS_NFTABLES,
    NFNLGRP_NFTABLES,
    NFT_MSG_DELSETELEM,
    NFT_MSG_GETGEN,
    NFT_MSG_NEWGEN,
    NFTA_GEN_ID,
    NFTA_GEN_PROC_NAME,
    NFTA_GEN_PROC_PID,
    NFTA_TABLE_NAME,
)

POLL_SECONDS = 0.5
"""How often the generation watch asks for the generation: a foreign change is seen within half
a second, read back and repaired within a second (a small table's; a read-back of 10k Services
x 10 endpoints takes longer). The request itself is a few microseconds; what a look costs is
the wake-up of a thread in a process that is otherwise asleep: on 2 CPUs at load 7-10, 70 us
for the wake alone and 170-200 us with the look (``schedstat`` of the thread), so ~0.09 s a
minute at four looks a second and ~0.02-0.025 at two (bench/RESULTS.md, "Idle CPU")."""

_NAMES_TABLE = NFT_MSG_DELSETELEM
"""Messages NEWTABLE (0) .. DELSETELEM name the table of the object they are about, in the
attribute numbered as NFTA_TABLE_NAME (NFTA_CHAIN_TABLE, NFTA_RULE_TABLE, NFTA_SET_TABLE and
NFTA_SET_ELEM_LIST_TABLE are 1 too)."""


@dataclass(frozen=True, slots=True)
class Drift:
    """Another process changed nlproxy's table: who, and how many objects it touched.

    ``pid`` 0 reports lost notifications; ``lost`` then gives the generations whose
    transactions may be among them, ``(after, upto]`` (None: unknown). When every one of them
    is nlproxy's own commit (a large sync's notifications overflow the socket), nothing else
    can have written: the caller need not read the tables back.
    """

    pid: int
    comm: str
    objects: int
    lost: tuple[int, int] | None = None


def is_own_thread(pid: int) -> bool:
    """True when ``pid`` is a thread of this process.

    NEWGEN carries the committing *thread's* id, and nlproxy commits from worker threads.
    """
    return os.path.exists(f"/proc/self/task/{pid}")


class DriftDetector:
    """Folds notification messages into :class:`Drift` reports (pure, testable without a socket)."""

    def __init__(self, table_name: str, is_own: Callable[[int], bool] = is_own_thread) -> None:
        self.table = table_name.encode() + b"\0"
        self.is_own = is_own
        self.touched = 0
        self.generation: int | None = None
        """The generation id of the last transaction fed (None: none yet)."""

    def feed(self, mtype: int, payload: bytes) -> Drift | None:
        if mtype >> 8 != NFNL_SUBSYS_NFTABLES:
            return None
        msg = mtype & 0xFF
        if msg <= _NAMES_TABLE:
            if nfnl_attributes(payload).get(NFTA_TABLE_NAME) == self.table:
                self.touched += 1
            return None
        if msg != NFT_MSG_NEWGEN:
            return None
        touched, self.touched = self.touched, 0
        attrs = nfnl_attributes(payload)
        if NFTA_GEN_ID in attrs:
            self.generation = be32(attrs[NFTA_GEN_ID])
        pid = be32(attrs[NFTA_GEN_PROC_PID]) if NFTA_GEN_PROC_PID in attrs else 0
        comm = text(attrs.get(NFTA_GEN_PROC_NAME, b""))
        if not touched or self.is_own(pid):
            return None
        return Drift(pid=pid, comm=comm, objects=touched)


class NftMonitor:
    """Watches nftables notifications in ``netns`` and calls ``on_drift`` for foreign changes."""

    def __init__(self, table_name: str, *, netns_name: str | None = None) -> None:
        self.detector = DriftDetector(table_name)
        self.netns = netns_name
        self.listeners: list[Callable[[int, bytes], None]] = []
        """Called with (nlmsg_type, payload) of every notification, in the monitor's task:
        others' tables are noticed from the same subscription (another proxy's, ``daemon``)."""
        self._sock = NetfilterSocket(netns_name, bufsize=8 << 20)
        self._sock.subscribe(NFNLGRP_NFTABLES)
        self.sock = self._sock.sock
        # Subscribed first, then asked: a transaction in between arrives as a notification.
        self._gen_sock = NetfilterSocket(netns_name)
        self.detector.generation = generation(self._gen_sock)

    def saw_every_commit(self) -> bool:
        """Whether every transaction up to the kernel's current generation has been processed
        (none was lost, none is still queued). One GETGEN request; any thread may call it.

        A False answer is the safe one: the caller reads the tables back. Lost notifications
        (ENOBUFS) leave the remembered generation behind the kernel's until a later one arrives,
        and are reported as a drift besides.
        """
        seen = self.detector.generation
        return seen is not None and generation(self._gen_sock) == seen

    def _lost_span(self) -> tuple[int, int] | None:
        """The generations lost notifications may belong to: after the last one processed, up
        to the kernel's current one (one GETGEN). Later notifications arrive as usual."""
        seen = self.detector.generation
        if seen is None:
            return None
        try:
            return seen, generation(self._gen_sock)
        except (NlproxyError, OSError):
            return None

    async def run(
        self,
        on_drift: Callable[[Drift], None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Report drifts until cancelled.

        Cancellation: returns at the next wait for the socket; the socket is closed.
        """
        task_status.started()
        try:
            while True:
                await trio.lowlevel.wait_readable(self.sock)
                for buf in self._sock.queued():
                    if buf is None:  # ENOBUFS: notifications were lost
                        self.detector.touched = 0
                        on_drift(Drift(0, "(notifications lost)", 0, self._lost_span()))
                        continue
                    for msg in parse_messages(buf):
                        for listener in self.listeners:
                            listener(msg.type, msg.payload)
                        drift = self.detector.feed(msg.type, msg.payload)
                        if drift is not None:
                            on_drift(drift)
        finally:
            self._sock.close()
            self._gen_sock.close()


class GenerationWatch:
    """Reports every move of the ruleset's generation in ``netns``, as spans ``(after, upto]``.

    It joins no multicast group: the kernel builds no notification on its account, for
    nlproxy's commits or anyone else's. What the spans hold is for the caller to judge (its own
    commits' generations are known exactly; any other may have changed its tables).

    The looks are made by a plain thread, which wakes the event loop only when the generation
    moved: an idle node's watch costs its GETGEN requests and nothing of the event loop's
    (a trio sleep and wake-up cost several times the ~15 us request, four times a second:
    ``bench/bench_watch_idle.py``). Its socket is shared, under a lock, with :meth:`current`.
    """

    def __init__(self, *, netns_name: str | None = None, interval: float = POLL_SECONDS) -> None:
        self.interval = interval
        self._sock = NetfilterSocket(netns_name, bufsize=1 << 16)
        self._lock = threading.Lock()
        self._seq = 0
        self._reply = bytearray(4096)
        self._sock.sock.settimeout(10.0)
        self.seen = self._generation()
        """The generation at the last look: every move up to it has been reported."""
        self.looks = 0
        """Looks made so far (by :meth:`run`'s thread or :meth:`look`)."""

    def _generation(self) -> int:
        """One GETGEN, asked and read with no object made but the answer: the request is
        fixed but for its sequence number, and without NLM_F_ACK the kernel sends the
        generation alone (``nft/dump.py``'s ``generation`` leaves an acknowledgement queued,
        read at the next request).

        Raises:
            OSError: the kernel refused, or did not answer within 10 s.
            ReadbackError: its answer holds no generation id.
        """
        self._seq = seq = (self._seq + 1) & 0xFFFFFFFF
        sock = self._sock.sock
        sock.send(_GETGEN_HEAD.pack(20, _GETGEN, NLM_F_REQUEST, seq, 0) + _NFGENMSG)
        reply = self._reply
        while True:
            end = sock.recv_into(reply)
            off = 0
            while off + 16 <= end:
                length, mtype, _, mseq, _ = _GETGEN_HEAD.unpack_from(reply, off)
                if length < 16:
                    break
                if mseq == seq:
                    if mtype == NLMSG_ERROR:
                        err = -struct.unpack_from("=i", reply, off + 16)[0]
                        raise OSError(err, os.strerror(err))
                    if mtype == _NEWGEN:
                        return _gen_id(reply, off + 20, off + length)
                off += (length + 3) & ~3

    def current(self) -> int:
        """The kernel's generation now (one GETGEN); any thread may call it."""
        with self._lock:
            return self._generation()

    def look(self) -> tuple[int, int] | None:
        """The span the generation moved by since the last look (None: it did not)."""
        with self._lock:
            self.looks += 1
            now = self._generation()
            if now == self.seen:
                return None
            after, self.seen = self.seen, now
            return after, now

    async def run(
        self,
        on_moved: Callable[[int, int], None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Call ``on_moved(after, upto)`` on the event loop for each move, looked for every
        :attr:`interval` seconds in a thread of its own, until cancelled. A look that fails (the
        kernel's answer unreadable) is tried at the next one: the generation it missed is still
        there to see.

        Cancellation: returns at once; the thread ends at its next look's turn and closes the
        socket (it is never waited for: a stop must not wait for a thread to get the GIL).
        """
        token = trio.lowlevel.current_trio_token()
        send, recv = trio.open_memory_channel[tuple[int, int]](math.inf)
        stop = threading.Event()

        def deliver(span: tuple[int, int]) -> None:  # on the event loop
            with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
                send.send_nowait(span)

        def poll() -> None:
            try:
                while not stop.wait(self.interval):
                    try:
                        span = self.look()
                    except (ReadbackError, OSError):
                        continue
                    if span is not None:
                        token.run_sync_soon(deliver, span)
            except trio.RunFinishedError:
                pass
            finally:
                with self._lock:
                    self._sock.close()

        threading.Thread(target=poll, name="generation-watch", daemon=True).start()
        task_status.started()
        try:
            async with recv:
                async for after, upto in recv:
                    on_moved(after, upto)
        finally:
            stop.set()
            send.close()


_GETGEN_HEAD = struct.Struct("=IHHII")  # struct nlmsghdr
_GETGEN = NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_GETGEN
_NEWGEN = NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWGEN
_NFGENMSG = bytes((socket.AF_UNSPEC, 0, 0, 0))  # struct nfgenmsg: family, version, res_id


def _gen_id(buf: bytearray, off: int, end: int) -> int:
    """NFTA_GEN_ID among the attributes in ``buf[off:end]``."""
    while off + 4 <= end:
        length, kind = struct.unpack_from("=HH", buf, off)
        if length < 4:
            break
        if kind & 0x3FFF == NFTA_GEN_ID:
            return int(struct.unpack_from(">I", buf, off + 4)[0])
        off += (length + 3) & ~3
    raise ReadbackError("generation", "the kernel sent no generation id")
