"""Wake the inspector when links, routes or neighbours change: rtnetlink multicast, no polling.

Sits beside ``inspect.py``: the daemon's inspector task waits here and re-runs
:func:`nlproxy.inspect.classify.classify` after a change. It only listens; it reports *that*
something
changed, never what, and never reads or changes routes itself.

Neighbour entries move between reachable, stale and delay with every burst of traffic; only the
changes the classifier cares about wake the caller: an entry becoming FAILED, leaving FAILED, or
being deleted.
"""

from __future__ import annotations

import errno
import math
import select
import socket
import struct
import time
from typing import Self

import trio

from nlproxy.inspect.rtnl import NUD_FAILED
from nlproxy.netlink import netns
from nlproxy.netlink.codec import headers, spans

NETLINK_ROUTE = 0
RTMGRP_LINK = 0x1
RTMGRP_NEIGH = 0x4
RTMGRP_IPV4_IFADDR = 0x10
RTMGRP_IPV4_ROUTE = 0x40
RTMGRP_IPV6_IFADDR = 0x100
RTMGRP_IPV6_ROUTE = 0x400
ROUTE_GROUPS = RTMGRP_LINK | RTMGRP_NEIGH | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE
"""What the reachability classifier depends on."""
ADDRESS_GROUPS = RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR
"""Addresses added to or removed from interfaces (every such message is a change)."""
RTM_NEWNEIGH = 28
RTM_DELNEIGH = 29
NDA_DST = 1
SO_RCVBUFFORCE = 33

_NDMSG = struct.Struct("=BxxxiHBB")


def _neigh_key(payload: bytes) -> tuple[tuple[int, bytes], int]:
    """(ifindex, NDA_DST bytes) and the NUD state of an ndmsg payload."""
    _family, ifindex, state, _flags, _type = _NDMSG.unpack_from(payload)
    dst = b""
    for kind, start, stop in spans(payload, _NDMSG.size):
        if kind == NDA_DST:
            dst = payload[start:stop]
    return (ifindex, dst), state


class RouteWatcher:
    """Subscribe to rtnetlink link, route and neighbour notifications in ``netns`` (or to other
    ``groups``, such as :data:`ADDRESS_GROUPS`).

    Open it before the first classification, so nothing that changes in between is missed.
    Use as a context manager, or call :meth:`close`.

    Raises:
        ConfigError: ``netns`` cannot be entered.
    """

    def __init__(
        self, netns_name: str | None = None, *, groups: int = ROUTE_GROUPS, rcvbuf: int = 4 << 20
    ) -> None:
        with netns.entered(netns_name):
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        try:
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, rcvbuf)
            except PermissionError:  # without CAP_NET_ADMIN: capped at net.core.rmem_max
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            sock.bind((0, groups))
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._failed: set[tuple[int, bytes]] = set()

    def fileno(self) -> int:
        return self._sock.fileno()

    def _relevant(self, buf: bytes) -> bool:
        changed = False
        for mtype, _flags, _seq, start, end in headers(buf):
            if mtype not in (RTM_NEWNEIGH, RTM_DELNEIGH):
                changed = True
                continue
            key, state = _neigh_key(buf[start:end])
            was_failed = key in self._failed
            if mtype == RTM_NEWNEIGH and state & NUD_FAILED:
                self._failed.add(key)
                changed = changed or not was_failed
            else:
                self._failed.discard(key)
                changed = changed or was_failed or mtype == RTM_DELNEIGH
        return changed

    def drain(self) -> bool:
        """Read every pending notification; True when one of them matters to the classifier.

        An overrun receive buffer (ENOBUFS: notifications were lost) counts as a change.
        """
        changed = False
        while True:
            try:
                buf = self._sock.recv(1 << 16)
            except BlockingIOError:
                return changed
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                changed = True
                continue
            changed = self._relevant(buf) or changed

    def wait_for_change(self, timeout: float | None = None) -> bool:
        """Block until a relevant change arrives (True) or ``timeout`` seconds pass (False).

        For a thread (``trio.to_thread.run_sync``); trio code uses :meth:`changed` instead.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        poller = select.poll()
        poller.register(self._sock, select.POLLIN)
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = poller.poll(None if left is None else math.ceil(left * 1000))
            if ready and self.drain():
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    async def changed(self) -> None:
        """Wait until a relevant change arrives.

        Cancellation: safe at any point; notifications not yet read stay queued for the next call.
        """
        while True:
            await trio.lowlevel.wait_readable(self._sock)
            if self.drain():
                return

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
