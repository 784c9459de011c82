"""Bulk element validation: long runs of valid additions pass in bulk, and any bad element in
a run is still found and named exactly as the element-by-element check names it."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network, IPv6Address
from typing import Any

import pytest

from nlproxy.errors import InvalidNftObject
from nlproxy.nft.bulkcheck import elements_ok, run_end
from nlproxy.nft.ir import (
    Chain,
    DataType,
    Element,
    Family,
    L4Proto,
    Map,
    Operation,
    Ruleset,
    Set,
    SetFlag,
    Table,
    Verb,
    Verdict,
    VerdictKind,
    jump,
)
from nlproxy.nft.validate import _RANGES, ELEMENT_COMMENT_MAXLEN, validate

T = Table(family=Family.IP, name="nlp")
KEY3 = (DataType.IPV4_ADDR, DataType.INET_PROTO, DataType.INET_SERVICE)
BACKENDS = Map(
    name="backends", key=(*KEY3, DataType.MARK), data=(DataType.IPV4_ADDR, DataType.INET_SERVICE)
)
SVC = Map(name="svc", key=KEY3, data=(DataType.VERDICT,))
CIDRS = Set(name="cidrs", key=(DataType.IPV4_ADDR,), flags=SetFlag.INTERVAL)
N = 200


def backend(i: int, **over: Any) -> Element:
    fields: dict[str, Any] = {
        "set": "backends",
        "key": (IPv4Address(0x0A600000 + i), L4Proto.TCP if i % 2 else 6, 80, i % 10),
        "value": (IPv4Address(0x0A800000 + i), 8080),
    }
    fields.update(over)
    return Element(**fields)


def adds(els: list[Element]) -> list[Operation]:
    return [Operation(Verb.ADD, el) for el in els]


def known() -> Ruleset:
    rs = Ruleset(table=T)
    for s in (BACKENDS, SVC, CIDRS):
        rs.add_set(s)
    rs.add_chain(Chain(name="svc-a"))
    return rs


def ok(s: Any, els: list[Element], chains: set[str] | None = None) -> bool:
    return elements_ok(
        s, els, ranges=_RANGES, chains=chains or set(), comment_max=ELEMENT_COMMENT_MAXLEN
    )


def test_the_planners_backend_pairs_pass_in_bulk_and_quickly() -> None:
    """The planner's backends map data is its (address, port) ``Backend`` pair, a tuple type:
    both fast paths accept it (a plan of 100k backends must not take the element-by-element
    check), and a bad one in such a run is still refused."""
    from nlproxy.nft.validate import _quick_check, _Scope
    from nlproxy.proxy.endpoints import Backend

    index_map = Map(name="backends", key=(*KEY3, DataType.INTEGER), data=BACKENDS.data)
    pairs = [backend(i, value=Backend(IPv4Address(0x0A800000 + i), 8080)) for i in range(N)]
    assert ok(index_map, pairs)
    assert _quick_check(index_map, _Scope(None))(pairs[0])
    bad = [*pairs, backend(N, value=Backend(IPv4Address(1), 70000))]
    assert not ok(index_map, bad)


def test_valid_runs_pass_in_bulk() -> None:
    assert ok(BACKENDS, [backend(i) for i in range(N)])
    svc = [
        Element(set="svc", key=(IPv4Address(0x0A600000 + i), 6, 80), value=jump("svc-a"))
        for i in range(N)
    ]
    assert ok(SVC, svc, {"svc-a"})
    cidrs = [Element(set="cidrs", key=(IPv4Network(f"10.{i}.0.0/16"),)) for i in range(N)]
    assert ok(CIDRS, cidrs)
    validate(T, adds([backend(i) for i in range(N)]) + adds(svc) + adds(cidrs), known())


BAD: list[tuple[str, dict[str, Any]]] = [
    ("port too large", {"key": (IPv4Address("10.96.0.1"), 6, 65536, 0)}),
    ("negative mark", {"key": (IPv4Address("10.96.0.1"), 6, 80, -1)}),
    ("bool proto", {"key": (IPv4Address("10.96.0.1"), True, 80, 0)}),
    ("v6 address", {"key": (IPv6Address("fd00::1"), 6, 80, 0)}),
    ("network in a plain key", {"key": (IPv4Network("10.0.0.0/8"), 6, 80, 0)}),
    ("short key", {"key": (IPv4Address("10.96.0.1"), 6, 80)}),
    ("string port", {"key": (IPv4Address("10.96.0.1"), 6, "80", 0)}),
    ("data too short", {"value": (IPv4Address("10.128.0.1"),)}),
    ("data port too large", {"value": (IPv4Address("10.128.0.1"), 70000)}),
    ("verdict as data", {"value": Verdict(VerdictKind.ACCEPT)}),
    ("no data", {"value": None}),
    ("timeout on a set without timeouts", {"timeout": 5}),
    ("comment too long", {"comment": "x" * 300}),
]


@pytest.mark.parametrize(("why", "over"), BAD, ids=[b[0] for b in BAD])
def test_one_bad_element_fails_the_bulk_check(why: str, over: dict[str, Any]) -> None:
    els = [backend(i) for i in range(N)]
    els[N // 2] = backend(N // 2, **over)
    assert not ok(BACKENDS, els), why


@pytest.mark.parametrize(("why", "over"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_element_in_a_long_run_gets_the_same_message(why: str, over: dict[str, Any]) -> None:
    bad = backend(N // 2, **over)
    with pytest.raises(InvalidNftObject) as alone:
        validate(T, adds([bad]), known())
    els = [backend(i) for i in range(N)]
    els[N // 2] = bad
    with pytest.raises(InvalidNftObject) as in_run:
        validate(T, adds(els), known())
    assert str(in_run.value) == str(alone.value), why


def test_vmap_jump_to_an_unknown_chain_is_named() -> None:
    els = [
        Element(set="svc", key=(IPv4Address(0x0A600000 + i), 6, 80), value=jump("svc-a"))
        for i in range(N)
    ]
    els[7] = Element(set="svc", key=(IPv4Address("10.96.9.9"), 6, 80), value=jump("nowhere"))
    assert not ok(SVC, els, {"svc-a"})
    with pytest.raises(InvalidNftObject, match="nowhere"):
        validate(T, adds(els), known())


def test_run_end_stops_at_another_set_or_verb() -> None:
    els = [backend(i) for i in range(5)]
    other = Element(set="svc", key=(IPv4Address("10.96.0.1"), 6, 80), value=jump("svc-a"))
    ops = [*adds(els[:3]), Operation(Verb.DELETE, els[3]), *adds([els[4], other])]
    assert run_end(ops, 0) == 3
    assert run_end(ops, 3) == 4
    assert run_end(ops, 4) == 5
    assert run_end(ops, 5) == 6
