"""A NETLINK_NETFILTER socket: send nfnetlink batches and dumps, read replies.

The transport of the nftables backend, the read-back, conntrack and the foreign-rules finder.
Knows netlink framing only: nothing here knows nftables or conntrack objects.
"""

from __future__ import annotations

import errno as errno_mod
import os
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from nlproxy.netlink import netns

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_EXT_ACK = 11
NETLINK_CAP_ACK = 10
SO_SNDBUFFORCE = 32
SO_RCVBUFFORCE = 33

NLMSG_NOOP = 1
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLM_F_CAPPED = 0x100  # in NLMSG_ERROR: the original payload was left out
NLM_F_ACK_TLVS = 0x200  # in NLMSG_ERROR: extended ack attributes follow
NLMSGERR_ATTR_MSG = 1
NLMSGERR_ATTR_OFFS = 2

_HDR = struct.Struct("=IHHII")


@dataclass(frozen=True, slots=True)
class Message:
    """One netlink message as received: header fields and payload (after the 16-byte header)."""

    type: int
    flags: int
    seq: int
    payload: bytes

    @property
    def error(self) -> int:
        """For NLMSG_ERROR: the (positive) errno, 0 for an ACK."""
        code: int = struct.unpack_from("=i", self.payload)[0]
        return -code

    @property
    def error_seq(self) -> int:
        """For NLMSG_ERROR: the sequence number of the message it answers."""
        return int(_HDR.unpack_from(self.payload, 4)[3])

    def ext_ack(self) -> tuple[str, int | None]:
        """For NLMSG_ERROR: the extended ack's message and offset of the bad attribute.

        The offset counts from the start of the original message (its netlink header); with
        NETLINK_CAP_ACK the original payload is not echoed, so the TLVs follow its header.
        """
        if not self.flags & NLM_F_ACK_TLVS:
            return "", None
        off = 4 + _HDR.size
        if not self.flags & NLM_F_CAPPED:
            off = 4 + _HDR.unpack_from(self.payload, 4)[0]
        text, where = "", None
        while off + 4 <= len(self.payload):
            length, kind = struct.unpack_from("=HH", self.payload, off)
            if length < 4:
                break
            value = self.payload[off + 4 : off + length]
            if kind == NLMSGERR_ATTR_MSG:
                text = value.rstrip(b"\0").decode(errors="replace")
            elif kind == NLMSGERR_ATTR_OFFS and len(value) >= 4:
                where = struct.unpack_from("=I", value)[0]
            off += (length + 3) & ~3
        return text, where


def attr(kind: int, value: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    return struct.pack("=HH", 4 + len(value), kind) + value + bytes(-len(value) % 4)


def str_attr(kind: int, text: str) -> bytes:
    """A NUL-terminated string attribute (table, chain and set names)."""
    return attr(kind, text.encode() + b"\0")


def attributes(buf: bytes) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of each attribute in ``buf``; the nested flag is masked off."""
    off = 0
    while off + 4 <= len(buf):
        length, kind = struct.unpack_from("=HH", buf, off)
        if length < 4:
            return
        yield kind & 0x3FFF, buf[off + 4 : off + length]
        off += (length + 3) & ~3


def text(raw: bytes) -> str:
    """A NUL-terminated string attribute's text."""
    return raw.rstrip(b"\0").decode(errors="replace")


def parse_messages(buf: bytes) -> Iterator[Message]:
    """Split a datagram into netlink messages."""
    off = 0
    while off + _HDR.size <= len(buf):
        length, mtype, flags, seq, _pid = _HDR.unpack_from(buf, off)
        if length < _HDR.size:
            break
        yield Message(mtype, flags, seq, buf[off + _HDR.size : off + length])
        off += (length + 3) & ~3


class NetfilterSocket:
    """A NETLINK_NETFILTER socket opened in network namespace ``netns`` (None: the current one).

    Buffers are forced large (root or CAP_NET_ADMIN): the kernel answers a large batch with one
    message per failed (or acknowledged) operation, and must not drop them.
    """

    def __init__(self, netns_name: str | None = None, *, bufsize: int = 64 << 20) -> None:
        with netns.entered(netns_name):
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
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

    def drain(self) -> tuple[list[Message], bool]:
        """Read every datagram already queued, without blocking.

        Returns:
            the messages, and whether the kernel dropped some for lack of buffer (ENOBUFS).
        """
        out: list[Message] = []
        overflow = False
        self.sock.setblocking(False)
        try:
            while True:
                try:
                    buf = self.sock.recv(1 << 20)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno != errno_mod.ENOBUFS:
                        raise
                    overflow = True
                    continue
                out.extend(parse_messages(buf))
        finally:
            self.sock.setblocking(True)
        return out, overflow

    def send(self, data: bytes | memoryview) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float | None = None) -> list[Message]:
        """Read one datagram (blocking up to ``timeout`` seconds) and split it into messages."""
        self.sock.settimeout(timeout)
        buf = self.sock.recv(1 << 20)
        return list(parse_messages(buf))

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
