"""``nft/fake.py`` against the kernel: the same batches, the same answers.

Each case sends a set-up batch and then one more batch both to a fresh table in a namespace
(through the netlink backend) and to the fake; both must accept it or both refuse it, with the
same errno, and after a refusal both must still hold exactly what the set-up made.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from ipaddress import IPv4Address

import pytest

from nlproxy.errors import InvalidNftObject, KernelError
from nlproxy.nft import fake
from nlproxy.nft.backend import NftBackend, kernel_supports_destroy
from nlproxy.nft.ir import (
    Chain,
    DataType,
    Element,
    Family,
    Field,
    InlineVMap,
    L4Proto,
    Map,
    Operation,
    Rule,
    Ruleset,
    Table,
    Verb,
    goto,
    jump,
)
from nlproxy.nft.readback import read_ruleset

T = Table(family=Family.IP, name="nlpfake")
KEY = (DataType.IPV4_ADDR, DataType.INET_PROTO, DataType.INET_SERVICE)
SVC = Map(name="service-ips", key=KEY, data=(DataType.VERDICT,))
VIP = (IPv4Address("10.96.0.10"), int(L4Proto.TCP), 53)
INLINE = (((53,), goto("svc-inline")),)


def op(verb: Verb, obj: object) -> Operation:
    return Operation(verb, obj)  # type: ignore[arg-type]


SETUP = [
    op(Verb.ADD, T),
    op(Verb.ADD, Chain(name="services")),
    op(Verb.ADD, Chain(name="svc-dns")),
    op(Verb.ADD, Chain(name="spare")),
    op(Verb.ADD, SVC),
    op(Verb.ADD, Element(set=SVC.name, key=VIP, value=jump("svc-dns"))),
    op(Verb.ADD, Rule(chain="services", exprs=(jump("spare"),))),
    # An inline verdict map: the kernel holds the chains its verdicts name, as a jump's.
    op(Verb.ADD, Chain(name="svc-inline")),
    op(Verb.ADD, Rule(chain="services", exprs=(InlineVMap((Field.TH_DPORT,), INLINE),))),
]

CASES: dict[str, tuple[list[Operation], int | None]] = {
    "new chain, rule jumping to it": (
        [op(Verb.ADD, Chain(name="x")), op(Verb.ADD, Rule(chain="services", exprs=(jump("x"),)))],
        None,
    ),
    "rule jumping to an unknown chain": (
        [op(Verb.ADD, Rule(chain="services", exprs=(jump("nowhere"),)))],
        errno.ENOENT,
    ),
    "rule in an unknown chain": (
        [op(Verb.ADD, Rule(chain="nowhere", exprs=(jump("spare"),)))],
        errno.ENOENT,
    ),
    "delete a chain a rule jumps to": (
        [op(Verb.FLUSH, Chain(name="spare")), op(Verb.DELETE, Chain(name="spare"))],
        errno.EBUSY,
    ),
    "delete a chain a map element jumps to": (
        [op(Verb.DELETE, Chain(name="svc-dns"))],
        errno.EBUSY,
    ),
    "delete a chain an inline verdict map names": (
        [op(Verb.DELETE, Chain(name="svc-inline"))],
        errno.EBUSY,
    ),
    "delete an inline verdict map's chain after its rule's chain is flushed": (
        [op(Verb.FLUSH, Chain(name="services")), op(Verb.DELETE, Chain(name="svc-inline"))],
        None,
    ),
    "rule whose inline verdict map names an unknown chain": (
        [
            op(
                Verb.ADD,
                Rule(
                    chain="spare",
                    exprs=(InlineVMap((Field.TH_DPORT,), (((80,), goto("nowhere")),)),),
                ),
            )
        ],
        errno.ENOENT,
    ),
    "delete a chain with rules (they go with it)": (
        [op(Verb.DELETE, Chain(name="services")), op(Verb.DELETE, Chain(name="spare"))],
        None,
    ),
    "delete the rule's user first, then the chain": (
        [op(Verb.FLUSH, Chain(name="services")), op(Verb.DELETE, Chain(name="spare"))],
        None,
    ),
    "delete an absent element": (
        [op(Verb.DELETE, Element(set=SVC.name, key=(VIP[0], VIP[1], 54)))],
        errno.ENOENT,
    ),
    "element in an unknown set": (
        [op(Verb.ADD, Element(set="nothing", key=VIP, value=jump("svc-dns")))],
        errno.ENOENT,
    ),
    "create an existing chain": ([op(Verb.CREATE, Chain(name="spare"))], errno.EEXIST),
    "delete an absent chain": ([op(Verb.DELETE, Chain(name="gone"))], errno.ENOENT),
    "last step refused, first steps undone": (
        [op(Verb.ADD, Chain(name="y")), op(Verb.DELETE, Chain(name="gone"))],
        errno.ENOENT,
    ),
}
if kernel_supports_destroy():
    CASES["destroy an absent chain"] = ([op(Verb.DESTROY, Chain(name="gone"))], None)


def shape(rs: Ruleset | None) -> tuple[object, ...]:
    """What both sides must agree on: chains, each chain's jumps, sets, element keys."""
    assert rs is not None
    return (
        sorted(rs.chains),
        {c: [str(r.exprs[-1]) for r in rules] for c, rules in sorted(rs.rules.items())},
        sorted(rs.sets),
        {s: sorted(map(str, els)) for s, els in sorted(rs.elements.items())},
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_fake_answers_as_the_kernel(make_netns: Callable[[str], str], case: str) -> None:
    batch, refused_with = CASES[case]
    ns = make_netns("fake")
    with NftBackend(T, netns=ns) as kernel:
        kernel.apply(SETUP)
        before = fake.apply(None, SETUP)
        assert shape(read_ruleset(T.family, T.name, netns=ns)) == shape(before)

        kernel_errno = fake_errno = None
        try:
            kernel.apply(batch)
        except KernelError as exc:
            kernel_errno = exc.errno
        except InvalidNftObject:
            kernel_errno = -1  # refused before it was sent: the fake must refuse it too
        try:
            after = fake.apply(before, batch)
        except KernelError as exc:
            fake_errno, after = exc.errno, before
        assert fake_errno == refused_with
        assert kernel_errno in (refused_with, -1 if refused_with else None)
        assert shape(read_ruleset(T.family, T.name, netns=ns)) == shape(after)
