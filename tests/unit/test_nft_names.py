"""``ir.names``: the one answer to "which chains and sets does this expression name?", and the
fake's reference checks that stand on it (no kernel: the kernel's side is
``tests/kernel/test_nft_fake.py``)."""

from __future__ import annotations

import errno
from ipaddress import IPv4Address
from typing import get_args

import pytest

from nlproxy.errors import KernelError
from nlproxy.nft import fake
from nlproxy.nft.ir import (
    ACCEPT,
    Chain,
    Cmp,
    Counter,
    Dnat,
    DnatMap,
    Expr,
    Family,
    Field,
    InlineVMap,
    Lookup,
    MarkSet,
    Masquerade,
    Names,
    Numgen,
    Operation,
    Reject,
    Rule,
    SetUpdate,
    Table,
    Verb,
    VMap,
    goto,
    jump,
    names,
)

KEY = (Field.IP_DADDR, Field.TH_DPORT)

CASES = [
    pytest.param(jump("a"), Names(("a",), ()), id="jump"),
    pytest.param(goto("a"), Names(("a",), ()), id="goto"),
    pytest.param(ACCEPT, Names((), ()), id="accept"),
    pytest.param(
        InlineVMap((Field.TH_DPORT,), (((53,), goto("b")), ((80,), ACCEPT), ((81,), jump("c")))),
        Names(("b", "c"), ()),
        id="inline-vmap",
    ),
    pytest.param(Lookup(KEY, "s"), Names((), ("s",)), id="lookup"),
    pytest.param(SetUpdate("aff", (Field.IP_SADDR,), 300), Names((), ("aff",)), id="set-update"),
    pytest.param(VMap(KEY, "m"), Names((), ("m",)), id="vmap"),
    pytest.param(DnatMap((*KEY, Numgen(2)), "backends"), Names((), ("backends",)), id="dnat-map"),
    pytest.param(Cmp(Field.TH_DPORT, 53), Names((), ()), id="cmp"),
    pytest.param(Counter(), Names((), ()), id="counter"),
    pytest.param(MarkSet(0x4000), Names((), ()), id="mark-set"),
    pytest.param(Dnat(IPv4Address("10.0.0.1"), 80), Names((), ()), id="dnat"),
    pytest.param(Masquerade(), Names((), ()), id="masquerade"),
    pytest.param(Reject(), Names((), ()), id="reject"),
]


@pytest.mark.parametrize(("expr", "want"), CASES)
def test_names_of_an_expression(expr: Expr, want: Names) -> None:
    assert names(expr) == want


def test_every_kind_of_expression_has_a_case() -> None:
    covered = {type(p.values[0]) for p in CASES}
    assert covered == set(get_args(Expr))


T = Table(family=Family.IP, name="t")
SETUP = [
    Operation(Verb.ADD, T),
    Operation(Verb.ADD, Chain(name="services")),
    Operation(Verb.ADD, Chain(name="svc")),
    Operation(
        Verb.ADD,
        Rule(chain="services", exprs=(InlineVMap((Field.TH_DPORT,), (((53,), goto("svc")),)),)),
    ),
]


def test_the_fake_holds_a_chain_an_inline_verdict_map_names() -> None:
    rs = fake.apply(None, SETUP)
    with pytest.raises(KernelError) as exc:
        fake.apply(rs, [Operation(Verb.DELETE, Chain(name="svc"))])
    assert exc.value.errno == errno.EBUSY
    flushed = fake.apply(
        rs,
        [Operation(Verb.FLUSH, Chain(name="services")), Operation(Verb.DELETE, Chain(name="svc"))],
    )
    assert set(flushed.chains) == {"services"}


def test_the_fake_refuses_an_inline_verdict_map_to_an_unknown_chain() -> None:
    rule = Rule(chain="services", exprs=(InlineVMap((Field.TH_DPORT,), (((80,), jump("no")),)),))
    with pytest.raises(KernelError) as exc:
        fake.apply(fake.apply(None, SETUP), [Operation(Verb.ADD, rule)])
    assert exc.value.errno == errno.ENOENT
