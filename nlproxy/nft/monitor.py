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

import errno
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

import trio

from nlproxy.errors import NlproxyError
from nlproxy.netlink.codec import (
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
    NFT_MSG_NEWGEN,
    NFTA_GEN_ID,
    NFTA_GEN_PROC_NAME,
    NFTA_GEN_PROC_PID,
    NFTA_TABLE_NAME,
)

POLL_SECONDS = 0.5
"""How often the generation watch asks for the generation: a foreign change is seen within half
a second, read back and repaired within a second (a small table's; a read-back of 10k Services
x 10 endpoints takes longer). The request itself is a few microseconds hot; what a look costs
is the wake-up of a thread on a host where it is always cold: 60 us of CPU for a wake-up of a
C thread alone and 120-210 us with the look, 150-300 us a look in the idle daemon at 10k
Services x 10 endpoints (the thread's ``schedstat``), 0.01-0.04 s a minute at two looks a second
(a Python thread's look cost 0.5-0.7 ms there: ``GenerationWatch``)."""

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

    The periodic looks are made by a thread of the native shim's (``native/genwatch.c``) that
    runs no Python: it sleeps in ``poll()`` between looks and writes to a socket pair, which the
    event loop waits on, only when the generation moved. An idle node's watch costs its GETGEN
    requests and nothing of the interpreter's: a Python thread's wake-up ran ~40 lines of
    bytecode, cold in a large process (0.5-0.7 ms a look in the daemon at 10k Services x 10
    endpoints against ~0.2 ms alone; ``bench/bench_watch_idle.py``). The socket and the last
    generation seen are shared, under the shim's lock, with :meth:`look` and :meth:`current`:
    a move one look took is not reported by another.
    """

    def __init__(self, *, netns_name: str | None = None, interval: float = POLL_SECONDS) -> None:
        from nlproxy._nftshim import ffi, lib

        self.interval = interval
        sock = NetfilterSocket(netns_name, bufsize=1 << 16)
        err = ffi.new("int *")
        gw = lib.nls_gw_new(sock.sock.fileno(), err)
        if gw == ffi.NULL:
            sock.close()
            _raise(err[0])
        sock.sock.detach()  # the watch's now: closed by its thread, or when the watch goes
        self._gw = ffi.gc(gw, lib.nls_gw_release)
        self._lib, self._ffi = lib, ffi
        self.wakes = 0
        """Times :meth:`run` was woken by the thread (each for at least one move)."""

    @property
    def seen(self) -> int:
        """The generation at the last look: every move up to it has been reported."""
        return int(self._lib.nls_gw_seen(self._gw))

    @property
    def looks(self) -> int:
        """Looks made so far (by :meth:`run`'s thread or :meth:`look`)."""
        return int(self._lib.nls_gw_looks(self._gw))

    @property
    def running(self) -> bool:
        """Whether :meth:`run`'s thread is there (it ends soon after the run returns, and closes
        the socket: :meth:`look` and :meth:`current` raise OSError then)."""
        return bool(self._lib.nls_gw_running(self._gw))

    def current(self) -> int:
        """The kernel's generation now (one GETGEN); any thread may call it.

        Raises:
            OSError: the kernel refused, did not answer within 10 s, or the socket is closed.
            ReadbackError: its answer holds no generation id.
        """
        out = self._ffi.new("uint32_t[2]")
        _check(self._lib.nls_gw_generation(self._gw, out))
        return int(out[0])

    def look(self) -> tuple[int, int] | None:
        """The span the generation moved by since the last look (None: it did not); raises as
        :meth:`current`."""
        out = self._ffi.new("uint32_t[2]")
        if _check(self._lib.nls_gw_look(self._gw, out, out + 1)) == 0:
            return None
        return int(out[0]), int(out[1])

    async def run(
        self,
        on_moved: Callable[[int, int], None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Call ``on_moved(after, upto)`` on the event loop for each move, looked for every
        :attr:`interval` seconds by the shim's thread, until cancelled. A look that fails (the
        kernel's answer unreadable) is tried at the next one: the generation it missed is still
        there to see. Once per watch.

        Cancellation: returns at once, closing the event loop's end of the pair; the thread
        ends at its next ``poll()`` (at once: it is woken by the close) and closes the netlink
        socket. Nothing waits for it.
        """
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            interval_ms = max(1, round(self.interval * 1000))
            peer = theirs.detach()  # the thread's once it starts (it closes it as it ends)
            rc = self._lib.nls_gw_start(self._gw, peer, interval_ms)
            if rc != 0:
                os.close(peer)
                _raise(rc)
            mine.setblocking(False)
            task_status.started()
            while True:
                await trio.lowlevel.wait_readable(mine)
                self.wakes += 1
                while True:
                    try:
                        span = mine.recv(_SPAN.size)
                    except BlockingIOError:
                        break
                    if not span:  # the thread ended of itself (poll() failed)
                        # Not quietly: without it, no other writer's change is seen before the
                        # periodic verify. A restarted daemon has its watch again.
                        raise NlproxyError(
                            "generation watch",
                            "its thread ended unasked (the kernel refused its wait); another "
                            "writer's changes would go unseen until the next verify",
                        )
                    on_moved(*_SPAN.unpack(span))
        finally:
            mine.close()


_SPAN = struct.Struct("=II")  # what the shim's thread writes: after, upto


def _check(rc: int) -> int:
    if rc < 0:
        _raise(rc)
    return rc


def _raise(rc: int) -> NoReturn:
    """The shim's negative errno as the exception :meth:`GenerationWatch.look` documents."""
    if rc == -errno.ENODATA:
        raise ReadbackError("generation", "the kernel sent no generation id")
    raise OSError(-rc, os.strerror(-rc))
