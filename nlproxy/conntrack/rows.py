"""The start-up sweep's reading of ctnetlink dump messages: rows, not flows.

The sweep (``sync/cleanup.py``) reads every UDP and SCTP flow of the node once per process: at
100k flows, :func:`~nlproxy.conntrack.messages.decode_flow` (a Flow, two tuples, four address
objects each) was most of its cost. :class:`SweepReader` reads only what the sweep decides with
(walking the attribute headers once per layout, then reading at the learnt offsets); anything
it does not expect is left to the full decoder (:func:`flow_row`), so both give the same row
for every message (``tests/unit/test_conntrack_sweep_row.py``; on the kernel's own messages,
``tests/kernel/test_conntrack_sweep_rows.py``).
Pure, as ``messages.py``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from typing import TypeAlias

from nlproxy.conntrack.messages import (
    CTA_ID,
    CTA_IP_V4_DST,
    CTA_IP_V4_SRC,
    CTA_IP_V6_DST,
    CTA_IP_V6_SRC,
    CTA_PROTO_DST_PORT,
    CTA_PROTO_ICMP_ID,
    CTA_PROTO_ICMPV6_CODE,
    CTA_PROTO_NUM,
    CTA_PROTO_SRC_PORT,
    CTA_STATUS,
    CTA_TUPLE_IP,
    CTA_TUPLE_ORIG,
    CTA_TUPLE_PROTO,
    CTA_TUPLE_REPLY,
    CTA_ZONE,
    IPS_DST_NAT,
    PROTO_NUMBERS,
    Flow,
    FlowFilter,
    IPAddress,
    delete_attrs,
)
from nlproxy.netlink.codec import spans_noting
from nlproxy.netlink.protocols import IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP

_BE16 = struct.Struct("!H")
_BE32 = struct.Struct("!I")

SweepRow: TypeAlias = tuple[int, IPAddress, int, IPAddress, int, int, bytes]
"""A flow as the sweep reads it: the original tuple's protocol number, destination address
and port, the reply tuple's source address and port, the status bits, and the attributes that
delete exactly this flow (its original tuple, zone and id: :func:`delete_attrs`)."""

SWEEP_PROTOS = frozenset({IPPROTO_TCP, IPPROTO_UDP, IPPROTO_SCTP})
"""The protocols :func:`sweep_row` reads (keyed by ports); others go to the full decoder."""

_ADDR_CACHE_MAX = 1 << 16
_unpack_be16 = _BE16.unpack_from
_unpack_be32 = _BE32.unpack_from


def _sweep_tuple(
    buf: bytes, off: int, end: int, seen: list[int]
) -> tuple[int, int, int, int, int, int] | None:
    """Where the tuple nest in ``buf[off:end]`` holds its source and destination (their
    offsets), its protocol number, source and destination ports (theirs), and the length of its
    addresses; None when it is not the plain ported tuple the sweep expects. The offset of each
    attribute header read is added to ``seen``."""
    src = dst = proto = sport = dport = -1
    src_len = dst_len = 0
    seen_ip = seen_proto = False
    for kind, start, stop in spans_noting(buf, off, end, seen):
        if kind not in (CTA_TUPLE_IP, CTA_TUPLE_PROTO):
            continue
        if seen_ip if kind == CTA_TUPLE_IP else seen_proto:
            return None  # repeated: the decoder merges them
        for k, at, until in spans_noting(buf, start, stop, seen):
            size = until - at
            if kind == CTA_TUPLE_IP:
                if k in (CTA_IP_V4_SRC, CTA_IP_V6_SRC):
                    src, src_len = at, size
                elif k in (CTA_IP_V4_DST, CTA_IP_V6_DST):
                    dst, dst_len = at, size
            elif k == CTA_PROTO_NUM:
                if size != 1:
                    return None
                proto = at
            elif k in (CTA_PROTO_SRC_PORT, CTA_PROTO_DST_PORT):
                if size != 2:
                    return None
                if k == CTA_PROTO_SRC_PORT:
                    sport = at
                else:
                    dport = at
            elif CTA_PROTO_ICMP_ID <= k <= CTA_PROTO_ICMPV6_CODE:
                return None  # an ICMP key: the decoder's
        if kind == CTA_TUPLE_IP:
            seen_ip = True
        else:
            seen_proto = True
    if min(src, dst, proto, sport, dport) < 0:
        return None
    if src_len != dst_len or src_len not in (4, 16):
        return None
    return src, dst, proto, sport, dport, src_len


@dataclass(frozen=True, slots=True)
class _RowLayout:
    """Where a message's attribute headers are and where the row's values sit in it: every
    message of the same length with the same header bytes at the same places is walked the
    same way, so its row is read at these offsets without the walk."""

    headers: struct.Struct
    expected: tuple[bytes, ...]
    orig: tuple[int, int]  # the original tuple's attribute, header included
    proto: tuple[int, int]  # the protocol numbers (original, reply)
    dst: int  # the original destination address
    dport: int
    rsrc: int  # the reply source address
    rsport: int
    size: int  # of an address
    status: int  # -1: none
    zone: int  # the zone's attribute, -1: none
    ident: int  # the id's attribute


# one piece: the walk whose every step the learnt layout must repeat
def _learn(payload: bytes) -> _RowLayout | None:
    """The layout of ``payload``, when it is a plain flow the sweep reads (else None)."""
    end = len(payload)
    off = 4  # NFGENMSG.size
    seen: list[int] = []
    orig = reply = None
    orig_at = (0, 0)
    status = zone = ident = -1
    for kind, start, stop in spans_noting(payload, off, end, seen):
        size = stop - start
        if kind == CTA_TUPLE_ORIG:
            if orig is not None:
                return None
            orig_at = (start - 4, stop)
            orig = _sweep_tuple(payload, start, stop, seen)
            if orig is None:
                return None
        elif kind == CTA_TUPLE_REPLY:
            if reply is not None:
                return None
            reply = _sweep_tuple(payload, start, stop, seen)
            if reply is None:
                return None
        elif kind == CTA_STATUS:
            if size != 4 or status >= 0:
                return None
            status = start
        elif kind == CTA_ZONE:
            if size != 2 or zone >= 0:
                return None
            zone = start - 4
        elif kind == CTA_ID:
            if size != 4 or ident >= 0:
                return None
            ident = start - 4
    if orig is None or reply is None or ident < 0 or orig[5] != reply[5]:
        return None
    fmt, at = ["="], 0
    for o in sorted(seen):
        fmt.append(f"{o - at}x4s")
        at = o + 4
    headers = struct.Struct("".join(fmt))
    return _RowLayout(
        headers=headers,
        expected=headers.unpack_from(payload),
        orig=orig_at,
        proto=(orig[2], reply[2]),
        dst=orig[1],
        dport=orig[4],
        rsrc=reply[0],
        rsport=reply[3],
        size=orig[5],
        status=status,
        zone=zone,
        ident=ident,
    )


class SweepReader:
    """:func:`sweep_row` for the messages of dumps: the layouts it learns (a dump's messages
    mostly share a few) are read at their offsets, and address objects are made once."""

    def __init__(self) -> None:
        self.addrs: dict[bytes, IPAddress] = {}
        self._layouts: dict[int, _RowLayout] = {}

    def row(self, payload: bytes) -> SweepRow | None:
        """:func:`sweep_row` of ``payload``."""
        lay = self._layouts.get(len(payload))
        if lay is None or lay.headers.unpack_from(payload) != lay.expected:
            lay = _learn(payload)
            if lay is None:
                return None
            self._layouts[len(payload)] = lay
        l4, reply_l4 = payload[lay.proto[0]], payload[lay.proto[1]]
        if l4 != reply_l4 or l4 not in SWEEP_PROTOS:
            return None
        addrs = self.addrs
        dst = payload[lay.dst : lay.dst + lay.size]
        dst_addr = addrs.get(dst)
        if dst_addr is None:
            dst_addr = addrs[dst] = _address(dst, addrs)
        rsrc = payload[lay.rsrc : lay.rsrc + lay.size]
        rsrc_addr = addrs.get(rsrc)
        if rsrc_addr is None:
            rsrc_addr = addrs[rsrc] = _address(rsrc, addrs)
        status = 0 if lay.status < 0 else _unpack_be32(payload, lay.status)[0]
        start, stop = lay.orig
        handle = payload[start:stop] + bytes(-(stop - start) % 4)
        # The zone's attribute only when not 0, as delete_attrs writes it.
        if lay.zone >= 0 and payload[lay.zone + 4 : lay.zone + 6] != b"\0\0":
            handle += payload[lay.zone : lay.zone + 6] + b"\0\0"
        handle += payload[lay.ident : lay.ident + 8]
        return (
            l4,
            dst_addr,
            _unpack_be16(payload, lay.dport)[0],
            rsrc_addr,
            _unpack_be16(payload, lay.rsport)[0],
            status,
            handle,
        )


def sweep_row(payload: bytes, addrs: dict[bytes, IPAddress]) -> SweepRow | None:
    """The :data:`SweepRow` of a dump message's payload, read without decoding the flow; None
    when the message is not a plain TCP, UDP or SCTP flow with one of each attribute the row
    needs (then :func:`flow_row` of :func:`decode_flow` gives it). ``addrs`` caches address
    objects by their bytes (a node's flows go to few frontends from few backends)."""
    reader = SweepReader()
    reader.addrs = addrs
    return reader.row(payload)


def _address(packed: bytes, addrs: dict[bytes, IPAddress]) -> IPAddress:
    if len(addrs) >= _ADDR_CACHE_MAX:
        addrs.clear()
    return IPv4Address(packed) if len(packed) == 4 else IPv6Address(packed)


def flow_row(flow: Flow) -> SweepRow:
    """``flow`` as :func:`sweep_row` reads it."""
    o, r = flow.orig, flow.reply
    return (o.proto, o.dst, o.dport, r.src, r.sport, flow.status, delete_attrs(flow))


def row_matches(flt: FlowFilter, row: SweepRow) -> bool:
    """:meth:`FlowFilter.matches` on a :data:`SweepRow`."""
    return row_matcher(flt)(row)


def row_matcher(flt: FlowFilter) -> Callable[[SweepRow], bool]:
    """:func:`row_matches` for ``flt``, checking only the fields it gives."""
    checks: list[Callable[[SweepRow], bool]] = []
    if flt.family is not None:
        family = flt.family
        checks.append(lambda r: r[1].version == family)
    if flt.proto is not None:
        number = PROTO_NUMBERS[flt.proto]
        checks.append(lambda r: r[0] == number)
    for i, want in ((1, flt.orig_dst), (2, flt.orig_dport), (3, flt.reply_src)):
        if want is not None:
            checks.append(lambda r, i=i, want=want: r[i] == want)  # type: ignore[misc]
    if flt.reply_sport is not None:
        sport = flt.reply_sport
        checks.append(lambda r: r[4] == sport)
    if flt.dnat is not None:
        dnat = flt.dnat
        checks.append(lambda r: bool(r[5] & IPS_DST_NAT) == dnat)
    if len(checks) == 1:
        return checks[0]
    return lambda r: all(c(r) for c in checks)
