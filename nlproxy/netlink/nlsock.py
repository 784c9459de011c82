"""A NETLINK_NETFILTER socket: send nfnetlink batches and dumps, read replies, subscribe.

The transport of the nftables backend, the read-back, the drift monitor, conntrack and the
foreign-rules finder; :mod:`nlproxy.netlink.codec` frames and splits what it carries. Knows
netlink only: nothing here knows nftables or conntrack objects.
"""

from __future__ import annotations

import errno as errno_mod
import os
import socket
from collections.abc import Iterator

from nlproxy.netlink import netns
from nlproxy.netlink.codec import NLMSG_DONE, NLMSG_ERROR, Message, parse_messages

NETLINK_NETFILTER = 12
NETLINK_GENERIC = 16
"""Generic netlink (the IPVS family): the same framing; ``protocol=`` opens one instead."""
SOL_NETLINK = 270
NETLINK_EXT_ACK = 11
NETLINK_CAP_ACK = 10
SO_SNDBUFFORCE = 32
SO_RCVBUFFORCE = 33
NETLINK_ADD_MEMBERSHIP = 1


class NetfilterSocket:
    """A NETLINK_NETFILTER socket opened in network namespace ``netns`` (None: the current one).

    ``protocol=NETLINK_GENERIC`` opens a generic netlink socket with the same behaviour.
    Buffers are forced large (root or CAP_NET_ADMIN): the kernel answers a large batch with one
    message per failed (or acknowledged) operation, and must not drop them.
    """

    def __init__(
        self,
        netns_name: str | None = None,
        *,
        bufsize: int = 64 << 20,
        protocol: int = NETLINK_NETFILTER,
    ) -> None:
        with netns.entered(netns_name):
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, protocol)
        self.netns = netns_name
        for opt, fallback in (
            (SO_SNDBUFFORCE, socket.SO_SNDBUF),
            (SO_RCVBUFFORCE, socket.SO_RCVBUF),
        ):
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, opt, bufsize)
            except PermissionError:
                self.sock.setsockopt(socket.SOL_SOCKET, fallback, bufsize)
        for opt in (NETLINK_EXT_ACK, NETLINK_CAP_ACK):
            try:
                self.sock.setsockopt(SOL_NETLINK, opt, 1)
            except OSError as exc:  # older kernels: plain acks, still correct
                if exc.errno != errno_mod.ENOPROTOOPT:
                    raise
        self.sock.bind((0, 0))
        self.portid: int = self.sock.getsockname()[0]
        self._seq = 0

    def next_seq(self, count: int = 1) -> int:
        """Reserve ``count`` sequence numbers and return the first.

        Sequence numbers are 32-bit; they start again from 1 before they would wrap.
        """
        if self._seq + count >= 1 << 31:
            self._seq = 0
        first = self._seq + 1
        self._seq += count
        return first

    def skip_to(self, seq: int) -> None:
        """Record that numbers up to ``seq`` are used (a batch numbered its own messages)."""
        self._seq = max(self._seq, seq)

    def ensure_sndbuf(self, size: int) -> None:
        """Grow the send buffer so one datagram of ``size`` bytes fits (a batch is one send)."""
        current = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        if current - 64 < size:
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, size + (1 << 16))
            except PermissionError:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size + (1 << 16))

    def queued(self) -> Iterator[bytes | None]:
        """Each datagram already queued, without blocking; None where the kernel dropped some
        for lack of buffer (ENOBUFS). Ends when nothing more is queued."""
        self.sock.setblocking(False)
        try:
            while True:
                try:
                    buf = self.sock.recv(1 << 20)
                except BlockingIOError:
                    return
                except OSError as exc:
                    if exc.errno != errno_mod.ENOBUFS:
                        raise
                    yield None
                    continue
                yield buf
        finally:
            self.sock.setblocking(True)

    def drain(self) -> tuple[list[Message], bool]:
        """Read every datagram already queued, without blocking.

        Returns:
            the messages, and whether the kernel dropped some for lack of buffer (ENOBUFS).
        """
        out: list[Message] = []
        overflow = False
        for buf in self.queued():
            if buf is None:
                overflow = True
            else:
                out.extend(parse_messages(buf))
        return out, overflow

    def send(self, data: bytes | memoryview) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float | None = None) -> list[Message]:
        """Read one datagram (blocking up to ``timeout`` seconds) and split it into messages."""
        self.sock.settimeout(timeout)
        buf = self.sock.recv(1 << 20)
        return list(parse_messages(buf))

    def datagrams(self, request: bytes, timeout: float = 10.0) -> Iterator[bytes]:
        """Send ``request``; then each datagram that arrives, unsplit, for as long as asked
        (the caller reads the messages with :func:`~nlproxy.netlink.codec.headers`)."""
        self.send(request)
        self.sock.settimeout(timeout)
        while True:
            yield self.sock.recv(1 << 20)

    def subscribe(self, group: int) -> None:
        """Join multicast group ``group`` (e.g. NFNLGRP_NFTABLES); the notifications come in
        as datagrams, read with :meth:`queued` once the socket is readable."""
        self.sock.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, group)

    def dump(self, request: bytes, seq: int) -> Iterator[Message]:
        """Send a dump request whose header carries ``seq`` and yield replies until NLMSG_DONE.

        Raises:
            OSError: the kernel answered the dump with an error.
        """
        self.send(request)
        while True:
            for msg in self.recv(timeout=10.0):
                if msg.seq != seq:
                    continue
                if msg.type == NLMSG_DONE:
                    return
                if msg.type == NLMSG_ERROR:
                    if msg.error:
                        raise OSError(msg.error, os.strerror(msg.error))
                    return
                yield msg

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> NetfilterSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
