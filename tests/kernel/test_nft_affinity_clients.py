"""A dynamic map's stale clients are read from the kernel and forgotten (``nft/dynmap.py``).

ClientIP affinity's per-port map ``client -> endpoint`` is filled by the packet path, which can
never delete an element: when an endpoint goes, the control plane deletes the clients held
for it. Here the map holds clients written by the control plane and one learned from a real
packet; the ones whose endpoint left are deleted, the others stay, with ``destroy`` and with
``delete`` (before Linux 6.3), also when an element went away between the read and the batch.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from ipaddress import IPv4Address

from nlproxy.netlink.nlsock import NetfilterSocket
from nlproxy.nft.backend import NftBackend, kernel_supports_destroy
from nlproxy.nft.dynmap import Clients, forget_stale, pack_endpoints, read_clients
from nlproxy.nft.ir import (
    Chain,
    ChainType,
    Cmp,
    DataType,
    Element,
    Family,
    Field,
    Hook,
    L4Proto,
    Map,
    Operation,
    Policy,
    Rule,
    Ruleset,
    SetFlag,
    SetUpdate,
    Table,
    Verb,
)
from nlproxy.nft.packed import PackedElements
from nlproxy.nft.reconcile import diff

T = Table(family=Family.IP, name="affclients")
AFF = Map(
    name="aff",
    key=(DataType.IPV4_ADDR,),
    data=(DataType.IPV4_ADDR, DataType.INET_SERVICE),
    flags=SetFlag.TIMEOUT | SetFlag.EVAL,
    timeout=600,
)
A = IPv4Address
GONE, KEPT = (A("10.1.0.1"), 80), (A("10.1.0.2"), 80)
LEARNED = (A("127.0.0.9"), 4242)


def _table(ns: str) -> NftBackend:
    """The map, a learning chain on output, and four clients: two of the endpoint that goes."""
    rs = Ruleset(table=T)
    rs.add_set(AFF)
    rs.add_chain(Chain(name="learn", type=ChainType.FILTER, hook=Hook.OUTPUT, priority=-99,
                       policy=Policy.ACCEPT))  # fmt: skip
    learn = SetUpdate("aff", (Field.IP_SADDR,), 600, (Field.IP_DADDR, Field.TH_DPORT))
    # (UDP only: the ICMP error the datagram draws passes output too)
    udp = Cmp(Field.META_L4PROTO, L4Proto.UDP)
    rs.add_rule(Rule(chain="learn", exprs=(udp, learn)))
    backend = NftBackend(T, netns=ns)
    clients = {"10.0.0.1": GONE, "10.0.0.2": KEPT, "10.0.0.3": GONE}
    backend.apply(
        [
            *diff(rs, None),
            *(Operation(Verb.ADD, Element(set="aff", key=(A(c),), value=ep))
              for c, ep in clients.items()),
        ]
    )  # fmt: skip
    for cmd in (
        ["ip", "addr", "add", "127.0.0.9/8", "dev", "lo"],
        ["python3", "-c", "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM);"
         "s.sendto(b'x', ('127.0.0.9', 4242))"],
    ):  # fmt: skip
        subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True)
    return backend


KEEP = pack_endpoints(AFF, [KEPT, LEARNED])
_KEY = PackedElements(Map(name="p", key=AFF.key, data=AFF.data))


def _held(sock: NetfilterSocket) -> dict[str, object]:
    return {
        str(_KEY.decode_key(k)[0]): _KEY.decode_data(d)
        for k, d in read_clients(sock, Family.IP, T.name, AFF).items()
    }


def test_read_gives_learned_and_written_clients(make_netns: Callable[[str], str]) -> None:
    ns = make_netns("affcl-read")
    with _table(ns), NetfilterSocket(ns) as sock:
        assert _held(sock) == {
            "10.0.0.1": GONE,
            "10.0.0.2": KEPT,
            "10.0.0.3": GONE,
            "127.0.0.1": LEARNED,
        }
        gone = Map(name="nosuch", key=AFF.key, data=AFF.data, flags=AFF.flags)
        assert read_clients(sock, Family.IP, T.name, gone) == {}


def test_clients_of_a_removed_endpoint_are_forgotten(make_netns: Callable[[str], str]) -> None:
    for destroy in (True, False) if kernel_supports_destroy() else (False,):
        ns = make_netns("affcl-forget")
        with _table(ns) as backend, NetfilterSocket(ns) as sock:

            def read(sock: NetfilterSocket = sock) -> Clients:
                return read_clients(sock, Family.IP, T.name, AFF)

            n = forget_stale(AFF, read, backend.apply, KEEP, destroy=destroy)
            assert (n, _held(sock)) == (2, {"10.0.0.2": KEPT, "127.0.0.1": LEARNED}), destroy


def test_a_client_gone_before_the_batch_is_no_error(make_netns: Callable[[str], str]) -> None:
    """A first read that still lists an element the kernel no longer has (it timed out): with
    ``delete`` the kernel refuses the batch (ENOENT), and the clients are read again."""
    ns = make_netns("affcl-race")
    with _table(ns) as backend, NetfilterSocket(ns) as sock:
        reads: list[Clients] = []

        def read() -> Clients:
            now = dict(read_clients(sock, Family.IP, T.name, AFF))
            if not reads:  # as if 10.0.0.9 had been read just before it timed out
                now[A("10.0.0.9").packed] = next(iter(pack_endpoints(AFF, [GONE])))
            reads.append(now)
            return now

        n = forget_stale(AFF, read, backend.apply, KEEP, destroy=False)
        assert (n, _held(sock)) == (2, {"10.0.0.2": KEPT, "127.0.0.1": LEARNED})
        assert len(reads) >= 3  # refused, read again and deleted, checked
