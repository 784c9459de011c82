"""Read-back right after a commit that grew a hash map: the kernel resizes the map's hash table
in deferred work after the commit, and a dump whose messages straddle that resize lists some
elements twice and as many not at all, without NLM_F_DUMP_INTR (the generation did not move).
A read-back must never return such a walk: it sees the repeated key, reads again, and hands
back every element once.

Each round adds a fresh map of 100k elements in one batch and reads the table back at once;
about every other such read meets the resize here. Rounds go on until one read was seen to
dump the map more than once (the disturbed walk, then its retry), with a generous bound.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from contextlib import closing
from ipaddress import IPv4Address

import pytest

from nlproxy.netlink.codec import NFGENMSG, NLM_F_DUMP_INTR, Message, span_map, spans
from nlproxy.netlink.nlsock import NetfilterSocket
from nlproxy.nft.backend import NftBackend
from nlproxy.nft.dynmap import read_clients
from nlproxy.nft.ir import DataType, Element, Family, L4Proto, Map, Operation, Table, Verb
from nlproxy.nft.packed import PackedElements
from nlproxy.nft.readback import read_ruleset
from nlproxy.nft.readsets import elements_request
from nlproxy.nft.uapi import (
    NFT_MSG_GETSETELEM,
    NFTA_DATA_VALUE,
    NFTA_SET_ELEM_KEY,
    NFTA_SET_ELEM_LIST_ELEMENTS,
)
from nlproxy.nft.values import Packer

T = Table(family=Family.IP, name="nlp")
KEY = (DataType.IPV4_ADDR, DataType.INET_PROTO, DataType.INET_SERVICE, DataType.MARK)
DATA = (DataType.IPV4_ADDR, DataType.INET_SERVICE)
COUNT = 100_000
ROUNDS = 60
"""Rounds before giving up on meeting a resize (each met one about every other round)."""
NFNL_SUBSYS_NFTABLES = 10
GETSETELEM = NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_GETSETELEM


class CountingSocket(NetfilterSocket):
    """A real socket that counts the element dumps it is asked for (the request's type)."""

    def __init__(self, netns: str) -> None:
        super().__init__(netns)
        self.element_dumps = 0

    def dump(self, request: bytes, seq: int) -> Iterator[Message]:
        if struct.unpack_from("=H", request, 4)[0] == GETSETELEM:
            self.element_dumps += 1
        return super().dump(request, seq)


def key_of(i: int) -> tuple[IPv4Address, L4Proto, int, int]:
    return IPv4Address(0x0A000000 + i // 10), L4Proto.TCP, 80, i % 10


def data_of(i: int) -> tuple[IPv4Address, int]:
    return IPv4Address(0x0AF40000 + i), 8080


@pytest.fixture
def ns(make_netns: Callable[[str], str]) -> str:
    return make_netns("walk")


@pytest.fixture
def backend(ns: str) -> Iterator[NftBackend]:
    with NftBackend(T, netns=ns) as b:
        b.apply([Operation(Verb.ADD, T)])
        yield b


@pytest.fixture(scope="module")
def wanted() -> dict[bytes, bytes]:
    """The 100k elements as the kernel holds them: packed key -> packed data."""
    key, data = Packer(KEY), Packer(DATA)
    return {key.pack(key_of(i)): data.pack(data_of(i)) for i in range(COUNT)}


def fresh_map(backend: NftBackend, name: str) -> Map:
    """A new map of :data:`COUNT` elements, added in one batch."""
    m = Map(name=name, key=KEY, data=DATA)
    elements = (Element(set=name, key=key_of(i), value=data_of(i)) for i in range(COUNT))
    backend.apply([Operation(Verb.ADD, m), *(Operation(Verb.ADD, el) for el in elements)])
    return m


def test_a_map_read_right_after_the_commit_that_grew_it_comes_back_whole(
    ns: str, backend: NftBackend, wanted: dict[bytes, bytes]
) -> None:
    retried = 0
    with closing(CountingSocket(ns)) as sock:
        for r in range(ROUNDS):
            m = fresh_map(backend, f"backends{r}")
            before = sock.element_dumps
            rs = read_ruleset(Family.IP, T.name, sock=sock)
            assert rs is not None
            got = rs.elements[m.name]
            assert isinstance(got, PackedElements)
            assert len(got) == COUNT, f"round {r}: {COUNT - len(got)} elements left out"
            assert got.raw == wanted, f"round {r}: elements differ"
            backend.apply([Operation(Verb.DELETE, m)])
            if sock.element_dumps - before > 1:  # the map was dumped again: a walk was disturbed
                retried += 1
                break
    assert retried, f"no read-back met the map's resize in {ROUNDS} rounds"


def test_one_map_read_right_after_the_commit_that_grew_it_comes_back_whole(
    ns: str, backend: NftBackend, wanted: dict[bytes, bytes]
) -> None:
    """The read of one map alone (``read_clients``, the affinity maps' read) retries too."""
    retried = 0
    with closing(CountingSocket(ns)) as sock:
        for r in range(ROUNDS):
            m = fresh_map(backend, f"clients{r}")
            before = sock.element_dumps
            got = read_clients(sock, Family.IP, T.name, m)
            assert len(got) == COUNT, f"round {r}: {COUNT - len(got)} elements left out"
            assert got == wanted, f"round {r}: elements differ"
            backend.apply([Operation(Verb.DELETE, m)])
            if sock.element_dumps - before > 1:
                retried += 1
                break
    assert retried, f"no read met the map's resize in {ROUNDS} rounds"


def test_the_kernel_repeats_as_many_keys_as_it_leaves_out(ns: str, backend: NftBackend) -> None:
    """What the check stands on: one dump right after such a commit, keys counted as sent. With
    nothing else changing, each key sent twice stands for one never sent; the dump carries no
    NLM_F_DUMP_INTR (``sock.dump`` yields every message, flags and all)."""
    with NetfilterSocket(ns) as sock:
        for r in range(ROUNDS):
            m = fresh_map(backend, f"raw{r}")
            seq = sock.next_seq()
            keys: list[bytes] = []
            for msg in sock.dump(elements_request(Family.IP, T.name, m.name, seq), seq):
                assert not msg.flags & NLM_F_DUMP_INTR
                keys += _keys(msg.payload)
            backend.apply([Operation(Verb.DELETE, m)])
            assert len(keys) == COUNT
            if len(set(keys)) < COUNT:
                return
    pytest.fail(f"no dump met the map's resize in {ROUNDS} rounds")


def _keys(payload: bytes) -> list[bytes]:
    """The keys of the elements of one NEWSETELEM message (``payload``: after its header)."""
    out = []
    for kind, lo, hi in spans(payload, NFGENMSG.size):
        if kind != NFTA_SET_ELEM_LIST_ELEMENTS:
            continue
        for _, elo, ehi in spans(payload, lo, hi):
            key = span_map(payload, elo, ehi)[NFTA_SET_ELEM_KEY]
            value = span_map(payload, *key)[NFTA_DATA_VALUE]
            out.append(payload[value[0] : value[1]])
    return out
