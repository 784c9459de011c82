"""The sweep's light reading of a dump message (``sweep_row``) against the full decoder.

For every message, real-shaped (the attributes the kernel's ``ctnetlink_fill_info`` writes, in
its order or another) or unusual, ``sweep_row`` either gives exactly the row the full decoder
gives (``flow_row(decode_flow(...))``), deletion attributes included, or gives None and leaves
the message to the decoder. The plain shapes must take the fast reading.
"""

from __future__ import annotations

import itertools
from ipaddress import IPv4Address, IPv6Address, ip_address

import pytest

from nlproxy.conntrack.messages import (
    CT_MESSAGE,
    CTA_ID,
    CTA_MARK,
    CTA_PROTOINFO,
    CTA_STATUS,
    CTA_TIMEOUT,
    CTA_TUPLE_ORIG,
    CTA_TUPLE_REPLY,
    CTA_USE,
    CTA_ZONE,
    IPS_DST_NAT,
    IPS_SEEN_REPLY,
    Flow,
    FlowFilter,
    FlowTuple,
    decode_flow,
    read_attrs,
    write_attrs,
)
from nlproxy.conntrack.rows import SweepReader, SweepRow, flow_row, row_matches, sweep_row
from nlproxy.netlink.codec import NFGENMSG, attr, be16_attr, be32_attr, nest, u8_attr

CTA_COUNTERS_ORIG, CTA_COUNTERS_REPLY, CTA_TIMESTAMP, CTA_LABELS = 9, 10, 20, 22
UDP, TCP, SCTP, ICMP = 17, 6, 132, 1

Addr = IPv4Address | IPv6Address


def tup(src: Addr, dst: Addr, proto: int, sport: int, dport: int) -> FlowTuple:
    return FlowTuple(src, dst, proto, sport, dport)


def kernel_shaped(
    orig: FlowTuple,
    reply: FlowTuple,
    *,
    status: int,
    zone: int,
    ident: int,
    order: int = 0,
    extras: bool = True,
) -> bytes:
    """A dump message's payload with the attributes the kernel writes: both tuples (the
    kernel also puts the zone in a tuple when it has a direction), zone, status, timeout,
    counters, timestamp, protocol info, mark, labels, id and use; ``order`` rotates them."""

    def t(atype: int, ft: FlowTuple) -> bytes:
        body = write_attrs(CT_MESSAGE, {"orig": _values(ft)})[4:]  # the nest's children
        extra = be16_attr(3, zone) if zone and extras else b""  # CTA_TUPLE_ZONE
        return nest(atype, body + extra)

    parts = [
        t(CTA_TUPLE_ORIG, orig),
        t(CTA_TUPLE_REPLY, reply),
        *([be16_attr(CTA_ZONE, zone)] if zone else []),
        be32_attr(CTA_STATUS, status),
        be32_attr(CTA_TIMEOUT, 29),
        be32_attr(CTA_MARK, 0),
        be32_attr(CTA_ID, ident),
        be32_attr(CTA_USE, 1),
    ]
    if extras:
        counters = nest(1, attr(1, (7).to_bytes(8, "big"))) + nest(2, attr(1, b"\0" * 8))
        parts += [
            nest(CTA_COUNTERS_ORIG, counters),
            nest(CTA_COUNTERS_REPLY, counters),
            nest(CTA_TIMESTAMP, attr(1, b"\1" * 8)),
            attr(CTA_LABELS, b"\0" * 16),
        ]
        if orig.proto == SCTP:
            parts.append(nest(CTA_PROTOINFO, nest(3, u8_attr(1, 4))))
        if orig.proto == TCP:
            parts.append(nest(CTA_PROTOINFO, nest(1, u8_attr(1, 3))))
    k = order % len(parts)
    parts = parts[k:] + parts[:k]
    return NFGENMSG.pack(2 if orig.src.version == 4 else 10, 0, 0) + b"".join(parts)


def _values(ft: FlowTuple) -> dict[str, object]:
    return {
        "family": ft.src.version,
        "proto": ft.proto,
        "src": ft.src,
        "dst": ft.dst,
        "sport": ft.sport,
        "dport": ft.dport,
    }


def same(fast: SweepRow, slow: SweepRow) -> None:
    assert fast[:6] == slow[:6]
    got: dict[str, object] = {}
    want: dict[str, object] = {}
    read_attrs(fast[6], 0, len(fast[6]), CT_MESSAGE, got)
    read_attrs(slow[6], 0, len(slow[6]), CT_MESSAGE, want)
    assert got == want


FAMILIES = {
    4: (ip_address("10.1.2.3"), ip_address("10.96.0.10"), ip_address("10.244.1.5")),
    6: (ip_address("fd00::3"), ip_address("fd00:96::10"), ip_address("fd00:244::5")),
}


def plain_cases() -> list[tuple[str, bytes]]:
    out = []
    for fam, proto, nat, zone, extras, order in itertools.product(
        (4, 6), (UDP, SCTP, TCP), (True, False), (0, 7), (True, False), (0, 3)
    ):
        client, vip, backend = FAMILIES[fam]
        orig = tup(client, vip, proto, 40000 + order, 53)
        if nat:
            reply, status = tup(backend, client, proto, 5353, 40000 + order), IPS_DST_NAT
        else:
            reply, status = tup(vip, client, proto, 53, 40000 + order), 0
        payload = kernel_shaped(
            orig,
            reply,
            status=status | IPS_SEEN_REPLY,
            zone=zone,
            ident=0xDEADBEEF + order,
            order=order,
            extras=extras,
        )
        out.append((f"v{fam}-{proto}-nat{nat}-zone{zone}-extras{extras}-o{order}", payload))
    return out


PLAIN = plain_cases()


@pytest.mark.parametrize(("name", "payload"), PLAIN, ids=[n for n, _ in PLAIN])
def test_a_plain_flow_is_read_as_the_decoder_reads_it(name: str, payload: bytes) -> None:
    fast = sweep_row(payload, {})
    assert fast is not None, name
    same(fast, flow_row(decode_flow(payload)))


def unusual_cases() -> list[tuple[str, bytes]]:
    client, vip, backend = FAMILIES[4]
    orig = tup(client, vip, UDP, 40000, 53)
    reply = tup(backend, client, UDP, 5353, 40000)
    base = kernel_shaped(orig, reply, status=IPS_DST_NAT, zone=0, ident=9, extras=False)
    hdr = base[:4]
    orig_attr = nest(CTA_TUPLE_ORIG, write_attrs(CT_MESSAGE, {"orig": _values(orig)})[4:])
    icmp = write_attrs(
        CT_MESSAGE,
        {
            "orig": {"family": 4, "proto": ICMP, "src": client, "dst": vip, "type": 8, "code": 0}
            | {"id": 7},
            "reply": {"family": 4, "proto": ICMP, "src": vip, "dst": client, "type": 0}
            | {"code": 0, "id": 7},
            "id": 3,
        },
    )
    v6_reply = tup(FAMILIES[6][2], FAMILIES[6][0], UDP, 5353, 40000)
    mixed = kernel_shaped(orig, v6_reply, status=IPS_DST_NAT, zone=0, ident=9, extras=False)
    no_id = base.replace(be32_attr(CTA_ID, 9), b"")
    twice_orig = base + orig_attr
    twice_status = base + be32_attr(CTA_STATUS, 0)
    short_port = base.replace(be16_attr(3, 53), attr(3, b"\0\0\0\x35"))
    cut = base[:-3]
    tcp_reply = base.replace(u8_attr(1, UDP), u8_attr(1, TCP), 2).replace(
        u8_attr(1, TCP), u8_attr(1, UDP), 1
    )
    return [
        ("icmp", hdr + icmp),
        ("mixed-families", mixed),
        ("no-id", no_id),
        ("orig-twice", twice_orig),
        ("status-twice", twice_status),
        ("port-of-4-bytes", short_port),
        ("cut", cut),
        ("protocols-differ", tcp_reply),
    ]


UNUSUAL = unusual_cases()


@pytest.mark.parametrize(("name", "payload"), UNUSUAL, ids=[n for n, _ in UNUSUAL])
def test_an_unusual_message_is_left_to_the_decoder(name: str, payload: bytes) -> None:
    fast = sweep_row(payload, {})
    try:
        slow = flow_row(decode_flow(payload))
    except ValueError:
        assert fast is None, name
        return
    if fast is not None:  # read anyway: then exactly as the decoder
        same(fast, slow)
    assert name != "icmp" or fast is None


def test_the_unusual_shapes_are_really_declined() -> None:
    declined = {name for name, p in UNUSUAL if sweep_row(p, {}) is None}
    assert declined == {
        "icmp",
        "mixed-families",
        "no-id",
        "orig-twice",
        "status-twice",
        "port-of-4-bytes",
        "protocols-differ",
    }


def test_rows_match_filters_as_flows_do() -> None:
    client, vip, backend = FAMILIES[4]
    flows = [
        Flow(
            orig=tup(client, vip, proto, 40000, port),
            reply=tup(be, client, proto, bport, 40000),
            status=status,
            id=1,
        )
        for proto, port, be, bport, status in itertools.product(
            (UDP, SCTP), (53, 54), (backend, vip), (5353, 53), (0, IPS_DST_NAT)
        )
    ]
    filters = [
        FlowFilter(),
        FlowFilter(proto="udp"),
        FlowFilter(proto="sctp", orig_dst=vip, orig_dport=53),
        FlowFilter(orig_dst=vip, reply_src=backend, reply_sport=5353),
        FlowFilter(proto="udp", orig_dst=vip, orig_dport=54, dnat=False),
        FlowFilter(family=6),
    ]
    for flt in filters:
        assert [row_matches(flt, flow_row(f)) for f in flows] == [flt.matches(f) for f in flows]


def test_one_reader_reads_every_message_as_the_decoder_once_layouts_are_learnt() -> None:
    # The same reader over every message, twice: the second time each is read at the offsets
    # learnt from it or from another message of its length.
    reader = SweepReader()
    messages = [p for _, p in PLAIN + UNUSUAL]
    declined = {p for _, p in UNUSUAL if sweep_row(p, {}) is None}
    read = 0
    for payload in messages + messages[::-1]:
        fast = reader.row(payload)
        if payload in declined:
            assert fast is None
            continue
        assert fast is not None
        same(fast, flow_row(decode_flow(payload)))
        read += 1
    assert read == 2 * (len(messages) - len(declined))


def test_a_learnt_layout_still_checks_the_values_it_reads() -> None:
    # Same length and headers as a plain flow, but the reply's protocol differs: declined.
    reader = SweepReader()
    plain, differ = PLAIN[0][1], dict(UNUSUAL)["protocols-differ"]
    base = next(p for n, p in PLAIN if n == "v4-17-natTrue-zone0-extrasFalse-o0")
    assert reader.row(base) is not None
    assert len(differ) == len(base)
    assert reader.row(differ) is None
    assert reader.row(plain) is not None
