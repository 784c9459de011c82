"""The renderer without a kernel: nft's spelling of values, protocol context, sets, elements,
whole tables and the JSON summary. (What nft itself prints is checked in
tests/kernel/test_nft_read_compat.py.)"""

from __future__ import annotations

import json
from ipaddress import IPv4Address, IPv4Network, IPv6Address

import pytest

from nlproxy.nft.decode import UndecodedRule
from nlproxy.nft.ir import (
    ACCEPT,
    DROP,
    Chain,
    ChainType,
    Cmp,
    CtState,
    CtStatus,
    DataType,
    Dnat,
    Element,
    Expr,
    Family,
    Field,
    Hook,
    Lookup,
    Map,
    Op,
    Policy,
    Reject,
    RejectKind,
    Rule,
    Ruleset,
    Set,
    SetFlag,
    SetUpdate,
    Table,
    goto,
    jump,
)
from nlproxy.nft.render import (
    format_time,
    render_element,
    render_rule,
    render_ruleset,
    ruleset_to_json,
)

V4 = IPv4Address("10.0.0.1")
TCP = Cmp(Field.META_L4PROTO, 6)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        pytest.param(0, "0s", id="zero"),
        pytest.param(10, "10s", id="seconds"),
        pytest.param(10800, "3h", id="hours"),
        pytest.param(93784, "1d2h3m4s", id="mixed"),
    ],
)
def test_format_time(seconds: int, text: str) -> None:
    assert format_time(seconds) == text


@pytest.mark.parametrize(
    ("exprs", "family", "text"),
    [
        pytest.param(
            (TCP, Cmp(Field.TH_DPORT, 80), Cmp(Field.TH_SPORT, 1), ACCEPT),
            Family.IP,
            "tcp dport 80 tcp sport 1 accept",
            id="l4proto-hidden-by-th",
        ),
        pytest.param(
            (Cmp(Field.META_L4PROTO, 17), Lookup((Field.IP_DADDR, Field.TH_DPORT), "s"), DROP),
            Family.IP,
            "ip daddr . udp dport @s drop",
            id="l4proto-hidden-by-lookup",
        ),
        pytest.param(
            (TCP, Dnat(V4, 80)),
            Family.IP,
            "meta l4proto tcp dnat to 10.0.0.1:80",
            id="l4proto-kept-without-th",
        ),
        pytest.param(
            (Cmp(Field.META_L4PROTO, 1), Cmp(Field.TH_DPORT, 0), DROP),
            Family.IP,
            "meta l4proto icmp th dport 0 drop",
            id="icmp-has-no-ports",
        ),
        pytest.param(
            (TCP, Reject(RejectKind.TCP_RESET)),
            Family.IP6,
            "reject with tcp reset",
            id="reset-hides-tcp",
        ),
        pytest.param(
            (Reject(RejectKind.ICMP, 1),),
            Family.IP6,
            "reject with icmpv6 admin-prohibited",
            id="icmpv6",
        ),
        pytest.param((Reject(RejectKind.ICMPX),), Family.INET, "reject", id="icmpx-default-inet"),
        pytest.param(
            (Dnat(IPv6Address("fd00::1"), 8080),),
            Family.INET,
            "dnat ip6 to [fd00::1]:8080",
            id="inet-dnat6",
        ),
        pytest.param(
            (Cmp(Field.CT_STATUS, CtStatus.SNAT | CtStatus.DNAT, Op.NE), ACCEPT),
            Family.IP,
            "ct status ! snat,dnat accept",
            id="ct-status-none-of",
        ),
        pytest.param(
            (Cmp(Field.CT_STATE, CtState.NEW | 0x100),),
            Family.IP,
            "ct state new,0x00000100",
            id="unknown-bits-shown",
        ),
        pytest.param(
            (Cmp(Field.IP_SADDR, IPv4Network("10.0.0.0/8"), Op.NE), DROP),
            Family.IP,
            "ip saddr != 10.0.0.0/8 drop",
            id="prefix-ne",
        ),
        pytest.param(
            (SetUpdate("aff", (Field.IP_SADDR,), 93784),),
            Family.IP,
            "update @aff { ip saddr timeout 1d2h3m4s }",
            id="update-timeout",
        ),
    ],
)
def test_render_rule(exprs: tuple[Expr, ...], family: Family, text: str) -> None:
    assert render_rule(Rule(chain="c", exprs=exprs), family=family) == text


def test_undecoded_rule_is_shown_as_such() -> None:
    rule = UndecodedRule(
        chain="c",
        exprs=(),
        comment="x",
        handle=7,
        raw=("[ log ]", "[ immediate reg 0 drop ]"),
        reason="expression log: not part of the IR",
    )

    text = render_rule(rule)

    assert text.startswith("# undecodable (expression log: not part of the IR): [ log ]")
    assert text.endswith(' comment "x"')
    assert rule != Rule(chain="c", exprs=(), comment="x")


def test_render_element() -> None:
    m = Map(
        name="be",
        key=(DataType.IPV4_ADDR, DataType.INET_SERVICE),
        data=(DataType.IPV4_ADDR, DataType.INET_SERVICE),
    )
    el = Element(
        set="be", key=(V4, 80), value=(IPv4Address("10.244.0.5"), 8080), timeout=90, comment="web"
    )

    assert render_element(el, m) == '10.0.0.1 . 80 timeout 1m30s comment "web" : 10.244.0.5 . 8080'


def _ruleset(order: list[int]) -> Ruleset:
    rs = Ruleset(table=Table(family=Family.IP, name="nlp", owner=True))
    rs.add_chain(Chain(name="ep"))
    rs.add_chain(
        Chain(
            name="pre",
            type=ChainType.NAT,
            hook=Hook.PREROUTING,
            priority=-100,
            policy=Policy.ACCEPT,
        )
    )
    rs.add_rule(Rule(chain="pre", exprs=(Cmp(Field.IP_DADDR, V4), jump("ep")), comment="svc"))
    svc = Map(
        name="svc",
        key=(DataType.IPV4_ADDR, DataType.INET_PROTO, DataType.INET_SERVICE),
        data=(DataType.VERDICT,),
    )
    rs.add_set(svc)
    rs.add_set(Set(name="src", key=(DataType.IPV4_ADDR,), flags=SetFlag.INTERVAL))
    for i in order:
        key = (IPv4Address(f"10.0.0.{i}"), 6, 80)
        rs.add_element(Element(set="svc", key=key, value=goto("ep")))
    return rs


def test_render_ruleset_is_deterministic_and_sorted() -> None:
    a = render_ruleset(_ruleset([3, 1, 2]))
    b = render_ruleset(_ruleset([2, 3, 1]))

    assert a == b
    assert a == (
        "table ip nlp {\n"
        "\tflags owner\n"
        "\n"
        "\tmap svc {\n"
        "\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n"
        "\t\telements = { 10.0.0.1 . tcp . 80 : goto ep,\n"
        "\t\t\t     10.0.0.2 . tcp . 80 : goto ep,\n"
        "\t\t\t     10.0.0.3 . tcp . 80 : goto ep }\n"
        "\t}\n"
        "\n"
        "\tset src {\n"
        "\t\ttype ipv4_addr\n"
        "\t\tflags interval\n"
        "\t}\n"
        "\n"
        "\tchain ep {\n"
        "\t}\n"
        "\n"
        "\tchain pre {\n"
        "\t\ttype nat hook prerouting priority dstnat; policy accept;\n"
        '\t\tip daddr 10.0.0.1 jump ep comment "svc"\n'
        "\t}\n"
        "}\n"
    )


def test_ruleset_to_json() -> None:
    doc = ruleset_to_json(_ruleset([2, 1]))

    assert json.loads(json.dumps(doc)) == doc
    assert doc["table"] == {
        "family": "ip",
        "name": "nlp",
        "owner": True,
        "persist": False,
        "comment": "",
    }
    assert [c["name"] for c in doc["chains"]] == ["ep", "pre"]
    assert doc["chains"][1]["hook"] == "prerouting"
    assert doc["chains"][1]["rules"] == [
        {
            "handle": None,
            "rule": 'ip daddr 10.0.0.1 jump ep comment "svc"',
            "comment": "svc",
            "decoded": True,
        }
    ]
    assert doc["sets"][0] == {
        "name": "svc",
        "kind": "map",
        "type": "ipv4_addr . inet_proto . inet_service : verdict",
        "flags": [],
        "timeout": None,
        "counter": False,
        "comment": "",
        "elements": ["10.0.0.1 . tcp . 80 : goto ep", "10.0.0.2 . tcp . 80 : goto ep"],
    }
