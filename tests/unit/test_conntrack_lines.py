"""``LineFormatter`` writes exactly the line ``conntrack_line(decode_flow(payload))`` writes,
for every kind of flow, both when it learns a layout and when it reuses one for other values."""

from __future__ import annotations

import struct
from ipaddress import ip_address

import pytest

from nlproxy.conntrack.lines import LineFormatter
from nlproxy.conntrack.messages import (
    _BE16,
    _BE32,
    CTA_PROTOINFO,
    CTA_PROTOINFO_SCTP,
    CTA_PROTOINFO_TCP,
    CTA_PROTOINFO_TCP_STATE,
    CTA_TUPLE_ORIG,
    CTA_USE,
    CTA_ZONE,
    IPS_ASSURED,
    IPS_DST_NAT,
    IPS_HW_OFFLOAD,
    IPS_OFFLOAD,
    IPS_SEEN_REPLY,
    Flow,
    FlowTuple,
    _nest,
    _nla,
    _tuple_attr,
    conntrack_line,
    decode_flow,
    encode_new,
)

NLMSGHDR = 16


def payload(flow: Flow, extra: bytes = b"") -> bytes:
    """A flow as the kernel's dump carries it: the message body (nfgenmsg and attributes)."""
    return encode_new(flow, 1)[NLMSGHDR:] + extra


def tcp(state: int) -> bytes:
    inner = _nla(CTA_PROTOINFO_TCP_STATE, bytes([state])) + _nla(2, b"\x07")
    return _nest(CTA_PROTOINFO, _nest(CTA_PROTOINFO_TCP, inner))


def sctp(state: int) -> bytes:
    return _nest(CTA_PROTOINFO, _nest(CTA_PROTOINFO_SCTP, _nla(1, bytes([state]))))


def use_zone(use: int, zone: int) -> bytes:
    return _nla(CTA_USE, _BE32.pack(use)) + _nla(CTA_ZONE, _BE16.pack(zone))


def flow(src: str, dst: str, proto: int, *, status: int = 0, mark: int = 0, port: int = 80) -> Flow:
    s, d = ip_address(src), ip_address(dst)
    icmp = (8, 0, port) if proto in (1, 58) else None
    return Flow(
        orig=FlowTuple(s, d, proto, 40000 + port, port, icmp),
        reply=FlowTuple(d, s, proto, port, 40000 + port, (0, 0, port) if icmp else None),
        status=status,
        mark=mark,
        timeout=120 + port,
    )


STATUSES = [0, IPS_SEEN_REPLY, IPS_SEEN_REPLY | IPS_ASSURED | IPS_DST_NAT, IPS_OFFLOAD,
            IPS_HW_OFFLOAD | IPS_ASSURED]  # fmt: skip
KINDS = [
    pytest.param("10.1.0.1", "10.96.0.1", 17, b"", id="udp4"),
    pytest.param("fd00::1", "fd00:96::1", 17, b"", id="udp6"),
    pytest.param("::ffff:10.0.0.1", "::ffff:10.0.0.2", 17, b"", id="udp6-v4-mapped"),
    pytest.param("10.1.0.1", "10.96.0.1", 6, None, id="tcp4-states"),
    pytest.param("fd00::1", "fd00:96::1", 6, None, id="tcp6-states"),
    pytest.param("10.1.0.1", "10.96.0.1", 132, b"sctp", id="sctp4"),
    pytest.param("10.1.0.1", "10.96.0.1", 1, b"", id="icmp"),
    pytest.param("fd00::1", "fd00:96::1", 58, b"", id="icmpv6"),
    pytest.param("10.1.0.1", "10.96.0.1", 47, b"", id="gre-no-ports"),
    pytest.param("10.1.0.1", "10.96.0.1", 99, b"", id="unknown-proto"),
]


@pytest.mark.parametrize(("src", "dst", "proto", "info"), KINDS)
def test_lines_are_those_of_the_full_decoder(
    src: str, dst: str, proto: int, info: bytes | None
) -> None:
    bodies = []
    for i, status in enumerate(STATUSES):
        f = flow(src, dst, proto, status=status, mark=i * 7, port=1 + i)
        extra = use_zone(i + 1, i % 2)
        if info is None:
            extra += tcp(i * 3)  # 12 is past the named states: written as a number
        elif info == b"sctp":
            extra += sctp(i * 2)
        bodies.append(payload(f, extra))
    fmt = LineFormatter()
    lines = [fmt.line(b) for b in bodies]
    assert lines == [conntrack_line(decode_flow(b)) for b in bodies]
    assert fmt._layouts, "the layout was not learnt: nothing but the slow way was tested"


def test_unusual_layouts_go_the_full_way() -> None:
    base = flow("10.1.0.1", "10.96.0.1", 17)
    other = FlowTuple(ip_address("10.9.9.9"), ip_address("10.8.8.8"), 6, 1, 2)
    odd = [
        payload(base, _tuple_attr(CTA_TUPLE_ORIG, other)),  # a second original tuple
        payload(base, b"\x02\x00\x63\x00"),  # an attribute too short to be one
        payload(base, b"\x00\x00"),  # trailing bytes
    ]
    fmt = LineFormatter()
    for body in odd * 2:
        assert fmt.line(body) == conntrack_line(decode_flow(body))


def test_a_message_without_tuples_is_refused_as_by_the_decoder() -> None:
    body = encode_new(flow("10.1.0.1", "10.96.0.1", 17), 1)[NLMSGHDR : NLMSGHDR + 4]
    with pytest.raises(ValueError, match="tuples"):
        LineFormatter().line(body)


def message(body: bytes, seq: int = 7, mtype: int = 0x100) -> bytes:
    """A dump's message around ``body``: netlink header and padding."""
    length = NLMSGHDR + len(body)
    return struct.pack("=IHHII", length, mtype, 2, seq, 0) + body + bytes(-length % 4)


@pytest.mark.parametrize(("src", "dst", "proto", "info"), KINDS)
def test_a_datagram_of_one_layout_is_written_in_one_go(
    src: str, dst: str, proto: int, info: bytes | None
) -> None:
    bodies = []
    for i in range(6):  # every status and mark non-zero: one layout, other values
        f = flow(src, dst, proto, status=STATUSES[1 + i % 4], mark=1 + i, port=1 + i)
        extra = use_zone(i + 1, i % 3)
        if info is None:
            extra += tcp(i * 2)
        elif info == b"sctp":
            extra += sctp(i)
        bodies.append(payload(f, extra))
    slow = [conntrack_line(decode_flow(b)) for b in bodies]
    fmt = LineFormatter()
    assert fmt.datagram(b"".join(message(b) for b in bodies)) is None  # nothing learnt yet
    assert fmt.line(bodies[0]) == slow[0]
    assert fmt.datagram(b"".join(message(b) for b in bodies)) == slow
    assert fmt.datagram(b"".join(message(b) for b in reversed(bodies))) == slow[::-1]


def test_a_datagram_of_anything_else_is_left_to_the_message_by_message_way() -> None:
    bodies = [payload(flow("10.1.0.1", "10.96.0.1", 17, status=2, mark=1, port=p)) for p in (1, 2)]
    fmt = LineFormatter()
    fmt.line(bodies[0])
    done = struct.pack("=IHHII", 20, 3, 2, 7, 0) + bytes(4)
    assert fmt.datagram(message(bodies[0]) + message(bodies[1], mtype=3)) is None
    assert fmt.datagram(message(bodies[0]) + done) is None
    assert fmt.datagram(message(bodies[0])[:-4]) is None
    assert fmt.datagram(b"") is None


def test_a_message_alike_but_for_its_attributes_stops_the_datagram_way() -> None:
    f = flow("10.1.0.1", "10.96.0.1", 17, status=2, mark=1)
    use, zone = _nla(CTA_USE, _BE32.pack(1)), _nla(CTA_ZONE, _BE16.pack(3))
    first, swapped = payload(f, use + zone), payload(f, zone + use)
    assert len(first) == len(swapped)
    fmt = LineFormatter()
    fmt.line(first)
    assert fmt.datagram(message(first) + message(first)) is not None
    assert fmt.datagram(message(first) + message(swapped)) is None
    assert fmt.line(swapped) == conntrack_line(decode_flow(swapped))


def test_the_fixed_text_is_made_once_per_status_not_per_flow() -> None:
    bodies = [
        payload(flow(f"{1 + i}.0.0.1", "10.96.0.1", 17, status=2, mark=1)) for i in range(200)
    ]
    fmt = LineFormatter()
    fmt.line(bodies[0])
    assert fmt.datagram(b"".join(message(b) for b in bodies)) == [
        conntrack_line(decode_flow(b)) for b in bodies
    ]
    (layouts,) = fmt._framed.values()
    assert [len(layout.by_status) for layout in layouts] == [1]
