"""A node, a client and UDP/TCP endpoints in namespaces, for the conntrack cleanup tests: what
the stale-flow tests and the conntrack command's tests both stand on."""

from __future__ import annotations

import select
import socket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv6Address, ip_address

from nlproxy.netlink import netns as nsmod
from tests.netns import sh

Addr = IPv4Address | IPv6Address
PORT = 5353  # endpoints listen here
TCP_PORT = 8080


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


def topology(node: str, client: str, fam: Family) -> None:
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


def make_bed(make_netns: Callable[[str], str], fam: Family) -> Iterator[Bed]:
    bed = Bed(make_netns("ctnode"), make_netns("ctcli"), fam)
    try:
        topology(bed.node, bed.client, fam)
        bed.serve("A", fam.a)
        bed.serve("B", fam.b)
        yield bed
    finally:
        for s in bed.opened:
            s.close()
