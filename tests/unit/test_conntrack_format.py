"""Decoding a flow's state, timeout, mark and use count, and printing it as ``conntrack -L``.

The messages are built here attribute by attribute, as the kernel lays them out
(``ctnetlink_fill_info``), so cases the kernel tests cannot easily make (SCTP states, zones,
offloaded flows, unknown protocols) are covered too.
"""

from __future__ import annotations

import struct
from ipaddress import ip_address

import pytest

from nlproxy.conntrack import messages as m
from nlproxy.conntrack.messages import Flow, FlowTuple, conntrack_line, decode_flow


def _payload(flow: Flow, *, protoinfo: bytes = b"", use: int | None = None, zone: int = 0) -> bytes:
    """A dump reply's payload (nfgenmsg + attributes) for ``flow``."""
    attrs = m._tuple_attr(m.CTA_TUPLE_ORIG, flow.orig) + m._tuple_attr(
        m.CTA_TUPLE_REPLY, flow.reply
    )
    attrs += m._nla(m.CTA_STATUS, struct.pack("!I", flow.status))
    attrs += m._nla(m.CTA_MARK, struct.pack("!I", flow.mark))
    if flow.timeout is not None:
        attrs += m._nla(m.CTA_TIMEOUT, struct.pack("!I", flow.timeout))
    if use is not None:
        attrs += m._nla(m.CTA_USE, struct.pack("!I", use))
    if zone:
        attrs += m._nla(m.CTA_ZONE, struct.pack("!H", zone))
    attrs += protoinfo
    af = 2 if flow.family == 4 else 10
    return struct.pack("=BBH", af, 0, 0) + attrs


def _flow(proto: int, src: str, dst: str, sport: int = 0, dport: int = 0, **kw: int) -> Flow:
    s, d = ip_address(src), ip_address(dst)
    return Flow(
        orig=FlowTuple(s, d, proto, sport, dport),
        reply=FlowTuple(d, s, proto, dport, sport),
        **kw,  # type: ignore[arg-type]
    )


def _protoinfo(kind: int, state: int) -> bytes:
    return m._nest(m.CTA_PROTOINFO, m._nest(kind, m._nla(1, bytes([state]))))


ASSURED = m.IPS_SEEN_REPLY | m.IPS_ASSURED


@pytest.mark.parametrize(
    ("flow", "extra", "line"),
    [
        pytest.param(
            _flow(
                6,
                "10.0.0.2",
                "10.96.0.1",
                40000,
                80,
                status=ASSURED | m.IPS_DST_NAT,
                mark=0x4000,
                timeout=431999,
            ),
            {"protoinfo": _protoinfo(m.CTA_PROTOINFO_TCP, 3), "use": 1},
            "ipv4     2 tcp      6 431999 ESTABLISHED src=10.0.0.2 dst=10.96.0.1 sport=40000 "
            "dport=80 src=10.96.0.1 dst=10.0.0.2 sport=80 dport=40000 [ASSURED] mark=16384 use=1",
            id="tcp-established-dnat",
        ),
        pytest.param(
            _flow(17, "fd00::2", "fd00::53", 5000, 53, timeout=29),
            {"use": 2, "zone": 7},
            "ipv6     10 udp      17 29 src=fd00::2 dst=fd00::53 sport=5000 dport=53 [UNREPLIED] "
            "src=fd00::53 dst=fd00::2 sport=53 dport=5000 mark=0 zone=7 use=2",
            id="udp6-unreplied-zone",
        ),
        pytest.param(
            _flow(132, "10.0.0.2", "10.0.0.3", 7000, 9000, status=ASSURED, timeout=210),
            {"protoinfo": _protoinfo(m.CTA_PROTOINFO_SCTP, 4)},
            "ipv4     2 sctp     132 210 ESTABLISHED src=10.0.0.2 dst=10.0.0.3 sport=7000 "
            "dport=9000 src=10.0.0.3 dst=10.0.0.2 sport=9000 dport=7000 [ASSURED] mark=0",
            id="sctp-established",
        ),
        pytest.param(
            _flow(6, "10.0.0.2", "10.0.0.3", 1, 2, status=ASSURED | m.IPS_OFFLOAD, timeout=5),
            {"protoinfo": _protoinfo(m.CTA_PROTOINFO_TCP, 7)},
            "ipv4     2 tcp      6 5 TIME_WAIT src=10.0.0.2 dst=10.0.0.3 sport=1 dport=2 "
            "src=10.0.0.3 dst=10.0.0.2 sport=2 dport=1 [OFFLOAD] mark=0",
            id="offloaded-shows-offload-not-assured",
        ),
        pytest.param(
            _flow(99, "10.0.0.2", "10.0.0.3", status=m.IPS_SEEN_REPLY, timeout=600),
            {},
            "ipv4     2 unknown  99 600 src=10.0.0.2 dst=10.0.0.3 src=10.0.0.3 dst=10.0.0.2 mark=0",
            id="unknown-protocol-no-ports",
        ),
    ],
)
def test_decoded_flow_prints_like_conntrack_L(
    flow: Flow, extra: dict[str, object], line: str
) -> None:
    got = decode_flow(_payload(flow, **extra))  # type: ignore[arg-type]
    assert conntrack_line(got) == line


def test_state_and_flags_in_json() -> None:
    flow = _flow(6, "10.0.0.2", "10.96.0.1", 1, 80, status=ASSURED | m.IPS_DST_NAT, timeout=9)
    got = decode_flow(_payload(flow, protoinfo=_protoinfo(m.CTA_PROTOINFO_TCP, 1), use=1))
    d = got.as_dict()
    assert (d["state"], d["timeout"], d["mark"], d["use"]) == ("SYN_SENT", 9, 0, 1)
    assert d["flags"] == ["ASSURED", "DNAT"]


def test_unknown_state_number_is_shown_as_a_number() -> None:
    flow = _flow(6, "10.0.0.2", "10.0.0.3", 1, 2, timeout=1)
    got = decode_flow(_payload(flow, protoinfo=_protoinfo(m.CTA_PROTOINFO_TCP, 42)))
    assert got.state == "42"


def test_icmp_flow_keeps_type_code_and_id_and_deletes_by_them() -> None:
    s, d = ip_address("10.0.0.2"), ip_address("10.0.0.3")
    flow = Flow(
        orig=FlowTuple(s, d, 1, icmp=(8, 0, 0x1234)),
        reply=FlowTuple(d, s, 1, icmp=(0, 0, 0x1234)),
        status=m.IPS_SEEN_REPLY,
        timeout=29,
    )
    got = decode_flow(_payload(flow, use=1))
    assert got.orig.icmp == (8, 0, 0x1234)
    assert conntrack_line(got) == (
        "ipv4     2 icmp     1 29 src=10.0.0.2 dst=10.0.0.3 type=8 code=0 id=4660 "
        "src=10.0.0.3 dst=10.0.0.2 type=0 code=0 id=4660 mark=0 use=1"
    )
    assert got.as_dict()["orig"] == {
        "src": "10.0.0.2",
        "dst": "10.0.0.3",
        "type": 8,
        "code": 0,
        "id": 4660,
    }
    # The delete request carries the ICMP attributes, not ports the kernel would refuse.
    request = m.encode_delete(got, seq=1)
    assert m._nla(m.CTA_PROTO_ICMP_ID, struct.pack("!H", 0x1234)) in request
    assert m._nla(m.CTA_PROTO_SRC_PORT, struct.pack("!H", 0)) not in request


def test_icmpv6_attributes() -> None:
    s, d = ip_address("fd00::2"), ip_address("fd00::3")
    flow = Flow(
        orig=FlowTuple(s, d, 58, icmp=(128, 0, 7)),
        reply=FlowTuple(d, s, 58, icmp=(129, 0, 7)),
        timeout=30,
    )
    got = decode_flow(_payload(flow))
    assert (got.proto, got.reply.icmp) == ("icmpv6", (129, 0, 7))
    assert m._nla(m.CTA_PROTO_ICMPV6_TYPE, bytes([128])) in m.encode_delete(got, seq=1)
