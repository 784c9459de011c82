"""A NETLINK_NETFILTER socket: send nfnetlink batches and dumps, read replies.

The kernel backend's transport. Knows netlink framing only: nothing here knows nftables objects.
"""

from __future__ import annotations

import errno as errno_mod
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from nlproxy import netns

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
        """Reserve ``count`` sequence numbers and return the first."""
        first = self._seq + 1
        self._seq += count
        return first

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
                        raise OSError(msg.error, errno_mod.errorcode.get(msg.error, "?"))
                    return
                yield msg

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> NetfilterSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
