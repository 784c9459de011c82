"""Conntrack cleanup against real flows: a UDP client keeps one socket while its endpoint goes.

Topology (built with ``ip``/``nft`` from outside; nlproxy only talks ctnetlink):

    client ns  c0 10.0.0.2 / fd00:1::2  ──veth──  n0 10.0.0.1 / fd00:1::1  node ns
                                                 lo: endpoints A .1, B .2 (10.244.0.x, fd00:244::x)
                                                 svc0: route for the service range (no neighbour:
                                                       forwarded packets are confirmed, then lost)

The node DNATs service addresses and node ports to the endpoints with a plain nft table.
"""

from __future__ import annotations

import select
import socket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv6Address, ip_address

import pytest

from nlproxy.conntrack.kernel import Backend, Conntrack, Frontend, stale_flow_filters
from nlproxy.log import configure
from nlproxy.netlink import netns as nsmod
from tests.netns import sh

Addr = IPv4Address | IPv6Address
PORT = 5353  # endpoints listen here
TCP_PORT = 8080


@pytest.fixture(autouse=True)
def _log_to_this_tests_stderr() -> None:
    """``cli.main`` binds structlog to the stderr of the test that called it; rebind it here."""
    configure(level="warning")


@dataclass
class Family:
    version: int
    node: Addr
    client: Addr
    a: Addr
    b: Addr
    vip: Addr
    vip2: Addr
    vip_empty: Addr
    pod_range: str
    svc_range: str
    plen: int

    @property
    def af(self) -> int:
        return socket.AF_INET if self.version == 4 else socket.AF_INET6

    @property
    def nft_family(self) -> str:
        return "ip" if self.version == 4 else "ip6"


V4 = Family(
    4,
    *map(ip_address, ["10.0.0.1", "10.0.0.2", "10.244.0.1", "10.244.0.2"]),
    *map(ip_address, ["10.96.0.10", "10.96.0.11", "10.96.0.20"]),
    "10.244.0.0/24",
    "10.96.0.0/16",
    32,
)
V6 = Family(
    6,
    *map(ip_address, ["fd00:1::1", "fd00:1::2", "fd00:244::1", "fd00:244::2"]),
    *map(ip_address, ["fd00:96::10", "fd00:96::11", "fd00:96::20"]),
    "fd00:244::/64",
    "fd00:96::/64",
    128,
)


@dataclass
class Bed:
    node: str
    client: str
    fam: Family
    servers: dict[str, socket.socket] = field(default_factory=dict)
    opened: list[socket.socket] = field(default_factory=list)

    def sock(self, ns: str, kind: int = socket.SOCK_DGRAM) -> socket.socket:
        with nsmod.entered(ns):
            s = socket.socket(self.fam.af, kind)
        self.opened.append(s)
        return s

    def serve(self, name: str, addr: Addr) -> None:
        s = self.sock(self.node)
        s.bind((str(addr), PORT))
        self.servers[name] = s

    def stop(self, name: str, addr: Addr) -> None:
        """The endpoint's pod is gone: its socket and address disappear (blackholed)."""
        self.servers.pop(name).close()
        sh("ip", "addr", "del", f"{addr}/{self.fam.plen}", "dev", "lo", ns=self.node)

    def ask(self, client: socket.socket, dst: Addr, port: int) -> str | None:
        """Send from ``client``; the endpoint that got it answers with its name (None: lost)."""
        client.sendto(b"ping", (str(dst), port))
        ready, _, _ = select.select(list(self.servers.values()), [], [], 1.5)
        if not ready:
            return None
        name = next(n for n, s in self.servers.items() if s is ready[0])
        _data, peer = ready[0].recvfrom(100)
        ready[0].sendto(name.encode(), peer)
        client.settimeout(5)
        reply, src = client.recvfrom(100)
        assert ip_address(src[0]) == dst, f"reply from {src}, not un-NATed to {dst}"
        return reply.decode()

    def nft(self, rules: list[str]) -> None:
        """Replace the node's DNAT table with ``rules`` (nft syntax, prerouting nat)."""
        fam = self.fam.nft_family
        text = (
            f"table {fam} svc {{}}\nflush table {fam} svc\n"
            f"table {fam} svc {{ chain pre {{ type nat hook prerouting priority dstnat;\n"
            + "\n".join(rules)
            + "\n}\n}\n"
        )
        subprocess.run(
            ["ip", "netns", "exec", self.node, "nft", "-f", "-"], input=text, text=True, check=True
        )

    def dnat(self, proto: str, dst: Addr | None, port: int, to: Addr, to_port: int = PORT) -> str:
        match = f"{self.fam.nft_family} daddr {dst} " if dst is not None else ""
        target = f"[{to}]:{to_port}" if self.fam.version == 6 else f"{to}:{to_port}"
        return f"{match}{proto} dport {port} dnat to {target}"

    def flows(self, *args: str) -> int:
        """How many flows ``conntrack -L`` shows in the node with these filters."""
        out = sh("conntrack", "-L", "-f", f"ipv{self.fam.version}", *args, ns=self.node)
        return len([line for line in out.splitlines() if line.strip()])


def _topology(node: str, client: str, fam: Family) -> None:
    sh("ip", "link", "add", "n0", "netns", node, "type", "veth", "peer", "c0", "netns", client)
    sh("ip", "link", "add", "svc0", "type", "veth", "peer", "svc1", ns=node)
    for ns, dev in ((node, "n0"), (client, "c0"), (node, "svc0"), (node, "svc1")):
        sh("ip", "link", "set", dev, "up", ns=ns)
    p = 24 if fam.version == 4 else 64
    v = f"-{fam.version}"
    sh("ip", v, "addr", "add", f"{fam.node}/{p}", "dev", "n0", "nodad", ns=node)
    sh("ip", v, "addr", "add", f"{fam.client}/{p}", "dev", "c0", "nodad", ns=client)
    sh("ip", v, "route", "add", "default", "via", str(fam.node), ns=client)
    for ep in (fam.a, fam.b):
        sh("ip", v, "addr", "add", f"{ep}/{fam.plen}", "dev", "lo", ns=node)
    sh("ip", v, "route", "add", "blackhole", fam.pod_range, ns=node)
    sh("ip", v, "route", "add", fam.svc_range, "dev", "svc0", ns=node)
    key = "net.ipv4.ip_forward=1" if fam.version == 4 else "net.ipv6.conf.all.forwarding=1"
    sh("sysctl", "-qw", key, ns=node)


def _make_bed(make_netns: Callable[[str], str], fam: Family) -> Iterator[Bed]:
    bed = Bed(make_netns("ctnode"), make_netns("ctcli"), fam)
    try:
        _topology(bed.node, bed.client, fam)
        bed.serve("A", fam.a)
        bed.serve("B", fam.b)
        yield bed
    finally:
        for s in bed.opened:
            s.close()


@pytest.fixture(params=[V4, V6], ids=["ipv4", "ipv6"])
def bed(request: pytest.FixtureRequest, make_netns: Callable[[str], str]) -> Iterator[Bed]:
    yield from _make_bed(make_netns, request.param)


@pytest.fixture
def bed4(make_netns: Callable[[str], str]) -> Iterator[Bed]:
    yield from _make_bed(make_netns, V4)


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
