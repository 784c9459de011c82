"""Selecting flows for ``nlproxy conntrack list|flush`` without the kernel: the query's
filters, which flows are stale, and the per-frontend kernel filters."""

from __future__ import annotations

from ipaddress import ip_address

import pytest

from nlproxy.conntrack import messages as m
from nlproxy.conntrack.kernel import Backend
from nlproxy.conntrack.messages import Flow, FlowFilter, FlowTuple
from nlproxy.errors import ConfigError
from nlproxy.operate.conntrack import FlowQuery, _narrow, is_stale

CLIENT, VIP, POD = ip_address("10.0.0.9"), ip_address("10.96.0.10"), ip_address("10.244.1.5")
TCP, UDP = 6, 17


def flow(proto: int, answered_by: object, *, dnat: bool) -> Flow:
    reply_src = ip_address(str(answered_by))
    return Flow(
        orig=FlowTuple(CLIENT, VIP, proto, 40000, 53),
        reply=FlowTuple(reply_src, CLIENT, proto, 8053 if dnat else 53, 40000),
        status=m.IPS_DST_NAT if dnat else 0,
    )


@pytest.mark.parametrize(
    ("query", "every"),
    [
        pytest.param(FlowQuery(), True, id="nothing"),
        pytest.param(FlowQuery(proto="udp"), False, id="proto"),
        pytest.param(FlowQuery(endpoint=POD), False, id="endpoint"),
        pytest.param(FlowQuery(service="default/dns"), False, id="service"),
        pytest.param(FlowQuery(all_stale=True), False, id="all-stale"),
    ],
)
def test_selects_every_flow_only_without_any_filter(query: FlowQuery, every: bool) -> None:
    assert query.selects_every_flow() is every


def test_filters_of_two_families_are_a_config_error_naming_the_filter() -> None:
    query = FlowQuery(dst=VIP, endpoint=ip_address("fd00::5"))
    with pytest.raises(ConfigError, match="conntrack filter"):
        query.selects_every_flow()


@pytest.mark.parametrize(
    ("f", "backends", "stale"),
    [
        pytest.param(flow(UDP, POD, dnat=True), {Backend(POD, 8053)}, False, id="backend-kept"),
        pytest.param(flow(UDP, POD, dnat=True), set(), True, id="backend-gone"),
        pytest.param(flow(TCP, POD, dnat=True), {Backend(POD, 9)}, True, id="port-changed"),
        pytest.param(flow(UDP, VIP, dnat=False), {Backend(POD, 8053)}, True, id="udp-un-nated"),
        pytest.param(flow(UDP, VIP, dnat=False), set(), False, id="udp-still-no-backends"),
        pytest.param(flow(TCP, VIP, dnat=False), {Backend(POD, 8053)}, False, id="tcp-un-nated"),
    ],
)
def test_is_stale(f: Flow, backends: set[Backend], stale: bool) -> None:
    assert is_stale(f, frozenset(backends)) is stale


def test_narrow_to_one_frontend_or_none_where_the_filters_contradict() -> None:
    got = _narrow(FlowFilter(reply_src=POD), ("udp", VIP, 53))
    assert got == FlowFilter(proto="udp", orig_dst=VIP, orig_dport=53, reply_src=POD)
    assert _narrow(FlowFilter(proto="tcp"), ("udp", VIP, 53)) is None
    assert _narrow(FlowFilter(orig_dport=80), ("udp", VIP, 53)) is None
    assert _narrow(FlowFilter(family=6), ("udp", VIP, 53)) is None
