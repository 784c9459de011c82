"""A refused element of a packed run is named as the element it is: the same message as when
the element is sent as an IR element, and the error carries its packed key (so the sync can
tell which service wrote it)."""

from __future__ import annotations

from collections.abc import Callable
from ipaddress import IPv4Address

import pytest

from nlproxy.errors import KernelError
from nlproxy.nft.backend import NftBackend
from nlproxy.nft.ir import DataType, Element, Family, Map, Operation, PackedRun, Table, Verb
from nlproxy.nft.packed import PackedElements

T = Table(family=Family.IP, name="packed")
BACKENDS = Map(
    name="backends",
    key=(DataType.IPV4_ADDR, DataType.INET_PROTO, DataType.INET_SERVICE, DataType.INTEGER),
    data=(DataType.IPV4_ADDR, DataType.INET_SERVICE),
)
VIP, EP = IPv4Address("10.96.0.1"), IPv4Address("10.244.0.5")


def _elements() -> list[Element]:
    return [Element(set="backends", key=(VIP, 6, 80, i), value=(EP, 8080 + i)) for i in range(40)]


def _refusal(netns: str, op: Operation) -> KernelError:
    els = _elements()
    with NftBackend(T, netns=netns) as backend:
        backend.apply([Operation(Verb.ADD, o) for o in (T, BACKENDS, els[17])])
        with pytest.raises(KernelError) as info:
            backend.apply([op])
    return info.value


def test_a_refused_packed_element_reads_as_the_element(
    make_netns: Callable[[str], str],
) -> None:
    store = PackedElements(BACKENDS)
    for el in _elements():
        store[el.key] = el
    run = PackedRun(set="backends", keys=list(store.raw), data=list(store.raw.values()))
    packed = _refusal(make_netns("packed"), Operation(Verb.CREATE, run))
    els = _elements()
    plain = _refusal(make_netns("plain"), Operation(Verb.CREATE, els[17]))
    assert str(packed) == str(plain)
    assert "element 10.96.0.1 . tcp . 80 . 17 in map backends" in str(packed)
    assert packed.element == store.pack_key(els[17].key)
    assert packed.errno == plain.errno


def test_a_refused_packed_delete_reads_as_the_element(make_netns: Callable[[str], str]) -> None:
    """A delete's run carries keys only, also from a map: the error still names the element."""
    store = PackedElements(BACKENDS)
    absent = Element(set="backends", key=(VIP, 6, 80, 3), value=(EP, 8083))
    store[absent.key] = absent
    refused = _refusal(
        make_netns("pdel"), Operation(Verb.DELETE, PackedRun(set="backends", keys=list(store.raw)))
    )
    assert "element 10.96.0.1 . tcp . 80 . 3 in map backends" in str(refused)
    assert refused.element == store.pack_key(absent.key)
