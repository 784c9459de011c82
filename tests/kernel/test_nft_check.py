"""``NftBackend.check``: the kernel judges a batch it then throws away.

The batch is sent without BATCH_END, so the kernel processes and answers every message and then
aborts. Checked from outside with ``nft``: nothing of a checked batch is ever in the table, and
a refused batch raises exactly what :meth:`NftBackend.apply` raises for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from ipaddress import IPv4Network

import pytest

from nlproxy.errors import KernelError
from nlproxy.nft.backend import NftBackend
from nlproxy.nft.ir import (
    Chain,
    ChainType,
    DataType,
    Element,
    Family,
    Hook,
    Operation,
    Rule,
    Set,
    SetFlag,
    Table,
    Verb,
    goto,
)
from tests.netns import sh

T = Table(family=Family.IP, name="chk")
RANGES = Set(
    name="ranges",
    key=(DataType.IPV4_ADDR, DataType.INET_SERVICE, DataType.IPV4_ADDR),
    flags=SetFlag.INTERVAL,
)


def add(*objs: object) -> list[Operation]:
    return [Operation(Verb.ADD, o) for o in objs]  # type: ignore[arg-type]


def ranged(net: str) -> Element:
    return Element(set="ranges", key=(IPv4Network("192.0.2.1/32"), 80, IPv4Network(net)))


@pytest.fixture
def backend(make_netns: Callable[[str], str]) -> Iterator[NftBackend]:
    b = NftBackend(T, netns=make_netns("chk"))
    b.apply(add(T, Chain(name="c"), RANGES, ranged("10.0.0.0/8")))
    try:
        yield b
    finally:
        b.close()


def listing(b: NftBackend) -> str:
    return sh("nft", "list", "table", "ip", "chk", ns=b.netns)


def test_an_acceptable_batch_passes_and_changes_nothing(backend: NftBackend) -> None:
    before = listing(backend)
    backend.check(add(Chain(name="d"), ranged("172.16.0.0/12")))
    assert listing(backend) == before
    assert "chain d" not in before
    # The backend's view did not learn the chain either: a rule in it is refused before sending.
    backend.apply(add(Chain(name="d"), Rule(chain="d", exprs=(goto("c"),))))
    assert "chain d" in listing(backend)


def test_a_refused_batch_raises_what_apply_raises_and_changes_nothing(
    backend: NftBackend,
) -> None:
    before = listing(backend)
    ops = add(Chain(name="e"), ranged("10.1.0.0/16"))  # overlaps 10.0.0.0/8: refused
    with pytest.raises(KernelError) as checked:
        backend.check(ops)
    assert listing(backend) == before
    with pytest.raises(KernelError) as applied:
        backend.apply(ops)
    assert str(checked.value) == str(applied.value)
    assert checked.value.index == applied.value.index == 1
    assert "10.1.0.0/16 in set ranges" in str(checked.value)
    assert listing(backend) == before


def test_the_kernel_refuses_what_validation_lets_through(backend: NftBackend) -> None:
    # A jump to a base chain is valid in shape; only the kernel knows it is not allowed.
    base = Chain(name="in", type=ChainType.FILTER, hook=Hook.INPUT, priority=0)
    backend.apply(add(base))
    with pytest.raises(KernelError) as exc:
        backend.check(add(Rule(chain="c", exprs=(goto("in"),))))
    assert exc.value.index == 0
    assert "Operation not supported" in str(exc.value)
    assert "goto in" not in listing(backend)
