"""The ctnetlink attribute table: what the encoder writes, the decoder reads back, and the walk
that learns line layouts finds every value a line shows where the decoder reads it."""

from __future__ import annotations

from ipaddress import ip_address

import pytest

from nlproxy.conntrack import lines
from nlproxy.conntrack import messages as m
from nlproxy.conntrack.messages import CT_MESSAGE, Flow, FlowTuple, Leaf, Nest

ADDRS = {4: ("10.0.0.1", "10.96.0.1"), 6: ("fd00::1", "fd00:96::1")}
PROTOS = {4: (6, 17, 132, 1, 47), 6: (6, 17, 132, 58, 47)}


def _flows() -> list[Flow]:
    out: list[Flow] = []
    for family, (a, b) in ADDRS.items():
        src, dst = ip_address(a), ip_address(b)
        for proto in PROTOS[family]:
            icmp = (8, 0, 4242) if proto in (1, 58) else None
            ports = (0, 0) if icmp else (40000, 53)
            extras = ({}, {"zone": 7, "id": 99, "status": 0x26, "mark": 3, "use": 2})
            out.extend(
                Flow(
                    orig=FlowTuple(src, dst, proto, *ports, icmp),
                    reply=FlowTuple(dst, src, proto, *ports[::-1], icmp),
                    timeout=120,
                    **extra,  # type: ignore[arg-type]
                )
                for extra in extras
            )
    return out


def _values(flow: Flow) -> m.Values:
    return {
        "orig": m._tuple_values(flow.orig),
        "reply": m._tuple_values(flow.reply),
        "zone": flow.zone or None,
        "id": flow.id,
        "status": flow.status,
        "mark": flow.mark,
        "timeout": flow.timeout,
        "use": flow.use,
    }


@pytest.mark.parametrize("flow", _flows(), ids=str)
def test_what_the_table_writes_it_reads_back(flow: Flow) -> None:
    payload = bytes(4) + m.write_attrs(CT_MESSAGE, _values(flow))
    assert m.decode_flow(payload) == flow


@pytest.mark.parametrize("flow", _flows(), ids=str)
def test_the_walk_finds_each_shown_value_where_the_decoder_reads_it(flow: Flow) -> None:
    payload = bytes(4) + m.write_attrs(CT_MESSAGE, _values(flow))
    _headers, where = lines._walk(payload)
    decoded: m.Values = {}
    m.read_attrs(payload, 4, len(payload), CT_MESSAGE, decoded)
    expected = {}
    for key, value in decoded.items():
        if isinstance(value, dict):
            expected |= {key[0] + k: v for k, v in value.items()}
        elif key not in ("id",):  # conntrack -L does not print the flow's id
            expected[key] = value
    assert set(where) == set(expected)
    for key, (offset, code) in where.items():
        size = {"B": 1, "H": 2, "I": 4}.get(code) or int(code[:-1])
        raw = payload[offset : offset + size]
        value = expected[key]
        want = value.packed if code.endswith("s") else value.to_bytes(len(raw), "big")
        assert raw == want, key


def test_an_address_attribute_is_chosen_by_family_and_an_icmp_key_by_protocol() -> None:
    v6 = next(f for f in _flows() if f.orig.proto == 58)
    written = m.write_attrs(CT_MESSAGE, _values(v6))
    assert m._nla(m.CTA_IP_V6_SRC, v6.orig.src.packed) in written
    assert m._nla(m.CTA_PROTO_ICMPV6_TYPE, bytes([8])) in written
    assert m._nla(m.CTA_PROTO_ICMP_TYPE, bytes([8])) not in written


def test_every_leaf_has_a_reader_and_a_writer() -> None:
    def leaves(tree: Nest) -> list[Leaf]:
        out: list[Leaf] = []
        for spec in tree.children.values():
            out += [spec] if isinstance(spec, Leaf) else leaves(spec)
        return out

    codes = {leaf.code for leaf in leaves(CT_MESSAGE)}
    assert codes <= set(m._READ) & set(m._WRITE)
