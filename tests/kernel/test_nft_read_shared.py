"""Read-back makes no object per address occurrence: a ClusterIP is in every backend element of
its service and an endpoint in both halves of its hairpin pair, and one object per occurrence
costs ~25 MB at 100k endpoints. Plain elements come back as the kernel's bytes (no address
object at all); decoded ones (with comments: another writer's) share one object per address."""

from __future__ import annotations

from collections.abc import Callable
from ipaddress import IPv4Address

from nlproxy.nft.backend import NftBackend
from nlproxy.nft.ir import DataType, Element, Family, Map, Operation, Set, Table, Verb
from nlproxy.nft.packed import PackedElements
from nlproxy.nft.readback import read_ruleset

T = Table(family=Family.IP, name="shared")
A4, PROTO, PORT, MARK = (
    DataType.IPV4_ADDR,
    DataType.INET_PROTO,
    DataType.INET_SERVICE,
    DataType.MARK,
)
BACKENDS = Map(name="backends", key=(A4, PROTO, PORT, MARK), data=(A4, PORT))
PAIRS = Set(name="pairs", key=(A4, A4))


def test_an_address_is_one_object_across_elements_and_sets(
    make_netns: Callable[[str], str],
) -> None:
    vip, ep = IPv4Address("10.96.0.1"), IPv4Address("10.244.0.5")
    els = [
        Element(set="backends", key=(vip, 6, 80, i), value=(ep, 8080), comment="c")
        for i in range(3)
    ]
    els.append(Element(set="pairs", key=(ep, ep), comment="c"))
    with NftBackend(T, netns=make_netns("shared")) as backend:
        backend.apply([Operation(Verb.ADD, o) for o in (T, BACKENDS, PAIRS, *els)])
        rs = read_ruleset(Family.IP, "shared", netns=backend.netns)
    assert rs is not None
    got = [*rs.elements["backends"].values(), *rs.elements["pairs"].values()]
    assert sorted(map(str, got)) == sorted(map(str, els))  # read back whole and right
    vips = {id(el.key[0]) for el in rs.elements["backends"].values()}
    eps = {id(el.value[0]) for el in rs.elements["backends"].values()}  # type: ignore[index]
    eps |= {id(part) for el in rs.elements["pairs"].values() for part in el.key}
    assert len(vips) == 1
    assert len(eps) == 1


def test_plain_elements_are_read_back_as_the_bytes_sent(
    make_netns: Callable[[str], str],
) -> None:
    vip, ep = IPv4Address("10.96.0.1"), IPv4Address("10.244.0.5")
    els = [Element(set="backends", key=(vip, 6, 80, i), value=(ep, 8080)) for i in range(3)]
    els.append(Element(set="pairs", key=(ep, ep)))
    with NftBackend(T, netns=make_netns("packed")) as backend:
        backend.apply([Operation(Verb.ADD, o) for o in (T, BACKENDS, PAIRS, *els)])
        rs = read_ruleset(Family.IP, "shared", netns=backend.netns)
    assert rs is not None
    sent = {name: PackedElements(s) for name, s in (("backends", BACKENDS), ("pairs", PAIRS))}
    for el in els:
        sent[el.set][el.key] = el
    for name, store in sent.items():
        got = rs.elements[name]
        assert isinstance(got, PackedElements)
        assert got.raw == store.raw
        assert sorted(map(str, got.values())) == sorted(map(str, store.values()))
