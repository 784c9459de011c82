"""A set's elements are written as element by element, in ``key_order``: the per-set
formatting (parts chosen once, address texts shared across sets, a flattened sort) changes
nothing, for every kind of part, value and element option."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

from nlproxy.nft.ir import (
    ACCEPT,
    DataType,
    Element,
    Family,
    Map,
    Ruleset,
    Set,
    SetFlag,
    Table,
    Value,
    goto,
)
from nlproxy.nft.render import (
    format_key,
    format_time,
    format_verdict,
    render_ruleset,
    render_set,
)
from nlproxy.nft.values import key_order

A = IPv4Address("10.0.0.9")
B = IPv4Address("10.0.0.10")
D = DataType


def one_by_one(s: Set | Map, elements: dict[tuple[Value, ...], Element]) -> list[str]:
    """The element texts the slow way: ``format_key`` per element, sorted by ``key_order``."""
    out = []
    for k in sorted(elements, key=key_order):
        el = elements[k]
        text = format_key(el.key, s.key)
        if isinstance(s, Set) and s.counter:
            text += " counter"
        if el.timeout is not None:
            text += f" timeout {format_time(el.timeout)}"
        if el.comment:
            text += f' comment "{el.comment}"'
        if el.value is not None and not isinstance(el.value, tuple):
            text += f" : {format_verdict(el.value)}"
        elif el.value is not None:
            text += f" : {format_key(el.value, s.data if isinstance(s, Map) else ())}"
        out.append(text)
    return out


def elements_of(s: Set | Map, *els: Element) -> dict[tuple[Value, ...], Element]:
    return {e.key: e for e in els}


CASES: list[tuple[Set | Map, dict[tuple[Value, ...], Element]]] = [
    (
        Map(name="m", key=(D.IPV4_ADDR, D.INET_PROTO, D.INET_SERVICE, D.INTEGER),
            data=(D.IPV4_ADDR, D.INET_SERVICE)),
        elements_of(
            Map(name="m", key=(), data=()),
            *(Element(set="m", key=(a, p, port, i), value=(b, 8080))
              for a in (B, A) for p in (17, 6, 132, 250) for port in (443, 80) for i in (1, 0)
              for b in (A,)),
        ),
    ),
    (
        Set(name="cidrs", key=(D.IPV4_ADDR,), flags=SetFlag.INTERVAL),
        elements_of(
            Set(name="x", key=()),
            Element(set="cidrs", key=(IPv4Network("10.0.0.0/8"),)),
            Element(set="cidrs", key=(IPv4Network("10.0.0.9/32"),)),
            Element(set="cidrs", key=(A,)),
            Element(set="cidrs", key=(IPv4Network("9.0.0.0/8"),), comment="c"),
        ),
    ),
    (
        Set(name="six", key=(D.IPV6_ADDR, D.IPV6_ADDR), counter=True, timeout=60),
        elements_of(
            Set(name="x", key=()),
            Element(set="six", key=(IPv6Address("fd00::2"), IPv6Address("::ffff:1.2.3.4"))),
            Element(set="six", key=(IPv6Network("fd00::/64"), IPv6Address("fd00::1")),
                    timeout=3600),
        ),
    ),
    (
        Set(name="v6", key=(D.IPV6_ADDR, D.INET_SERVICE)),
        elements_of(
            Set(name="x", key=()),
            *(Element(set="v6", key=(IPv6Address(a), p))
              for a in ("fd00::10", "fd00::9", "::1", "fd00::9:0") for p in (53, 5353, 1)),
        ),
    ),
    (
        Map(name="vm", key=(D.MARK, D.INET_PROTO), data=(D.VERDICT,)),
        elements_of(
            Map(name="x", key=(), data=()),
            Element(set="vm", key=(0x4000, 6), value=goto("svc-a")),
            Element(set="vm", key=(1, 255), value=ACCEPT),
            Element(set="vm", key=(True, 17), value=ACCEPT),
        ),
    ),
]  # fmt: skip


def test_each_set_is_written_as_element_by_element() -> None:
    for s, els in CASES:
        lines = render_set(s, els)
        expected = one_by_one(s, els)
        text = "\n".join(lines)
        body = text[text.index("elements = { ") + len("elements = { ") : text.rindex(" }")]
        assert [t.strip() for row in body.split(",\n") for t in row.split(", ")] == expected


def test_an_address_shared_by_sets_reads_the_same_in_each() -> None:
    rs = Ruleset(Table(family=Family.IP, name="t"))
    for s, els in CASES[:2]:
        rs.add_set(s)
        for el in els.values():
            rs.add_element(Element(set=s.name, key=el.key, value=el.value, comment=el.comment))
    text = render_ruleset(rs)
    for s, els in CASES[:2]:
        for line in one_by_one(s, els):
            assert line in text
