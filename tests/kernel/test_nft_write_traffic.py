"""Real packets through the lean shape programmed by NftBackend.

One namespace; the service address and two endpoint addresses live on its loopback. A nat output
chain dispatches ``ip daddr . meta l4proto . th dport`` through a service vmap to ``lb2``, which
DNATs through ``numgen random mod 2`` into the ``backends`` map; an input rule rejects UDP to
a service without endpoints (UDP only: the ICMP answer itself must pass). UDP clients (sockets
opened in the namespace) send to the service; each endpoint answers, and the client must see the
answer come from the service address (conntrack reverses the DNAT).
"""

from __future__ import annotations

import select
import socket
from collections.abc import Callable, Iterator
from ipaddress import IPv4Address

import pytest

from nlproxy.netlink import netns as nsmod
from nlproxy.nft.backend import NftBackend
from nlproxy.nft.ir import (
    PRIORITY_DSTNAT,
    Chain,
    ChainType,
    Cmp,
    DataType,
    DnatMap,
    Element,
    Family,
    Field,
    Hook,
    L4Proto,
    Map,
    Numgen,
    Operation,
    Policy,
    Reject,
    Rule,
    Table,
    Verb,
    VMap,
    goto,
)
from tests.netns import sh

VIP, PORT = IPv4Address("10.96.0.10"), 53
EMPTY_VIP = IPv4Address("10.96.0.11")
ENDPOINTS = [IPv4Address("10.244.0.1"), IPv4Address("10.244.0.2")]
TARGET = 5353
KEY = (Field.IP_DADDR, Field.META_L4PROTO, Field.TH_DPORT)
T = Table(family=Family.IP, name="nlproxy")


def lean_shape() -> list[Operation]:
    backends = Map(
        name="backends",
        key=(DataType.IPV4_ADDR, DataType.INET_PROTO, DataType.INET_SERVICE, DataType.MARK),
        data=(DataType.IPV4_ADDR, DataType.INET_SERVICE),
    )
    svc = Map(name="service-ips", key=backends.key[:3], data=(DataType.VERDICT,))
    out = Chain(name="nat-output", type=ChainType.NAT, hook=Hook.OUTPUT,
                priority=PRIORITY_DSTNAT, policy=Policy.ACCEPT)  # fmt: skip
    filt = Chain(name="filter-input", type=ChainType.FILTER, hook=Hook.INPUT, priority=0,
                 policy=Policy.ACCEPT)  # fmt: skip
    objs = [
        T, backends, svc, out, filt, Chain(name="lb2"),
        Rule(chain="lb2", exprs=(DnatMap((*KEY, Numgen(2)), "backends"),)),
        Rule(chain="nat-output", exprs=(VMap(KEY, "service-ips"),)),
        Rule(chain="filter-input", exprs=(Cmp(Field.IP_DADDR, EMPTY_VIP),
                                          Cmp(Field.META_L4PROTO, L4Proto.UDP), Reject())),
        Element(set="service-ips", key=(VIP, L4Proto.UDP, PORT), value=goto("lb2")),
        *(Element(set="backends", key=(VIP, L4Proto.UDP, PORT, i), value=(ep, TARGET))
          for i, ep in enumerate(ENDPOINTS)),
    ]  # fmt: skip
    return [Operation(Verb.ADD, o) for o in objs]


@pytest.fixture
def ns(make_netns: Callable[[str], str]) -> str:
    name = make_netns("nftt")
    for addr in (VIP, EMPTY_VIP, *ENDPOINTS):
        sh("ip", "addr", "add", f"{addr}/32", "dev", "lo", ns=name)
    return name


@pytest.fixture
def servers(ns: str) -> Iterator[list[socket.socket]]:
    socks = []
    with nsmod.entered(ns):
        for ep in ENDPOINTS:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((str(ep), TARGET))
            socks.append(s)
    yield socks
    for s in socks:
        s.close()


def serve_one(servers: list[socket.socket]) -> int:
    """Answer one datagram; return the index of the endpoint that got it."""
    ready, _, _ = select.select(servers, [], [], 5.0)
    assert ready, "no endpoint received the datagram"
    s = ready[0]
    _, peer = s.recvfrom(100)
    s.sendto(b"from " + s.getsockname()[0].encode(), peer)
    return servers.index(s)


def test_udp_to_service_spreads_over_endpoints(ns: str, servers: list[socket.socket]) -> None:
    with NftBackend(T, netns=ns) as backend:
        backend.apply(lean_shape())
        seen = [0, 0]
        for i in range(40):
            with nsmod.entered(ns):
                client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            with client:
                # Source ports of their own per phase (below the ephemeral range): a port used
                # again would find its flow's conntrack entry, still bound to the old endpoint.
                client.bind(("", 20000 + i))
                client.settimeout(5.0)
                client.sendto(b"hi", (str(VIP), PORT))
                seen[serve_one(servers)] += 1
                answer, source = client.recvfrom(100)
            assert source == (str(VIP), PORT)
            assert answer.startswith(b"from 10.244.0.")
        assert all(seen), f"numgen mod 2 sent everything to one endpoint: {seen}"

        # an endpoint removed in one element operation: all new flows go to the other
        gone = Element(set="backends", key=(VIP, L4Proto.UDP, PORT, 1))
        keep = Element(
            set="backends", key=(VIP, L4Proto.UDP, PORT, 1), value=(ENDPOINTS[0], TARGET)
        )
        backend.apply([Operation(Verb.DELETE, gone), Operation(Verb.ADD, keep)])
        for i in range(10):
            with nsmod.entered(ns):
                client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            with client:
                client.bind(("", 21000 + i))
                client.settimeout(5.0)
                client.sendto(b"hi", (str(VIP), PORT))
                assert serve_one(servers) == 0
                client.recvfrom(100)


def test_reject_answers_with_port_unreachable(ns: str) -> None:
    with NftBackend(T, netns=ns) as backend:
        backend.apply(lean_shape())
        with nsmod.entered(ns):
            client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with client:
            client.settimeout(5.0)
            client.connect((str(EMPTY_VIP), PORT))
            client.send(b"hi")
            with pytest.raises(ConnectionRefusedError):
                client.recv(100)
