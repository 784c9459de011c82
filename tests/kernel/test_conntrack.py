"""Conntrack cleanup against real flows: a UDP client keeps one socket while its endpoint goes.

Topology (built with ``ip``/``nft`` from outside; nlproxy only talks ctnetlink):

    client ns  c0 10.0.0.2 / fd00:1::2  ──veth──  n0 10.0.0.1 / fd00:1::1  node ns
                                                 lo: endpoints A .1, B .2 (10.244.0.x, fd00:244::x)
                                                 svc0: route for the service range (no neighbour:
                                                       forwarded packets are confirmed, then lost)

The node DNATs service addresses and node ports to the endpoints with a plain nft table.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from ipaddress import ip_address

import pytest

from nlproxy.conntrack.kernel import Backend, Conntrack, Frontend, stale_flow_filters
from nlproxy.log import configure
from tests.kernel.conntrack_bed import PORT, TCP_PORT, V4, V6, Addr, Bed, make_bed


@pytest.fixture(autouse=True)
def _log_to_this_tests_stderr() -> None:
    """``cli.main`` binds structlog to the stderr of the test that called it; rebind it here."""
    configure(level="warning")


@pytest.fixture(params=[V4, V6], ids=["ipv4", "ipv6"])
def bed(request: pytest.FixtureRequest, make_netns: Callable[[str], str]) -> Iterator[Bed]:
    yield from make_bed(make_netns, request.param)


@pytest.fixture
def bed4(make_netns: Callable[[str], str]) -> Iterator[Bed]:
    yield from make_bed(make_netns, V4)


def _udp(fe_addr: Addr | None, port: int) -> Frontend:
    return Frontend("udp", fe_addr, port)


def test_clusterip_endpoint_removed_same_socket_reaches_remaining(bed: Bed) -> None:
    f = bed.fam
    bed.nft([bed.dnat("udp", f.vip, 53, f.a), bed.dnat("udp", f.vip2, 53, f.a)])
    client, other = bed.sock(bed.client), bed.sock(bed.client)
    assert bed.ask(client, f.vip, 53) == "A"
    assert bed.ask(other, f.vip2, 53) == "A"

    # A leaves the first service only; the rule now sends new flows to B.
    bed.nft([bed.dnat("udp", f.vip, 53, f.b), bed.dnat("udp", f.vip2, 53, f.a)])
    assert bed.ask(client, f.vip, 53) == "A", "conntrack should still pin the old endpoint"

    old = {
        _udp(f.vip, 53): frozenset({Backend(f.a, PORT), Backend(f.b, PORT)}),
        _udp(f.vip2, 53): frozenset({Backend(f.a, PORT)}),
    }
    new = {
        _udp(f.vip, 53): frozenset({Backend(f.b, PORT)}),
        _udp(f.vip2, 53): frozenset({Backend(f.a, PORT)}),
    }
    ct = Conntrack(bed.node)
    filters = stale_flow_filters(old, new, node_addrs=[f.node])
    assert ct.delete(filters) == 1
    assert ct.deleted_total == 1

    assert bed.ask(client, f.vip, 53) == "B"
    assert bed.ask(other, f.vip2, 53) == "A", "the other service's flow was touched"
    assert bed.flows("-d", str(f.vip2)) == 1


def test_nodeport_endpoint_gone_packets_vanish_until_cleanup(bed: Bed) -> None:
    f = bed.fam
    bed.nft([bed.dnat("udp", None, 30053, f.a)])
    client = bed.sock(bed.client)
    assert bed.ask(client, f.node, 30053) == "A"

    bed.stop("A", f.a)
    bed.nft([bed.dnat("udp", None, 30053, f.b)])
    assert bed.ask(client, f.node, 30053) is None, "the stale flow should blackhole the packet"

    fe = _udp(None, 30053)
    old = {fe: frozenset({Backend(f.a, PORT), Backend(f.b, PORT)})}
    new = {fe: frozenset({Backend(f.b, PORT)})}
    other_node_addr = ip_address("10.9.9.9") if f.version == 4 else ip_address("fd00:9::9")
    filters = stale_flow_filters(old, new, node_addrs=[f.node, other_node_addr])
    assert len(filters) == 2
    assert Conntrack(bed.node).delete(filters) == 1
    assert bed.ask(client, f.node, 30053) == "B"


def test_zero_to_some_endpoints_removes_cached_flow(bed: Bed) -> None:
    f = bed.fam
    bed.nft([bed.dnat("udp", f.vip, 53, f.a)])  # another service, keeps its flow
    keep = bed.sock(bed.client)
    assert bed.ask(keep, f.vip, 53) == "A"
    client = bed.sock(bed.client)
    assert bed.ask(client, f.vip_empty, 53) is None  # no endpoints: forwarded into the void
    assert bed.flows("-d", str(f.vip_empty)) == 1

    bed.nft([bed.dnat("udp", f.vip, 53, f.a), bed.dnat("udp", f.vip_empty, 53, f.b)])
    assert bed.ask(client, f.vip_empty, 53) is None, "the cached flow should bypass the DNAT"

    fe, other = _udp(f.vip_empty, 53), _udp(f.vip, 53)
    old = {fe: frozenset[Backend](), other: frozenset({Backend(f.a, PORT)})}
    new = {fe: frozenset({Backend(f.b, PORT)}), other: frozenset({Backend(f.a, PORT)})}
    assert Conntrack(bed.node).delete(stale_flow_filters(old, new, node_addrs=[f.node])) == 1
    assert bed.ask(client, f.vip_empty, 53) == "B"
    assert bed.ask(keep, f.vip, 53) == "A"
    assert bed.flows("-d", str(f.vip)) == 1


@pytest.mark.parametrize("flush_tcp", [False, True], ids=["tcp-kept", "tcp-flushed"])
def test_tcp_flows_kept_unless_flush_tcp(bed4: Bed, flush_tcp: bool) -> None:
    f = bed4.fam
    bed4.nft([bed4.dnat("udp", f.vip, 53, f.a), bed4.dnat("tcp", f.vip, 80, f.a, TCP_PORT)])
    listener = bed4.sock(bed4.node, socket.SOCK_STREAM)
    listener.bind((str(f.a), TCP_PORT))
    listener.listen()
    conn = bed4.sock(bed4.client, socket.SOCK_STREAM)
    conn.settimeout(5)
    conn.connect((str(f.vip), 80))
    accepted, _ = listener.accept()
    bed4.opened.append(accepted)
    udp = bed4.sock(bed4.client)
    assert bed4.ask(udp, f.vip, 53) == "A"

    gone = {Backend(f.a, PORT)}
    old = {
        _udp(f.vip, 53): frozenset(gone),
        Frontend("tcp", f.vip, 80): frozenset({Backend(f.a, TCP_PORT)}),
    }
    new = {_udp(f.vip, 53): frozenset[Backend](), Frontend("tcp", f.vip, 80): frozenset[Backend]()}
    filters = stale_flow_filters(old, new, node_addrs=[f.node], flush_tcp=flush_tcp)
    assert Conntrack(bed4.node).delete(filters) == (2 if flush_tcp else 1)
    assert bed4.flows("-p", "tcp", "-d", str(f.vip)) == (0 if flush_tcp else 1)
    assert bed4.flows("-p", "udp", "-d", str(f.vip)) == 0
