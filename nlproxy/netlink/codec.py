"""The netlink codec: message headers (nlmsghdr, nfgenmsg, NLMSG_ERROR) and attributes (nlattr).

One copy of the framing under the nftables backend, the read-back, the drift monitor, conntrack
and the foreign-rules finder; :mod:`nlproxy.netlink.nlsock` carries what it encodes. Pure: no
sockets, no I/O. Knows netlink and nfnetlink framing only: the numbers of nftables and conntrack
attributes live with their users (``nft/uapi.py``, ``conntrack/messages.py``). Names and numbers
are the kernel's (linux/netlink.h, linux/netfilter/nfnetlink.h).

Decoding comes in two forms: :func:`attributes` and :func:`attribute_map` copy each payload out
(small messages: a table, a chain, a notification), while :func:`spans` and :func:`span_map` give
offsets into the buffer, for the hot paths that read 100k+ elements or flows without copying.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

# linux/netlink.h
NLMSG_NOOP = 1
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_DUMP_INTR = 0x10
NLM_F_REPLACE = 0x100
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
NLM_F_APPEND = 0x800
NLM_F_DUMP = 0x300  # NLM_F_ROOT | NLM_F_MATCH
NLM_F_CAPPED = 0x100  # in NLMSG_ERROR: the original payload was left out
NLM_F_ACK_TLVS = 0x200  # in NLMSG_ERROR: extended ack attributes follow
NLMSGERR_ATTR_MSG = 1
NLMSGERR_ATTR_OFFS = 2
NLA_F_NESTED = 0x8000
NLA_F_NET_BYTEORDER = 0x4000
NLA_TYPE_MASK = 0x3FFF  # ~(NLA_F_NESTED | NLA_F_NET_BYTEORDER)
# linux/netfilter/nfnetlink.h
NFNL_MSG_BATCH_BEGIN = 0x10  # NLMSG_MIN_TYPE
NFNL_MSG_BATCH_END = 0x11

NLMSGHDR = struct.Struct("=IHHII")
"""struct nlmsghdr: length, type, flags, seq, pid (host order)."""
NFGENMSG = struct.Struct("!BBH")
"""struct nfgenmsg: family, version, res_id (big-endian)."""
NLATTR = struct.Struct("=HH")
"""struct nlattr: length, type (host order)."""
_unpack_nlattr = NLATTR.unpack_from  # bound once: the walks below are hot
_unpack_nlmsghdr = NLMSGHDR.unpack_from
_I32 = struct.Struct("=i")
_U32 = struct.Struct("=I")
_BE16 = struct.Struct("!H")
_BE32 = struct.Struct("!I")
_BE64 = struct.Struct("!Q")


def align(length: int) -> int:
    """``length`` rounded up to the 4-byte alignment of messages and attributes (NLA_ALIGN)."""
    return (length + 3) & ~3


# ---------------------------------------------------------------------------------------------
# Messages


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
        code: int = _I32.unpack_from(self.payload)[0]
        return -code

    @property
    def error_seq(self) -> int:
        """For NLMSG_ERROR: the sequence number of the message it answers."""
        return int(NLMSGHDR.unpack_from(self.payload, 4)[3])

    def ext_ack(self) -> tuple[str, int | None]:
        """For NLMSG_ERROR: the extended ack's message and offset of the bad attribute.

        The offset counts from the start of the original message (its netlink header); with
        NETLINK_CAP_ACK the original payload is not echoed, so the TLVs follow its header.
        """
        if not self.flags & NLM_F_ACK_TLVS:
            return "", None
        off = 4 + NLMSGHDR.size
        if not self.flags & NLM_F_CAPPED:
            off = 4 + NLMSGHDR.unpack_from(self.payload, 4)[0]
        tlvs = attribute_map(self.payload, off)
        offs = tlvs.get(NLMSGERR_ATTR_OFFS, b"")
        where = _U32.unpack(offs[:4])[0] if len(offs) >= 4 else None
        return text(tlvs.get(NLMSGERR_ATTR_MSG, b"")), where


def headers(buf: bytes) -> Iterator[tuple[int, int, int, int, int]]:
    """(type, flags, seq, payload start, payload end) of each message in a datagram, without
    copying its payload (a conntrack dump is read this way, 100k+ messages)."""
    off, size = 0, len(buf)
    while off + 16 <= size:  # NLMSGHDR.size, a literal: hot
        length, mtype, flags, seq, _pid = _unpack_nlmsghdr(buf, off)
        if length < 16:
            return
        yield mtype, flags, seq, off + 16, off + length
        off += (length + 3) & ~3


def parse_messages(buf: bytes) -> Iterator[Message]:
    """Split a datagram into netlink messages."""
    for mtype, flags, seq, start, end in headers(buf):
        yield Message(mtype, flags, seq, buf[start:end])


def error_code(buf: bytes, start: int) -> int:
    """The (positive) errno of the NLMSG_ERROR whose payload starts at ``start``; 0: an ACK."""
    return -int(_I32.unpack_from(buf, start)[0])


def nlmsghdr(length: int, mtype: int, flags: int, seq: int, pid: int = 0) -> bytes:
    """A netlink header for a message of ``length`` bytes in all (header included)."""
    return NLMSGHDR.pack(length, mtype, flags, seq, pid)


def nfnl_type(subsys: int, msg: int) -> int:
    """The nlmsg_type of nfnetlink message ``msg`` of subsystem ``subsys``."""
    return (subsys << 8) | msg


def nfnl_message(
    mtype: int, flags: int, seq: int, family: int, attrs: bytes = b"", res_id: int = 0
) -> bytes:
    """One nfnetlink message: netlink header, nfgenmsg (NFNETLINK_V0) and ``attrs``.

    ``mtype`` is the whole nlmsg_type (:func:`nfnl_type`, or a batch delimiter); ``res_id`` is
    the subsystem for NFNL_MSG_BATCH_BEGIN/END.
    """
    length = NLMSGHDR.size + NFGENMSG.size + len(attrs)
    return NLMSGHDR.pack(length, mtype, flags, seq, 0) + NFGENMSG.pack(family, 0, res_id) + attrs


# ---------------------------------------------------------------------------------------------
# Attributes: encoding


def attr(kind: int, value: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    return NLATTR.pack(4 + len(value), kind) + value + bytes(-len(value) % 4)


def nest(kind: int, *children: bytes) -> bytes:
    """A nested attribute (NLA_F_NESTED) holding ``children``."""
    return attr(kind | NLA_F_NESTED, b"".join(children))


def str_attr(kind: int, value: str) -> bytes:
    """A NUL-terminated string attribute (table, chain and set names)."""
    return attr(kind, value.encode() + b"\0")


def u8_attr(kind: int, value: int) -> bytes:
    return attr(kind, bytes((value,)))


def be16_attr(kind: int, value: int) -> bytes:
    return attr(kind, _BE16.pack(value))


def be32_attr(kind: int, value: int) -> bytes:
    return attr(kind, _BE32.pack(value))


def be64_attr(kind: int, value: int) -> bytes:
    return attr(kind, _BE64.pack(value))


def u32_attr(kind: int, value: int) -> bytes:
    """A host-order 32-bit attribute."""
    return attr(kind, _U32.pack(value))


# ---------------------------------------------------------------------------------------------
# Attributes: decoding


def spans(buf: bytes, off: int = 0, end: int | None = None) -> Iterator[tuple[int, int, int]]:
    """(type, payload start, payload end) of each attribute in ``buf[off:end]``; the NLA_F_*
    flags are masked off. The walk stops at an attribute shorter than its header or longer
    than what is left."""
    if end is None:
        end = len(buf)
    while off + 4 <= end:
        length, kind = _unpack_nlattr(buf, off)
        stop = off + length
        if length < 4 or stop > end:
            return
        yield kind & 0x3FFF, off + 4, stop  # NLA_TYPE_MASK, a literal: this loop is hot
        off += (length + 3) & ~3


def spans_noting(buf: bytes, off: int, end: int, seen: list[int]) -> Iterator[tuple[int, int, int]]:
    """:func:`spans`, adding to ``seen`` the offset of each header read, including one that
    stopped the walk (what a learnt layout must find again to be read the same way)."""
    for kind, start, stop in spans(buf, off, end):
        seen.append(off)
        yield kind, start, stop
        off = start - 4 + align(stop - start + 4)
    if off + 4 <= end:
        seen.append(off)


def span_map(
    buf: bytes, off: int = 0, end: int | None = None, seen: list[int] | None = None
) -> dict[int, tuple[int, int]]:
    """:func:`spans` as a map: type -> (payload start, payload end). A repeated type keeps its
    last occurrence, as the kernel's and libnftnl's parsers do. ``seen``: as
    :func:`spans_noting`."""
    if seen is not None:
        walk = spans_noting(buf, off, len(buf) if end is None else end, seen)
        return {kind: (start, stop) for kind, start, stop in walk}
    return {kind: (start, stop) for kind, start, stop in spans(buf, off, end)}


def attributes(buf: bytes, off: int = 0) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of each attribute from ``off`` on; the NLA_F_* flags are masked off."""
    for kind, start, stop in spans(buf, off):
        yield kind, buf[start:stop]


def attribute_map(buf: bytes, off: int = 0) -> dict[int, bytes]:
    """:func:`attributes` as a map: type -> payload (a repeated type keeps its last)."""
    return {kind: buf[start:stop] for kind, start, stop in spans(buf, off)}


def nfnl_attributes(payload: bytes) -> dict[int, bytes]:
    """The top-level attributes of an nfnetlink message's payload (after its nfgenmsg)."""
    return attribute_map(payload, NFGENMSG.size)


def text(raw: bytes) -> str:
    """A NUL-terminated string attribute's text."""
    return raw.rstrip(b"\0").decode(errors="replace")


def be16(raw: bytes, off: int = 0) -> int:
    return int(_BE16.unpack_from(raw, off)[0])


def be32(raw: bytes, off: int = 0) -> int:
    return int(_BE32.unpack_from(raw, off)[0])


def be64(raw: bytes, off: int = 0) -> int:
    return int(_BE64.unpack_from(raw, off)[0])
