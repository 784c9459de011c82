"""Round trip through nlproxy's own write path: what ``NftBackend`` programs reads back as the
same IR, and ``nft list`` prints it as the compatibility table says nft's own text looks."""

from __future__ import annotations

import re
from collections.abc import Callable
from ipaddress import IPv4Address, IPv4Network, IPv6Network

import pytest

from nlproxy.nft.backend import NftBackend, kernel_supports_persist
from nlproxy.nft.ir import (
    Chain,
    ChainType,
    DataType,
    Element,
    Expr,
    Family,
    Hook,
    Map,
    Operation,
    Policy,
    Rule,
    Set,
    SetFlag,
    SetLike,
    Table,
    Value,
    Verb,
    goto,
    jump,
)
from nlproxy.nft.readback import read_ruleset
from nlproxy.nft.render import render_rule, render_ruleset
from tests.kernel.nft_read_cases import CASES, TABLE, nft_rules
from tests.netns import sh

PROTO, PORT, MARK, VERDICT = (
    DataType.INET_PROTO,
    DataType.INET_SERVICE,
    DataType.MARK,
    DataType.VERDICT,
)


def declarations(family: Family) -> list[SetLike]:
    """The IR twins of the compatibility table's prelude sets."""
    if family is Family.INET:
        return []
    addr = DataType.IPV4_ADDR if family is Family.IP else DataType.IPV6_ADDR
    out: list[SetLike] = [
        Set(
            name="aff",
            key=(addr, PROTO, PORT),
            flags=SetFlag.EVAL | SetFlag.TIMEOUT,
            timeout=3 * 3600,
        ),
        Set(name="cidrs", key=(addr,), flags=SetFlag.INTERVAL),
        Map(name="dispatch", key=(addr, PROTO, PORT), data=(VERDICT,)),
        Map(name="backends", key=(addr, PORT, MARK), data=(addr, PORT)),
    ]
    if family is Family.IP:
        out.append(Set(name="ports", key=(addr, PORT)))
        out.append(Map(name="slots", key=(DataType.INTEGER,), data=(addr, PORT)))
    return out


@pytest.mark.parametrize(("family", "rule", "exprs", "printed"), CASES)
def test_backend_rule_reads_back_and_lists_as_nft(
    make_netns: Callable[[str], str],
    family: Family,
    rule: str,
    exprs: tuple[Expr, ...],
    printed: str,
) -> None:
    ns = make_netns("rt")
    comment = printed.split(' comment "', 1)[1].rstrip('"') if " comment " in printed else ""
    ops = [
        Operation(Verb.ADD, Table(family=family, name=TABLE)),
        *(Operation(Verb.ADD, s) for s in declarations(family)),
        Operation(Verb.ADD, Chain(name="target")),
        Operation(Verb.ADD, Chain(name="c")),
        Operation(Verb.ADD, Rule(chain="c", exprs=exprs, comment=comment)),
    ]
    with NftBackend(Table(family=family, name=TABLE), netns=ns) as backend:
        backend.apply(ops)

        rs = read_ruleset(family, TABLE, netns=ns)

        assert rs is not None
        (got,) = rs.rules["c"]
        assert got == Rule(chain="c", exprs=exprs, comment=comment)
        assert render_rule(got, family=family) == printed
        assert nft_rules(ns, family, "c") == [printed]


def test_owned_persistent_table_and_declarations_round_trip(
    make_netns: Callable[[str], str],
) -> None:
    ns = make_netns("rt")
    table = Table(
        family=Family.IP,
        name="nlp",
        owner=True,
        persist=kernel_supports_persist(),
        comment="nlproxy",
    )
    chains = [
        Chain(name="ep", comment="endpoint"),
        Chain(
            name="pre",
            type=ChainType.NAT,
            hook=Hook.PREROUTING,
            priority=-100,
            policy=Policy.ACCEPT,
        ),
    ]
    vmap = Map(
        name="svc",
        key=(DataType.IPV4_ADDR, PROTO, PORT),
        data=(VERDICT,),
        flags=SetFlag.TIMEOUT,
        timeout=60,
        comment="services",
    )
    el = Element(
        set="svc",
        key=(IPv4Address("10.0.0.1"), 6, 80),
        value=goto("ep"),
        timeout=30,
        comment="default/web",
    )
    with NftBackend(table, netns=ns) as backend:
        backend.apply(
            [Operation(Verb.ADD, table)]
            + [Operation(Verb.ADD, c) for c in chains]
            + [Operation(Verb.ADD, vmap), Operation(Verb.ADD, el)]
        )

        rs = read_ruleset(Family.IP, "nlp", netns=ns)

    assert rs is not None
    assert rs.table == table
    assert list(rs.chains.values()) == chains
    assert rs.sets == {"svc": vmap}
    assert rs.elements["svc"] == {el.key: el}


def test_owned_table_renders_as_nft_lists_it(make_netns: Callable[[str], str]) -> None:
    ns = make_netns("rt")
    table = Table(family=Family.IP, name="nlp", owner=True, comment="nlproxy")
    vmap = Map(
        name="svc",
        key=(DataType.IPV4_ADDR,),
        data=(VERDICT,),
        flags=SetFlag.TIMEOUT,
        timeout=60,
    )
    el = Element(
        set="svc", key=(IPv4Address("10.0.0.1"),), value=jump("ep"), timeout=30, comment="web"
    )
    ops = [
        Operation(Verb.ADD, table),
        Operation(Verb.ADD, Chain(name="ep", comment="endpoint")),
        Operation(Verb.ADD, vmap),
        Operation(Verb.ADD, el),
    ]
    with NftBackend(table, netns=ns) as backend:
        backend.apply(ops)

        rs = read_ruleset(Family.IP, "nlp", netns=ns)
        listed = sh("nft", "-s", "list", "table", "ip", "nlp", ns=ns)

    assert rs is not None
    # nft names the owning process after the table's brace; the renderer has no process to name.
    assert render_ruleset(rs) == re.sub(r" # progname \S+", "", listed)


@pytest.mark.parametrize(
    ("key", "keys"),
    [
        pytest.param(
            (DataType.IPV4_ADDR,),
            [
                (IPv4Network("10.0.0.0/8"),),
                (IPv4Network("192.168.1.1/32"),),
                (IPv4Network("172.16.4.0/22"),),
            ],
            id="ipv4-networks",
        ),
        pytest.param(
            (DataType.IPV6_ADDR,),
            [(IPv6Network("fd00::/64"),), (IPv6Network("fd01::1/128"),)],
            id="ipv6-networks",
        ),
        pytest.param(
            (DataType.IPV4_ADDR, DataType.INET_SERVICE),
            [(IPv4Network("10.0.0.0/8"), 80), (IPv4Network("1.2.3.4/32"), 443)],
            id="concatenated-network-port",
        ),
    ],
)
def test_interval_elements_round_trip(
    make_netns: Callable[[str], str], key: tuple[DataType, ...], keys: list[tuple[Value, ...]]
) -> None:
    ns = make_netns("rt")
    family = Family.IP if key[0] is DataType.IPV4_ADDR else Family.IP6
    table = Table(family=family, name="nlp")
    ranges = Set(name="ranges", key=key, flags=SetFlag.INTERVAL, comment="source ranges")
    elements = [Element(set="ranges", key=k) for k in keys]
    with NftBackend(table, netns=ns) as backend:
        backend.apply(
            [Operation(Verb.ADD, table), Operation(Verb.ADD, ranges)]
            + [Operation(Verb.ADD, e) for e in elements]
        )

    rs = read_ruleset(family, "nlp", netns=ns)

    assert rs is not None
    assert rs.sets == {"ranges": ranges}
    assert rs.elements["ranges"] == {e.key: e for e in elements}
