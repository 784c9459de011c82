"""ctnetlink messages: encode dump/delete/create requests, decode the flows the kernel sends back.

The bytes layer under :mod:`nlproxy.conntrack.kernel`. Pure: no sockets, no clock, no logging; it
knows
the ctnetlink wire format (linux/netfilter/nfnetlink_conntrack.h) and nothing about Services.

pyroute2's ``NFCTSocket.dump`` filters on the original *or* the reply tuple, never both in one
request, and decodes every attribute into generic objects; stale-flow cleanup needs "original
destination = frontend AND reply source = backend" in one kernel-side pass, so the messages are
built here with ``struct``.
"""

from __future__ import annotations

import functools
import socket
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from typing import Any, TypeAlias

from nlproxy.netlink import protocols
from nlproxy.netlink.codec import (
    NFGENMSG,
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_EXCL,
    NLM_F_REQUEST,
    attr,
    be16_attr,
    be32_attr,
    nest,
    nfnl_message,
    nfnl_type,
    spans,
    u8_attr,
    u32_attr,
)
from nlproxy.netlink.protocols import IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP

IPAddress: TypeAlias = IPv4Address | IPv6Address

# nfnetlink subsystem and message types (linux/netfilter/nfnetlink.h, nfnetlink_conntrack.h).
NFNL_SUBSYS_CTNETLINK = 1
IPCTNL_MSG_CT_NEW = 0
IPCTNL_MSG_CT_GET = 1
IPCTNL_MSG_CT_DELETE = 2

# enum ctattr_type
CTA_TUPLE_ORIG = 1
CTA_TUPLE_REPLY = 2
CTA_STATUS = 3
CTA_PROTOINFO = 4
CTA_TIMEOUT = 7
CTA_MARK = 8
CTA_USE = 11
CTA_ID = 12
CTA_ZONE = 18
CTA_FILTER = 25
CTA_STATUS_MASK = 26
# enum ctattr_tuple
CTA_TUPLE_IP = 1
CTA_TUPLE_PROTO = 2
# enum ctattr_ip
CTA_IP_V4_SRC = 1
CTA_IP_V4_DST = 2
CTA_IP_V6_SRC = 3
CTA_IP_V6_DST = 4
# enum ctattr_l4proto
CTA_PROTO_NUM = 1
CTA_PROTO_SRC_PORT = 2
CTA_PROTO_DST_PORT = 3
CTA_PROTO_ICMP_ID = 4
CTA_PROTO_ICMP_TYPE = 5
CTA_PROTO_ICMP_CODE = 6
CTA_PROTO_ICMPV6_ID = 7
CTA_PROTO_ICMPV6_TYPE = 8
CTA_PROTO_ICMPV6_CODE = 9
# enum ctattr_protoinfo / ctattr_protoinfo_tcp / ctattr_protoinfo_sctp
CTA_PROTOINFO_TCP = 1
CTA_PROTOINFO_SCTP = 3
CTA_PROTOINFO_TCP_STATE = 1
CTA_PROTOINFO_SCTP_STATE = 1
# enum ctattr_filter
CTA_FILTER_ORIG_FLAGS = 1
CTA_FILTER_REPLY_FLAGS = 2
# CTA_FILTER_F_* (net/netfilter/nf_internals.h; not in the uapi headers)
CTA_FILTER_F_CTA_IP_SRC = 1 << 0
CTA_FILTER_F_CTA_IP_DST = 1 << 1
CTA_FILTER_F_CTA_PROTO_NUM = 1 << 3
CTA_FILTER_F_CTA_PROTO_SRC_PORT = 1 << 4
CTA_FILTER_F_CTA_PROTO_DST_PORT = 1 << 5

# enum ip_conntrack_status (linux/netfilter/nf_conntrack_common.h)
IPS_SEEN_REPLY = 1 << 1
IPS_ASSURED = 1 << 2
IPS_DST_NAT = 1 << 5
"""Status bit: the flow's destination was rewritten (DNAT)."""
IPS_OFFLOAD = 1 << 14
IPS_HW_OFFLOAD = 1 << 15

# enum tcp_conntrack and enum sctp_conntrack (linux/netfilter/nf_conntrack_{tcp,sctp}.h), as
# ``conntrack -L`` names them.
TCP_STATES = (
    "NONE",
    "SYN_SENT",
    "SYN_RECV",
    "ESTABLISHED",
    "FIN_WAIT",
    "CLOSE_WAIT",
    "LAST_ACK",
    "TIME_WAIT",
    "CLOSE",
    "SYN_SENT2",
)
SCTP_STATES = (
    "NONE",
    "CLOSED",
    "COOKIE_WAIT",
    "COOKIE_ECHOED",
    "ESTABLISHED",
    "SHUTDOWN_SENT",
    "SHUTDOWN_RECD",
    "SHUTDOWN_ACK_SENT",
    "HEARTBEAT_SENT",
    "HEARTBEAT_ACKED",
)

PROTO_NUMBERS = {name: protocols.NUMBERS[name] for name in ("tcp", "udp", "sctp")}
"""The protocols a filter selects by (a Service's)."""
PROTO_NAMES = {num: name for name, num in PROTO_NUMBERS.items()}
LINE_PROTO_NAMES = protocols.NAMES
"""How ``conntrack -L`` names protocols."""
PORT_PROTOS = protocols.WITH_PORTS
# The kernel's tuple filter compares ports only for these protocols (ctnetlink_filter_match_tuple);
# for others a port filter is ignored there and must be checked here.
KERNEL_PORT_FILTER_PROTOS = frozenset({IPPROTO_TCP, IPPROTO_UDP})

_BE16 = struct.Struct("!H")
_BE32 = struct.Struct("!I")
_U32 = struct.Struct("=I")
_nla, _nest = attr, nest  # the names the unit tests build messages with


# ---------------------------------------------------------------------------------------------
# The attribute tree, declared once
#
# What nlproxy reads and writes of a ctnetlink message, nested as the kernel nests it
# (ctnetlink_fill_info, ctnetlink_parse_tuple, ctnetlink_parse_filter). The encoder, the decoder
# and the walk that learns line layouts all read this one table.


@dataclass(frozen=True, slots=True)
class Leaf:
    """An attribute holding one value: the field it fills, how the value is packed, and when
    it is the one written.

    ``code``: ``B``, ``H`` or ``I`` (big-endian, as ctnetlink sends numbers), ``=I`` (host
    order: the filter flags) or ``addr`` (4 or 16 bytes; the length gives the family).
    ``when``: (field, value) choosing this attribute, among those that hold the same field,
    when writing: IPv4 or IPv6 addresses by ``family``, ICMP or ICMPv6 keys by ``proto``.
    ``shown``: whether ``conntrack -L`` prints it (the line layouts read only those).
    """

    field: str
    code: str
    when: tuple[str, int] | None = None
    shown: bool = True


@dataclass(frozen=True, slots=True, eq=False)  # hashed by identity: the steps are cached
class Nest:
    """A nested attribute: its children by attribute type, in the order they are written.

    ``group``: the name under which its values are kept apart (a flow's ``orig`` and ``reply``
    tuples, the filter's flags); empty when they belong with the parent's.
    """

    children: Mapping[int, Leaf | Nest]
    group: str = ""


_TUPLE_IP = Nest(
    {
        CTA_IP_V4_SRC: Leaf("src", "addr", ("family", 4)),
        CTA_IP_V4_DST: Leaf("dst", "addr", ("family", 4)),
        CTA_IP_V6_SRC: Leaf("src", "addr", ("family", 6)),
        CTA_IP_V6_DST: Leaf("dst", "addr", ("family", 6)),
    }
)
_TUPLE_PROTO = Nest(
    {
        CTA_PROTO_NUM: Leaf("proto", "B"),
        CTA_PROTO_SRC_PORT: Leaf("sport", "H"),
        CTA_PROTO_DST_PORT: Leaf("dport", "H"),
        CTA_PROTO_ICMP_TYPE: Leaf("type", "B", ("proto", IPPROTO_ICMP)),
        CTA_PROTO_ICMP_CODE: Leaf("code", "B", ("proto", IPPROTO_ICMP)),
        CTA_PROTO_ICMP_ID: Leaf("id", "H", ("proto", IPPROTO_ICMP)),
        CTA_PROTO_ICMPV6_TYPE: Leaf("type", "B", ("proto", IPPROTO_ICMPV6)),
        CTA_PROTO_ICMPV6_CODE: Leaf("code", "B", ("proto", IPPROTO_ICMPV6)),
        CTA_PROTO_ICMPV6_ID: Leaf("id", "H", ("proto", IPPROTO_ICMPV6)),
    }
)


def _tuple(group: str) -> Nest:
    return Nest({CTA_TUPLE_IP: _TUPLE_IP, CTA_TUPLE_PROTO: _TUPLE_PROTO}, group)


TUPLE_ORIG = _tuple("orig")
TUPLE_REPLY = _tuple("reply")
CT_MESSAGE = Nest(
    {
        CTA_TUPLE_ORIG: TUPLE_ORIG,
        CTA_TUPLE_REPLY: TUPLE_REPLY,
        CTA_ZONE: Leaf("zone", "H"),
        CTA_TIMEOUT: Leaf("timeout", "I"),
        CTA_STATUS: Leaf("status", "I"),
        CTA_STATUS_MASK: Leaf("status_mask", "I", shown=False),
        CTA_MARK: Leaf("mark", "I"),
        CTA_ID: Leaf("id", "I", shown=False),
        CTA_FILTER: Nest(
            {
                CTA_FILTER_ORIG_FLAGS: Leaf("orig_flags", "=I", shown=False),
                CTA_FILTER_REPLY_FLAGS: Leaf("reply_flags", "=I", shown=False),
            },
            "filter",
        ),
        CTA_PROTOINFO: Nest(
            {
                CTA_PROTOINFO_TCP: Nest({CTA_PROTOINFO_TCP_STATE: Leaf("tcp_state", "B")}),
                CTA_PROTOINFO_SCTP: Nest({CTA_PROTOINFO_SCTP_STATE: Leaf("sctp_state", "B")}),
            }
        ),
        CTA_USE: Leaf("use", "I"),
    }
)
"""A conntrack message's attributes (IPCTNL_MSG_CT_NEW/GET/DELETE), in the order written."""

Values: TypeAlias = dict[str, Any]
"""An attribute tree's values by field; a group's (``orig``…) are a dict of their own."""

_READ: dict[str, Callable[[bytes, int, int], Any]] = {
    "B": lambda buf, s, _e: buf[s],
    "H": lambda buf, s, _e: _BE16.unpack_from(buf, s)[0],
    "I": lambda buf, s, _e: _BE32.unpack_from(buf, s)[0],
    "=I": lambda buf, s, _e: _U32.unpack_from(buf, s)[0],
    # the classes straight away, not ip_address(): it tries one, then the other
    "addr": lambda buf, s, e: (IPv4Address if e - s == 4 else IPv6Address)(buf[s:e]),
}
_WRITE: dict[str, Callable[[int, Any], bytes]] = {
    "B": u8_attr,
    "H": be16_attr,
    "I": be32_attr,
    "=I": u32_attr,
    "addr": lambda atype, a: attr(atype, a.packed),
}


def read_attrs(buf: bytes, off: int, end: int, tree: Nest, out: Values) -> None:
    """Fill ``out`` with the values of the attributes ``tree`` declares, from
    ``buf[off:end]``; others are skipped. A repeated group replaces the first, as does a
    repeated value."""
    steps = _read_steps(tree)
    for atype, start, stop in spans(buf, off, end):
        step = steps.get(atype)
        if step is None:
            continue
        field, read, inner = step
        if read is not None:
            out[field] = read(buf, start, stop)
        elif field:
            group: Values = {}
            out[field] = group
            read_attrs(buf, start, stop, inner, group)  # type: ignore[arg-type]
        else:
            read_attrs(buf, start, stop, inner, out)  # type: ignore[arg-type]


def write_attrs(tree: Nest, values: Values) -> bytes:
    """The attributes of ``tree`` that ``values`` gives (None: left out), in the tree's order;
    a nest only when something is written in it."""
    out = []
    for atype, field, when, write, inner in _write_steps(tree):
        if write is not None:
            value = values.get(field)
            if value is None or (when is not None and values.get(when[0]) != when[1]):
                continue
            out.append(write(atype, value))
        else:
            sub = values.get(field) if field else values
            body = write_attrs(inner, sub) if sub else b""  # type: ignore[arg-type]
            if body:
                out.append(nest(atype, body))
    return b"".join(out)


_ReadStep: TypeAlias = tuple[str, Callable[[bytes, int, int], Any] | None, "Nest | None"]
_WriteStep: TypeAlias = tuple[
    int, str, tuple[str, int] | None, Callable[[int, Any], bytes] | None, "Nest | None"
]


@functools.cache
def _read_steps(tree: Nest) -> dict[int, _ReadStep]:
    """``tree`` for the decoder: per attribute type, the field, its reader or the nest below."""
    return {
        atype: (spec.field, _READ[spec.code], None)
        if isinstance(spec, Leaf)
        else (spec.group, None, spec)
        for atype, spec in tree.children.items()
    }


@functools.cache
def _write_steps(tree: Nest) -> tuple[_WriteStep, ...]:
    """``tree`` for the encoder, in order: type, field, condition, writer or the nest below."""
    return tuple(
        (atype, spec.field, spec.when, _WRITE[spec.code], None)
        if isinstance(spec, Leaf)
        else (atype, spec.group, None, None, spec)
        for atype, spec in tree.children.items()
    )


def _family_af(version: int) -> int:
    return socket.AF_INET if version == 4 else socket.AF_INET6


@dataclass(frozen=True, slots=True)
class FlowTuple:
    """One direction of a flow: addresses, layer-4 protocol number and ports (0 without ports).

    ``icmp``: (type, code, id) of an ICMP or ICMPv6 flow, which the kernel keys by those
    instead of ports (a delete must send them back).
    """

    src: IPAddress
    dst: IPAddress
    proto: int
    sport: int = 0
    dport: int = 0
    icmp: tuple[int, int, int] | None = None

    def __str__(self) -> str:
        if self.icmp is not None:
            kind, code, ident = self.icmp
            return f"src={self.src} dst={self.dst} type={kind} code={code} id={ident}"
        return f"src={self.src} dst={self.dst} sport={self.sport} dport={self.dport}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Flow:
    """A conntrack entry as the kernel reported it.

    ``orig`` is the tuple of the first packet (client → service address); ``reply`` is what
    answers come back with, so after DNAT ``reply.src`` is the backend that was chosen.
    """

    orig: FlowTuple
    reply: FlowTuple
    id: int | None = None
    zone: int = 0
    mark: int = 0
    status: int = 0
    timeout: int | None = None
    tcp_state: int | None = None
    sctp_state: int | None = None
    use: int | None = None

    @property
    def family(self) -> int:
        """4 or 6."""
        return self.orig.src.version

    @property
    def proto(self) -> str:
        """``tcp``, ``udp``, ``sctp``, ``icmp``… as ``conntrack -L`` names it, or the number."""
        return LINE_PROTO_NAMES.get(self.orig.proto, str(self.orig.proto))

    @property
    def state(self) -> str | None:
        """The TCP or SCTP state as ``conntrack -L`` names it (``ESTABLISHED``), else None."""
        if self.tcp_state is not None:
            return state_name(TCP_STATES, self.tcp_state)
        if self.sctp_state is not None:
            return state_name(SCTP_STATES, self.sctp_state)
        return None

    @property
    def flags(self) -> tuple[str, ...]:
        """The status bits ``conntrack -L`` shows: ``UNREPLIED``, ``ASSURED``, ``OFFLOAD``…"""
        st = self.status
        out = [] if st & IPS_SEEN_REPLY else ["UNREPLIED"]
        if st & IPS_HW_OFFLOAD:
            out.append("HW_OFFLOAD")
        elif st & IPS_OFFLOAD:
            out.append("OFFLOAD")
        elif st & IPS_ASSURED:
            out.append("ASSURED")
        if st & IPS_DST_NAT:
            out.append("DNAT")
        return tuple(out)

    def as_dict(self) -> dict[str, object]:
        """Plain values, for ``--json`` output."""
        return {
            "family": f"ipv{self.family}",
            "proto": self.proto,
            "orig": _tuple_dict(self.orig),
            "reply": _tuple_dict(self.reply),
            "state": self.state,
            "timeout": self.timeout,
            "mark": self.mark,
            "flags": list(self.flags),
            "zone": self.zone,
            "status": self.status,
            "use": self.use,
            "id": self.id,
        }

    def __str__(self) -> str:
        return f"ipv{self.family} {self.proto} {self.orig} | {self.reply} zone={self.zone}"


def state_name(names: tuple[str, ...], state: int) -> str:
    """A TCP or SCTP state number as ``conntrack -L`` names it (the number if unknown)."""
    return names[state] if 0 <= state < len(names) else str(state)


def _tuple_dict(t: FlowTuple) -> dict[str, object]:
    if t.icmp is not None:
        kind, code, ident = t.icmp
        return {"src": str(t.src), "dst": str(t.dst), "type": kind, "code": code, "id": ident}
    return {"src": str(t.src), "dst": str(t.dst), "sport": t.sport, "dport": t.dport}


def _tuple_text(t: FlowTuple) -> str:
    if t.icmp is not None or t.proto in PORT_PROTOS:
        return str(t)
    return f"src={t.src} dst={t.dst}"


def conntrack_line(flow: Flow) -> str:
    """``flow`` as one line of ``conntrack -L -o extended``: family, protocol, timeout, state,
    both tuples with ``[UNREPLIED]``/``[ASSURED]``, mark, zone (when not 0) and use count.

    What nlproxy does not decode (helpers, labels, accounting, GRE keys) is left out.
    """
    af = 2 if flow.family == 4 else 10
    proto = LINE_PROTO_NAMES.get(flow.orig.proto, "unknown")
    parts = [f"{'ipv' + str(flow.family):<8} {af} {proto:<8} {flow.orig.proto}"]
    if flow.timeout is not None:
        parts.append(str(flow.timeout))
    if flow.state is not None:
        parts.append(flow.state)
    parts.append(_tuple_text(flow.orig))
    if not flow.status & IPS_SEEN_REPLY:
        parts.append("[UNREPLIED]")
    parts.append(_tuple_text(flow.reply))
    parts += [f"[{f}]" for f in flow.flags if f not in ("UNREPLIED", "DNAT")]
    parts.append(f"mark={flow.mark}")
    if flow.zone:
        parts.append(f"zone={flow.zone}")
    if flow.use is not None:
        parts.append(f"use={flow.use}")
    return " ".join(parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowFilter:
    """Which flows to select: every given field must match (None matches anything).

    ``orig_dst``/``orig_dport`` select the address the client sent to (a service address, or a
    node address for a NodePort); ``reply_src``/``reply_sport`` the backend that answers.
    ``family`` (4 or 6) follows from any address given; without one the filter spans both.
    ``dnat`` selects flows whose destination was (True) or was not (False) rewritten.

    Raises:
        ValueError: addresses of different families, or an unknown protocol.
    """

    proto: str | None = None
    orig_dst: IPAddress | None = None
    orig_dport: int | None = None
    reply_src: IPAddress | None = None
    reply_sport: int | None = None
    dnat: bool | None = None
    family: int | None = None

    def __post_init__(self) -> None:
        if self.proto is not None and self.proto not in PROTO_NUMBERS:
            raise ValueError(f"protocol {self.proto!r} is not one of tcp, udp, sctp")
        addrs = (self.orig_dst, self.reply_src)
        versions: set[int] = {a.version for a in addrs if a is not None}
        if self.family is not None:
            versions.add(self.family)
        if len(versions) > 1:
            raise ValueError(f"filter {self} mixes IPv4 and IPv6")
        if versions:
            object.__setattr__(self, "family", versions.pop())

    @property
    def proto_num(self) -> int | None:
        return None if self.proto is None else PROTO_NUMBERS[self.proto]

    @property
    def is_empty(self) -> bool:
        """True when the filter selects every flow of its family (or of both)."""
        return all(
            v is None
            for v in (
                self.proto,
                self.orig_dst,
                self.orig_dport,
                self.reply_src,
                self.reply_sport,
                self.dnat,
            )
        )

    def matches(self, flow: Flow) -> bool:
        """Whether ``flow`` is selected: the exact check, also where the kernel's is looser."""
        o, r = flow.orig, flow.reply
        return (
            (self.family is None or flow.family == self.family)
            and (self.proto is None or o.proto == PROTO_NUMBERS[self.proto])
            and (self.orig_dst is None or o.dst == self.orig_dst)
            and (self.orig_dport is None or o.dport == self.orig_dport)
            and (self.reply_src is None or r.src == self.reply_src)
            and (self.reply_sport is None or r.sport == self.reply_sport)
            and (self.dnat is None or bool(flow.status & IPS_DST_NAT) == self.dnat)
        )

    def __str__(self) -> str:
        parts = [
            f"{k}={v}"
            for k, v in (
                ("family", self.family and f"ipv{self.family}"),
                ("proto", self.proto),
                ("orig-dst", self.orig_dst),
                ("orig-dport", self.orig_dport),
                ("reply-src", self.reply_src),
                ("reply-sport", self.reply_sport),
                ("dnat", self.dnat),
            )
            if v is not None
        ]
        return "flows(" + (" ".join(parts) or "all") + ")"


# ---------------------------------------------------------------------------------------------
# Encoding


def _message(msg_type: int, flags: int, seq: int, family: int, attrs: bytes) -> bytes:
    return nfnl_message(nfnl_type(NFNL_SUBSYS_CTNETLINK, msg_type), flags, seq, family, attrs)


def _tuple_values(t: FlowTuple) -> Values:
    values: Values = {"family": t.src.version, "proto": t.proto, "src": t.src, "dst": t.dst}
    if t.icmp is not None and t.proto in (IPPROTO_ICMP, IPPROTO_ICMPV6):
        values["type"], values["code"], values["id"] = t.icmp
    else:
        values["sport"], values["dport"] = t.sport, t.dport
    return values


def _tuple_attr(atype: int, t: FlowTuple) -> bytes:
    """One tuple of ``t``, as attribute ``atype`` (CTA_TUPLE_ORIG or CTA_TUPLE_REPLY)."""
    group = "orig" if atype == CTA_TUPLE_ORIG else "reply"
    return write_attrs(CT_MESSAGE, {group: _tuple_values(t)})


def _filter_side(
    proto: int | None,
    src: IPAddress | None,
    dst: IPAddress | None,
    sport: int | None,
    dport: int | None,
) -> tuple[Values | None, int]:
    """One tuple of a CTA_FILTER request and its CTA_FILTER_F_* flags."""
    flags = (CTA_FILTER_F_CTA_IP_SRC if src is not None else 0) | (
        CTA_FILTER_F_CTA_IP_DST if dst is not None else 0
    )
    # Port flags need a protocol number (the kernel refuses them alone), and the kernel compares
    # ports only for TCP and UDP; SCTP ports are checked by FlowFilter.matches afterwards.
    with_ports = proto in KERNEL_PORT_FILTER_PROTOS
    sport = sport if with_ports else None
    dport = dport if with_ports else None
    if proto is not None:
        flags |= CTA_FILTER_F_CTA_PROTO_NUM
        flags |= CTA_FILTER_F_CTA_PROTO_SRC_PORT if sport is not None else 0
        flags |= CTA_FILTER_F_CTA_PROTO_DST_PORT if dport is not None else 0
    if not flags:
        return None, 0
    addr = src if src is not None else dst
    family = None if addr is None else addr.version
    values = {"family": family, "proto": proto, "src": src, "dst": dst}
    return values | {"sport": sport, "dport": dport}, flags


def encode_dump(flt: FlowFilter, family: int, seq: int) -> bytes:
    """A dump request for the flows of ``family`` (4 or 6) that the kernel can pre-select.

    The kernel filter may be looser than ``flt`` (SCTP ports); callers re-check with
    :meth:`FlowFilter.matches`. Needs Linux >= 5.8 for tuple filters (CTA_FILTER).
    """
    proto = flt.proto_num
    orig, orig_flags = _filter_side(proto, None, flt.orig_dst, None, flt.orig_dport)
    reply, reply_flags = _filter_side(proto, flt.reply_src, None, flt.reply_sport, None)
    values: Values = {"orig": orig, "reply": reply}
    if flt.dnat is not None:
        # Status filters need Linux >= 5.15 (CTA_STATUS_MASK).
        values["status"] = IPS_DST_NAT if flt.dnat else 0
        values["status_mask"] = IPS_DST_NAT
    if orig_flags or reply_flags:
        values["filter"] = {"orig_flags": orig_flags, "reply_flags": reply_flags}
    attrs = write_attrs(CT_MESSAGE, values)
    return _message(IPCTNL_MSG_CT_GET, NLM_F_REQUEST | NLM_F_DUMP, seq, _family_af(family), attrs)


def delete_attrs(flow: Flow) -> bytes:
    """The attributes that name exactly ``flow`` to a delete: its original tuple, zone and id
    (a newer flow that reuses the tuple has another id and is left alone)."""
    values = {"orig": _tuple_values(flow.orig), "zone": flow.zone or None, "id": flow.id}
    return write_attrs(CT_MESSAGE, values)


def encode_delete(flow: Flow, seq: int) -> bytes:
    """Delete exactly ``flow`` (:func:`delete_attrs`)."""
    return encode_delete_attrs(delete_attrs(flow), flow.family, seq)


def encode_delete_attrs(attrs: bytes, family: int, seq: int) -> bytes:
    """A delete of the flow of ``family`` (4 or 6) that ``attrs`` (:func:`delete_attrs`) name."""
    return _message(IPCTNL_MSG_CT_DELETE, NLM_F_REQUEST | NLM_F_ACK, seq, _family_af(family), attrs)


def encode_new(flow: Flow, seq: int, *, ack: bool = False) -> bytes:
    """Create ``flow`` (needs ``timeout``); tests and benchmarks use it to fill the table fast."""
    if flow.timeout is None:
        raise ValueError(f"{flow}: a new flow needs a timeout")
    values = {
        "orig": _tuple_values(flow.orig),
        "reply": _tuple_values(flow.reply),
        "timeout": flow.timeout,
        "status": flow.status or None,
        "mark": flow.mark or None,
    }
    attrs = write_attrs(CT_MESSAGE, values)
    flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL | (NLM_F_ACK if ack else 0)
    return _message(IPCTNL_MSG_CT_NEW, flags, seq, _family_af(flow.family), attrs)


# ---------------------------------------------------------------------------------------------
# Decoding


def _flow_tuple(values: Values | None) -> FlowTuple | None:
    if values is None:
        return None
    src, dst = values.get("src"), values.get("dst")
    if src is None or dst is None:
        raise ValueError("conntrack tuple without addresses")
    proto, sport, dport = values.get("proto", 0), values.get("sport", 0), values.get("dport", 0)
    ident = values.get("id")
    if ident is None:
        return FlowTuple(src, dst, proto, sport, dport)
    return FlowTuple(
        src, dst, proto, sport, dport, (values.get("type", -1), values.get("code", -1), ident)
    )


def decode_flow(payload: bytes) -> Flow:
    """A flow from the payload of an IPCTNL_MSG_CT_NEW message (a dump reply or an event).

    Raises:
        ValueError: the message lacks a tuple, or a tuple its addresses.
    """
    v: Values = {}
    read_attrs(payload, NFGENMSG.size, len(payload), CT_MESSAGE, v)
    orig, reply = _flow_tuple(v.get("orig")), _flow_tuple(v.get("reply"))
    if orig is None or reply is None:
        raise ValueError("conntrack message without both tuples")
    return Flow(
        orig=orig,
        reply=reply,
        id=v.get("id"),
        zone=v.get("zone", 0),
        mark=v.get("mark", 0),
        status=v.get("status", 0),
        timeout=v.get("timeout"),
        tcp_state=v.get("tcp_state"),
        sctp_state=v.get("sctp_state"),
        use=v.get("use"),
    )
