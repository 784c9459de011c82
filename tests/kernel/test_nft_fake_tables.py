"""The fakes the sync's unit tests run on, against the kernel: the same batches through
``NftBackend`` and ``FakeTables``, the same answers, the same read-back.

Each case sends a set-up batch, then one more batch, to a fresh table in a namespace and to a
``FakeNftables``: both accept it or both refuse it with the same errno; afterwards both read back
the same chains, rules (by comment), sets and elements, packed maps as the same bytes; the
generation moved by as many commits on both sides; a chain's rule comments read the same.
Packed runs are among the batches, and the overlaps of a concatenated interval set that the
kernel refuses (the refusal the sync's bisection unit test relies on).
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Callable
from ipaddress import IPv4Address, IPv4Network

import pytest

from nlproxy.errors import InvalidNftObject, KernelError
from nlproxy.nft.backend import NftBackend
from nlproxy.nft.fake import FakeNftables
from nlproxy.nft.ir import (
    Chain,
    DataType,
    Element,
    Family,
    Map,
    Operation,
    PackedRun,
    Rule,
    Ruleset,
    Set,
    SetFlag,
    Table,
    Verb,
    jump,
)
from nlproxy.nft.packed import PackedElements
from nlproxy.nft.readback import KernelReadBack

T = Table(family=Family.IP, name="nlpfaket")
BACKENDS = Map(
    name="backends",
    key=(DataType.IPV4_ADDR, DataType.INET_PROTO, DataType.INET_SERVICE, DataType.INTEGER),
    data=(DataType.IPV4_ADDR, DataType.INET_SERVICE),
)
ALLOW = Set(
    name="firewall-allow",
    key=(DataType.IPV4_ADDR, DataType.INET_PROTO, DataType.INET_SERVICE, DataType.IPV4_ADDR),
    flags=SetFlag.INTERVAL,
)
LB = IPv4Address("192.0.2.50")
VIP = IPv4Address("10.96.0.1")


def op(verb: Verb, obj: object) -> Operation:
    return Operation(verb, obj)  # type: ignore[arg-type]


def run(*indices: int, data: bool = True) -> PackedRun:
    store = PackedElements(BACKENDS)
    for i in indices:
        store[(VIP, 6, 80, i)] = Element(
            set=BACKENDS.name, key=(VIP, 6, 80, i), value=(IPv4Address(f"10.244.0.{i + 1}"), 8080)
        )
    return PackedRun(
        set=BACKENDS.name, keys=list(store.raw), data=list(store.raw.values()) if data else None
    )


def allow(net: str) -> Element:
    return Element(set=ALLOW.name, key=(LB, 6, 80, IPv4Network(net)))


SETUP = [
    op(Verb.ADD, T),
    op(Verb.ADD, Chain(name="services")),
    op(Verb.ADD, Chain(name="spare")),
    op(Verb.ADD, BACKENDS),
    op(Verb.ADD, ALLOW),
    op(Verb.ADD, run(0, 1, 2)),
    op(Verb.ADD, allow("10.0.0.0/8")),
    op(Verb.ADD, Rule(chain="services", exprs=(jump("spare"),), comment="fp=0123456789ab")),
]

CASES: dict[str, tuple[list[Operation], int | None]] = {
    "a packed run adds": ([op(Verb.ADD, run(3, 4))], None),
    "a packed run deletes": ([op(Verb.DELETE, run(0, 2, data=False))], None),
    "a packed run deletes an absent element": (
        [op(Verb.DELETE, run(1, 7, data=False))],
        errno.ENOENT,
    ),
    "a packed run creates an existing element": ([op(Verb.CREATE, run(5, 1))], errno.EEXIST),
    "a packed run into an unknown set": (
        [op(Verb.ADD, PackedRun(set="nothing", keys=run(3).keys, data=run(3).data))],
        -1,
    ),
    "a range inside another's": ([op(Verb.ADD, allow("10.1.0.0/16"))], errno.EEXIST),
    "a range holding another's": (
        [
            op(Verb.DELETE, allow("10.0.0.0/8")),
            op(Verb.ADD, allow("10.1.0.0/16")),
            op(Verb.ADD, allow("10.0.0.0/8")),
        ],
        None,
    ),
    "a range beside another's": ([op(Verb.ADD, allow("11.0.0.0/8"))], None),
    "the same range again": ([op(Verb.ADD, allow("10.0.0.0/8"))], None),
    "a range starting where another does": ([op(Verb.ADD, allow("10.0.0.0/7"))], errno.EEXIST),
    "the same packed elements again": ([op(Verb.ADD, run(0, 1))], None),
    "the same chain again": ([op(Verb.ADD, Chain(name="spare"))], None),
    "the same table again": ([op(Verb.ADD, T)], None),
    "a rule with a comment": (
        [op(Verb.ADD, Rule(chain="spare", exprs=(jump("services"),), comment="fp=ba9876543210"))],
        None,
    ),
    "elements go, the last step refused": (
        [op(Verb.DELETE, run(0, data=False)), op(Verb.DELETE, Chain(name="gone"))],
        errno.ENOENT,
    ),
}


def seen(rs: Ruleset | None) -> tuple[object, ...]:
    """What both read-backs must agree on; packed elements as their bytes."""
    assert rs is not None
    elements = {
        name: ("packed", dict(els.raw))
        if isinstance(els, PackedElements)
        else ("plain", sorted(map(str, els)))
        for name, els in sorted(rs.elements.items())
    }
    return (
        sorted(rs.chains),
        {
            c: [(str(r.exprs[-1]), r.comment) for r in rules]
            for c, rules in sorted(rs.rules.items())
        },
        {name: (type(s).__name__, s.key, s.flags) for name, s in sorted(rs.sets.items())},
        elements,
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_fake_tables_answer_and_read_back_as_the_kernel(
    make_netns: Callable[[str], str], case: str
) -> None:
    batch, refused_with = CASES[case]
    ns = make_netns("faket")
    nft = FakeNftables(T.name)
    fake = nft.open(T)
    kernel_rb = KernelReadBack(T.name, ns)
    with NftBackend(T, netns=ns) as kernel, contextlib.closing(kernel_rb):
        gen0 = kernel_rb.generation()
        kernel.apply(SETUP)
        fake.apply(SETUP)
        assert seen(kernel_rb.dump(T.family)) == seen(nft.dump(T.family))

        outcomes: list[int | None] = []
        for side in (kernel, fake):
            try:
                side.apply(batch)
            except KernelError as exc:
                outcomes.append(exc.errno)
            except InvalidNftObject:  # refused before it was sent
                outcomes.append(-1)
            else:
                outcomes.append(None)
        assert outcomes == [refused_with, refused_with]
        assert seen(kernel_rb.dump(T.family)) == seen(nft.dump(T.family))
        assert kernel_rb.generation() - gen0 == nft.generation()
        for chain in ("services", "spare", "nowhere"):
            assert kernel_rb.comments(T.family, chain) == nft.comments(T.family, chain)
        assert kernel_rb.dump(Family.IP6) is None
        assert nft.dump(Family.IP6) is None
