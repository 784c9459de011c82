"""The pure parts of conntrack cleanup: stale-flow filters, pass planning, read-back frontends,
and the ctnetlink codec. No kernel needed (they sit beside the kernel tests they serve)."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv6Address, ip_address

import pytest

from nlproxy.conntrack.kernel import (
    Backend,
    Frontend,
    UnexpectedElement,
    plan_passes,
    programmed_frontends,
    stale_flow_filters,
)
from nlproxy.conntrack.messages import Flow, FlowFilter, FlowTuple, decode_flow, encode_new
from nlproxy.nft.ir import DataType, Element, Family, Map, Ruleset, Table, Value, Verdict, goto

Addr = IPv4Address | IPv6Address
VIP, VIP6 = ip_address("10.96.0.10"), ip_address("fd00:96::10")
A, B = ip_address("10.244.0.1"), ip_address("10.244.0.2")
A6 = ip_address("fd00:244::1")
N1, N2, N6 = ip_address("192.168.0.1"), ip_address("192.168.0.2"), ip_address("fd00:1::1")


def fe(proto: str, addr: Addr | None, port: int) -> Frontend:
    return Frontend(proto, addr, port)


def bes(*pairs: tuple[Addr, int]) -> frozenset[Backend]:
    return frozenset(Backend(a, p) for a, p in pairs)


def stale(orig_dst: Addr, port: int, be: Addr, bport: int, proto: str = "udp") -> FlowFilter:
    return FlowFilter(
        proto=proto, orig_dst=orig_dst, orig_dport=port, reply_src=be, reply_sport=bport
    )


def cached(orig_dst: Addr, port: int) -> FlowFilter:
    return FlowFilter(proto="udp", orig_dst=orig_dst, orig_dport=port, dnat=False)


STALE_CASES = [
    pytest.param(
        {fe("udp", VIP, 53): bes((A, 53), (B, 53))},
        {fe("udp", VIP, 53): bes((B, 53))},
        False,
        {stale(VIP, 53, A, 53)},
        id="udp-endpoint-removed",
    ),
    pytest.param(
        {fe("udp", VIP, 53): bes((A, 53))},
        {fe("udp", VIP, 53): bes((A, 5353))},
        False,
        {stale(VIP, 53, A, 53)},
        id="target-port-changed",
    ),
    pytest.param(
        {fe("sctp", VIP, 9): bes((A, 9))},
        {},
        False,
        {stale(VIP, 9, A, 9, "sctp")},
        id="service-deleted-sctp",
    ),
    pytest.param(
        {fe("tcp", VIP, 80): bes((A, 80))}, {fe("tcp", VIP, 80): bes()}, False, set(), id="tcp-kept"
    ),
    pytest.param(
        {fe("tcp", VIP, 80): bes((A, 80))},
        {fe("tcp", VIP, 80): bes()},
        True,
        {stale(VIP, 80, A, 80, "tcp")},
        id="tcp-flushed",
    ),
    pytest.param(
        {fe("udp", None, 30053): bes((A, 53), (A6, 53))},
        {fe("udp", None, 30053): bes()},
        False,
        {stale(N1, 30053, A, 53), stale(N2, 30053, A, 53), stale(N6, 30053, A6, 53)},
        id="nodeport-each-node-address-of-the-backend-family",
    ),
    pytest.param(
        {fe("udp", VIP, 53): bes()},
        {fe("udp", VIP, 53): bes((A, 53))},
        False,
        {cached(VIP, 53)},
        id="udp-zero-to-some",
    ),
    pytest.param(
        {},
        {fe("udp", None, 53): bes((A, 53))},
        False,
        {cached(N1, 53), cached(N2, 53), cached(N6, 53)},
        id="new-udp-nodeport",
    ),
    pytest.param(
        {fe("tcp", VIP, 80): bes()},
        {fe("tcp", VIP, 80): bes((A, 80))},
        True,
        set(),
        id="tcp-zero-to-some-nothing-cached",
    ),
    pytest.param(
        {fe("udp", VIP6, 53): bes((A6, 53))},
        {fe("udp", VIP6, 53): bes((A6, 53))},
        True,
        set(),
        id="unchanged",
    ),
]


@pytest.mark.parametrize(("old", "new", "flush_tcp", "want"), STALE_CASES)
def test_stale_flow_filters(
    old: dict[Frontend, frozenset[Backend]],
    new: dict[Frontend, frozenset[Backend]],
    flush_tcp: bool,
    want: set[FlowFilter],
) -> None:
    got = stale_flow_filters(old, new, node_addrs=[N1, N2, N6], flush_tcp=flush_tcp)
    assert set(got) == want
    assert len(got) == len(want)
    assert got == stale_flow_filters(old, new, node_addrs=[N1, N2, N6], flush_tcp=flush_tcp)


def test_passes_group_a_removed_backend_across_clusterip_and_nodeports() -> None:
    filters = [stale(VIP, 53, A, 53), stale(N1, 30053, A, 53), stale(N2, 30053, A, 53)]
    (only,) = plan_passes(filters)
    assert only.kernel == FlowFilter(proto="udp", reply_src=A, reply_sport=53)
    assert set(only.members) == set(filters)


def test_passes_group_a_scaled_down_frontend() -> None:
    filters = [stale(VIP, 53, ip_address(f"10.244.0.{i}"), 53) for i in range(1, 20)]
    (only,) = plan_passes(filters)
    assert only.kernel == FlowFilter(proto="udp", orig_dst=VIP, orig_dport=53, reply_sport=53)


def test_too_many_passes_fall_back_to_one_per_family_and_protocol() -> None:
    filters = [
        stale(ip_address(f"10.96.0.{i}"), 53, ip_address(f"10.244.0.{i}"), 53) for i in range(100)
    ] + [stale(VIP6, 53, A6, 53)]
    passes = plan_passes(filters, max_passes=8)
    assert {p.kernel for p in passes} == {
        FlowFilter(proto="udp", orig_dport=53, reply_sport=53, family=4),
        FlowFilter(proto="udp", orig_dst=VIP6, orig_dport=53, reply_src=A6, reply_sport=53),
    }
    flow = Flow(
        orig=FlowTuple(ip_address("10.0.0.2"), ip_address("10.96.0.7"), 17, 1000, 53),
        reply=FlowTuple(ip_address("10.244.0.7"), ip_address("10.0.0.2"), 17, 53, 1000),
    )
    v4 = next(p for p in passes if p.kernel.family == 4)
    assert v4.matcher()(flow)
    assert not v4.matcher()(Flow(orig=flow.orig, reply=FlowTuple(B, flow.orig.src, 17, 53, 1000)))


def test_filter_validation() -> None:
    with pytest.raises(ValueError, match="mixes IPv4 and IPv6"):
        FlowFilter(orig_dst=VIP, reply_src=A6)
    with pytest.raises(ValueError, match="not one of tcp, udp, sctp"):
        FlowFilter(proto="icmp")
    assert FlowFilter(reply_src=A6).family == 6
    assert FlowFilter(dnat=False).is_empty is False
    assert FlowFilter().is_empty


def test_codec_round_trip() -> None:
    flow = Flow(
        orig=FlowTuple(ip_address("fd00:1::2"), VIP6, 132, 40000, 9),
        reply=FlowTuple(A6, ip_address("fd00:1::2"), 132, 9999, 40000),
        timeout=30,
        mark=0x4000,
    )
    back = decode_flow(encode_new(flow, 1)[16:])
    assert (back.orig, back.reply, back.timeout, back.mark) == (flow.orig, flow.reply, 30, 0x4000)
    assert back.proto == "sctp"
    assert back.family == 6


def El(
    name: str, key: tuple[Value, ...], value: tuple[Value, ...] | Verdict, comment: str = ""
) -> Element:
    return Element(set=name, key=key, value=value, comment=comment)


def ruleset(family: Family, *elements: Element) -> Ruleset:
    addr = DataType.IPV4_ADDR if family == Family.IP else DataType.IPV6_ADDR
    proto, port, idx = DataType.INET_PROTO, DataType.INET_SERVICE, DataType.MARK
    rs = Ruleset(Table(family=family, name="nlproxy"))
    for m in (
        Map(name="service-ips", key=(addr, proto, port), data=(DataType.VERDICT,)),
        Map(name="backends", key=(addr, proto, port, idx), data=(addr, port)),
        Map(name="service-nodeports", key=(proto, port), data=(DataType.VERDICT,)),
        Map(name="nodeport-backends", key=(proto, port, idx), data=(addr, port)),
    ):
        rs.add_set(m)
    for el in elements:
        rs.add_element(el)
    return rs


def test_programmed_frontends_from_hand_built_rulesets() -> None:
    v4 = ruleset(
        Family.IP,
        El("service-ips", (VIP, 17, 53), goto("lb2"), "kube-system/dns:dns/UDP"),
        El("service-ips", (VIP, 6, 53), goto("lb1"), "kube-system/dns:tcp/TCP"),
        El("service-ips", (B, 17, 9), goto("reject"), "default/none:/UDP"),
        El("backends", (VIP, 17, 53, 0), (A, 5353)),
        El("backends", (VIP, 17, 53, 1), (B, 5353)),
        El("backends", (VIP, 6, 53, 0), (A, 5353)),
        El("service-nodeports", (17, 30053), goto("np1"), "kube-system/dns:dns/UDP"),
        El("nodeport-backends", (17, 30053, 0), (A, 5353)),
    )  # fmt: skip
    v6 = ruleset(
        Family.IP6,
        El("service-ips", (VIP6, 17, 53), goto("lb1"), "kube-system/dns:dns/UDP"),
        El("backends", (VIP6, 17, 53, 0), (A6, 5353)),
        El("service-nodeports", (17, 30053), goto("np1"), "kube-system/dns:dns/UDP"),
        El("nodeport-backends", (17, 30053, 0), (A6, 5353)),
    )  # fmt: skip
    p = programmed_frontends([v4, v6])
    assert dict(p) == {
        fe("udp", VIP, 53): bes((A, 5353), (B, 5353)),
        fe("tcp", VIP, 53): bes((A, 5353)),
        fe("udp", B, 9): bes(),
        fe("udp", None, 30053): bes((A, 5353), (A6, 5353)),
        fe("udp", VIP6, 53): bes((A6, 5353)),
    }
    assert set(p.frontends_of("kube-system/dns")) == {
        fe("udp", VIP, 53), fe("tcp", VIP, 53), fe("udp", None, 30053), fe("udp", VIP6, 53)
    }  # fmt: skip
    assert p.frontends_of("kube-system/dns:tcp/TCP") == [fe("tcp", VIP, 53)]
    assert p.frontends_of("default/none") == [fe("udp", B, 9)]
    assert p.frontends_of("default/dns") == []


def test_programmed_frontends_names_a_malformed_element() -> None:
    rs = ruleset(Family.IP, El("backends", (VIP, 17, 53, 0), (A,)))
    with pytest.raises(UnexpectedElement, match=r"map backends: data is not addr \. port"):
        programmed_frontends([rs])


def test_prefilter_needs_every_address_of_some_member() -> None:
    (p,) = plan_passes([stale(VIP, 53, A, 53), stale(N1, 30053, A, 53)])
    screen = p.prefilter()
    assert screen is not None
    assert screen(b"x" + N1.packed + b"y" + A.packed)
    assert screen(A.packed + VIP.packed)
    assert not screen(VIP.packed + N1.packed)
    (any_dst,) = plan_passes([FlowFilter(proto="udp", orig_dport=53)])
    assert any_dst.prefilter() is None
