"""Read-back of whole tables: chains, sets, maps, elements, flags, timeouts, comments, handles;
missing and foreign tables; rules the IR cannot express."""

from __future__ import annotations

import re
from collections.abc import Callable
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import pytest

from nlproxy.netlink.nlsock import NetfilterSocket
from nlproxy.nft.decode import UndecodedRule
from nlproxy.nft.ir import (
    ACCEPT,
    DROP,
    Chain,
    ChainType,
    Cmp,
    CtState,
    DataType,
    Element,
    Family,
    Field,
    Hook,
    Map,
    Op,
    Policy,
    Rule,
    Set,
    SetFlag,
    Table,
    goto,
    jump,
)
from nlproxy.nft.readback import read_ruleset
from nlproxy.nft.render import render_rule, render_ruleset
from tests.kernel.nft_read_cases import load_nft
from tests.netns import sh

V4, PROTO, PORT, MARK = (
    DataType.IPV4_ADDR,
    DataType.INET_PROTO,
    DataType.INET_SERVICE,
    DataType.MARK,
)
A1, A2 = IPv4Address("10.0.0.1"), IPv4Address("10.0.0.2")

FULL = """
table ip nlp {
  comment "owned by nlproxy"
  set aff { type ipv4_addr . inet_proto . inet_service; flags dynamic,timeout; timeout 3h;
            comment "affinity"; }
  set src { type ipv4_addr; flags interval;
            elements = { 10.0.0.0/8, 192.168.1.1, 172.16.0.0-172.16.0.255 } }
  set lbr { type ipv4_addr . inet_service; flags interval;
            elements = { 10.1.0.0/16 . 80, 10.2.0.1 . 443 } }
  set tmo { type ipv4_addr; flags timeout;
            elements = { 10.0.0.1 timeout 1h comment "one", 10.0.0.2 } }
  set ports { type inet_service; flags interval; elements = { 80, 8000-8002 } }
  map svc { type ipv4_addr . inet_proto . inet_service : verdict; comment "dispatch";
            elements = { 10.0.0.1 . tcp . 80 : goto ep, 10.0.0.1 . udp . 53 : jump ep,
                         10.0.0.2 . tcp . 443 : drop } }
  map be { type ipv4_addr . inet_service . mark : ipv4_addr . inet_service;
           elements = { 10.0.0.1 . 80 . 0x00000000 : 10.244.1.5 . 8080,
                         10.0.0.1 . 80 . 0x00000001 : 10.244.2.7 . 8080 } }
  map dyn { type ipv4_addr : verdict; flags timeout; timeout 10s; }
  set fixed { type inet_proto; flags constant; elements = { tcp, udp }; }
  chain ep { comment "endpoints"; }
  chain pre { type nat hook prerouting priority dstnat; policy accept; }
  chain post { type nat hook postrouting priority srcnat + 10; policy accept; }
  chain fw { type filter hook forward priority -110; policy drop; comment "forward"; }
  chain out { type route hook output priority mangle; }
  chain rules {
    ip daddr 10.0.0.1 accept comment "first"
    ip ttl 64 accept comment "foreign"
    ip daddr { 10.0.0.1, 10.0.0.2 } drop
    log prefix "x" drop
    ip saddr 10.0.0.2 goto ep
  }
}
"""


def test_full_table_reads_back(make_netns: Callable[[str], str]) -> None:
    ns = make_netns("read")
    load_nft(ns, FULL)

    rs = read_ruleset(Family.IP, "nlp", netns=ns)

    assert rs is not None
    assert rs.table == Table(family=Family.IP, name="nlp", comment="owned by nlproxy")
    assert rs.chains == {
        "ep": Chain(name="ep", comment="endpoints"),
        "pre": Chain(
            name="pre",
            type=ChainType.NAT,
            hook=Hook.PREROUTING,
            priority=-100,
            policy=Policy.ACCEPT,
        ),
        "post": Chain(
            name="post",
            type=ChainType.NAT,
            hook=Hook.POSTROUTING,
            priority=110,
            policy=Policy.ACCEPT,
        ),
        "fw": Chain(
            name="fw",
            type=ChainType.FILTER,
            hook=Hook.FORWARD,
            priority=-110,
            policy=Policy.DROP,
            comment="forward",
        ),
        "out": Chain(
            name="out", type=ChainType.ROUTE, hook=Hook.OUTPUT, priority=-150, policy=Policy.ACCEPT
        ),
        "rules": Chain(name="rules"),
    }
    assert rs.sets == {
        "aff": Set(
            name="aff",
            key=(V4, PROTO, PORT),
            flags=SetFlag.EVAL | SetFlag.TIMEOUT,
            timeout=3 * 3600,
            comment="affinity",
        ),
        "src": Set(name="src", key=(V4,), flags=SetFlag.INTERVAL),
        "lbr": Set(name="lbr", key=(V4, PORT), flags=SetFlag.INTERVAL),
        "tmo": Set(name="tmo", key=(V4,), flags=SetFlag.TIMEOUT),
        "ports": Set(name="ports", key=(PORT,), flags=SetFlag.INTERVAL),
        "svc": Map(name="svc", key=(V4, PROTO, PORT), data=(DataType.VERDICT,), comment="dispatch"),
        "be": Map(name="be", key=(V4, PORT, MARK), data=(V4, PORT)),
        "dyn": Map(
            name="dyn", key=(V4,), data=(DataType.VERDICT,), flags=SetFlag.TIMEOUT, timeout=10
        ),
        "fixed": Set(name="fixed", key=(PROTO,), flags=SetFlag.CONSTANT),
    }


def test_elements_read_back(make_netns: Callable[[str], str]) -> None:
    ns = make_netns("read")
    load_nft(ns, FULL)

    rs = read_ruleset(Family.IP, "nlp", netns=ns)

    assert rs is not None
    els = {name: list(e.values()) for name, e in rs.elements.items()}
    assert sorted(els["src"], key=str) == sorted(
        [
            Element(set="src", key=(IPv4Network("10.0.0.0/8"),)),
            Element(set="src", key=(IPv4Network("192.168.1.1/32"),)),
            Element(set="src", key=(IPv4Network("172.16.0.0/24"),)),
        ],
        key=str,
    )
    assert set(rs.elements["lbr"]) == {
        (IPv4Network("10.1.0.0/16"), 80),
        (IPv4Network("10.2.0.1/32"), 443),
    }
    assert set(rs.elements["ports"]) == {(80,), (8000,), (8001,), (8002,)}
    assert rs.elements["tmo"] == {
        (A1,): Element(set="tmo", key=(A1,), timeout=3600, comment="one"),
        (A2,): Element(set="tmo", key=(A2,)),
    }
    assert rs.elements["svc"] == {
        (A1, 6, 80): Element(set="svc", key=(A1, 6, 80), value=goto("ep")),
        (A1, 17, 53): Element(set="svc", key=(A1, 17, 53), value=jump("ep")),
        (A2, 6, 443): Element(set="svc", key=(A2, 6, 443), value=DROP),
    }
    assert rs.elements["be"] == {
        (A1, 80, 0): Element(set="be", key=(A1, 80, 0), value=(IPv4Address("10.244.1.5"), 8080)),
        (A1, 80, 1): Element(set="be", key=(A1, 80, 1), value=(IPv4Address("10.244.2.7"), 8080)),
    }
    assert rs.elements["aff"] == {}
    assert rs.elements["dyn"] == {}
    assert set(rs.elements["fixed"]) == {(6,), (17,)}


def test_rules_keep_order_handles_and_comments(make_netns: Callable[[str], str]) -> None:
    ns = make_netns("read")
    load_nft(ns, FULL)

    rs = read_ruleset(Family.IP, "nlp", netns=ns)

    assert rs is not None
    rules = rs.rules["rules"]
    assert rules[0] == Rule(chain="rules", exprs=(Cmp(Field.IP_DADDR, A1), ACCEPT), comment="first")
    assert rules[4] == Rule(chain="rules", exprs=(Cmp(Field.IP_SADDR, A2), goto("ep")))
    listing = sh("nft", "-a", "list", "chain", "ip", "nlp", "rules", ns=ns)
    handles = re.findall(r"^\t\t.* # handle (\d+)$", listing, re.MULTILINE)
    assert [r.handle for r in rules] == [int(h) for h in handles]


@pytest.mark.parametrize(
    ("index", "comment", "reason"),
    [
        pytest.param(1, "foreign", "payload", id="ip-ttl"),
        pytest.param(2, "", "anonymous", id="anonymous-set"),
        pytest.param(3, "", "log", id="log"),
    ],
)
def test_undecodable_rules_are_marked_not_guessed(
    make_netns: Callable[[str], str], index: int, comment: str, reason: str
) -> None:
    ns = make_netns("read")
    load_nft(ns, FULL)

    rs = read_ruleset(Family.IP, "nlp", netns=ns)

    assert rs is not None
    rule = rs.rules["rules"][index]
    assert isinstance(rule, UndecodedRule)
    assert rule.exprs == ()
    assert rule.comment == comment
    assert rule.handle is not None
    assert reason in rule.reason
    assert rule.raw
    assert rule != Rule(chain="rules", exprs=(), comment=comment)


def test_ct_state_not_equal_reads_as_none_of(make_netns: Callable[[str], str]) -> None:
    """nft's ``ct state != invalid`` compares the whole value; a ct state has exactly one bit set,
    so it means the same as "none of" and reads back as the IR's NE (printed ``! invalid``)."""
    ns = make_netns("read")
    load_nft(ns, "table ip nlp { chain c { ct state != invalid accept; }; }")

    rs = read_ruleset(Family.IP, "nlp", netns=ns)

    assert rs is not None
    assert rs.rules["c"] == [
        Rule(chain="c", exprs=(Cmp(Field.CT_STATE, CtState.INVALID, Op.NE), ACCEPT))
    ]


def test_ct_status_not_equal_is_not_guessed(make_netns: Callable[[str], str]) -> None:
    """``ct status != dnat`` compares the whole status word: not the IR's "none of" test."""
    ns = make_netns("read")
    load_nft(ns, "table ip nlp { chain c { ct status != dnat accept; }; }")

    rs = read_ruleset(Family.IP, "nlp", netns=ns)

    assert rs is not None
    (rule,) = rs.rules["c"]
    assert isinstance(rule, UndecodedRule)


@pytest.mark.parametrize(
    ("chain", "rule", "reason"),
    [
        pytest.param("post", "meta mark set meta mark & 0x0000000f", "mark", id="mark-and"),
        pytest.param(
            "post", "ip saddr & 255.0.255.0 == 10.0.1.0 accept", "prefix", id="non-prefix-mask"
        ),
        pytest.param("pre", "dnat to 10.0.0.1-10.0.0.5", "range", id="dnat-range"),
        pytest.param(
            "pre",
            "meta l4proto tcp dnat ip to ip daddr map { 10.0.0.1 : 10.0.0.2 . 80 }",
            "anonymous",
            id="anonymous-dnat-map",
        ),
        pytest.param("post", "snat to 10.0.0.1", "dnat", id="snat"),
        pytest.param(
            "post", "meta l4proto tcp masquerade to :1000-2000", "masquerade", id="masq-ports"
        ),
        pytest.param(
            "post",
            "numgen random mod 2 offset 5 vmap { 5 : accept, 6 : drop }",
            "numgen",
            id="numgen-offset",
        ),
        pytest.param("post", "meta mark set ct mark", "ct", id="mark-from-ct"),
        pytest.param("post", "update @s { ip saddr counter }", "set s", id="update-with-counter"),
        pytest.param("post", "add @s { ip saddr }", "set s", id="set-add"),
        pytest.param("post", "ct original ip saddr 10.0.0.1 accept", "ct", id="ct-original"),
        pytest.param("post", 'oifname "eth0" accept', "meta", id="oifname"),
        pytest.param("post", "ct mark 0x00000001 accept", "ct", id="ct-mark"),
    ],
)
def test_foreign_patterns_are_undecodable(
    make_netns: Callable[[str], str], chain: str, rule: str, reason: str
) -> None:
    ns = make_netns("read")
    load_nft(
        ns,
        f"""
table ip nlp {{
  set s {{ type ipv4_addr; flags dynamic,timeout; timeout 1m; }}
  chain pre {{ type nat hook prerouting priority dstnat; }}
  chain post {{ type nat hook postrouting priority srcnat; }}
  chain {chain} {{ {rule}; }}
}}
""",
    )

    rs = read_ruleset(Family.IP, "nlp", netns=ns)

    assert rs is not None
    (got,) = rs.rules[chain]
    assert isinstance(got, UndecodedRule), got
    assert reason in got.reason
    assert render_rule(got).startswith("# undecodable")


def test_missing_table_is_none(make_netns: Callable[[str], str]) -> None:
    ns = make_netns("read")
    load_nft(ns, "table ip6 nlp {\n chain c {\n  accept\n }\n}\n")

    assert read_ruleset(Family.IP, "nlp", netns=ns) is None
    assert read_ruleset(Family.IP6, "other", netns=ns) is None


def test_foreign_tables_are_not_read(make_netns: Callable[[str], str]) -> None:
    ns = make_netns("read")
    load_nft(
        ns,
        """
table ip nlp { chain mine { ip daddr 10.0.0.1 accept; }; }
table ip cni {
  set theirs { type ipv4_addr; elements = { 10.9.9.9 }; }
  chain mine { drop; }
  chain natpost { type nat hook postrouting priority srcnat; ip saddr 10.0.0.0/8 masquerade; }
}
table ip6 nlp { set v6 { type ipv6_addr; elements = { fd00::1 }; }; chain mine6 { drop; }; }
""",
    )

    rs = read_ruleset(Family.IP, "nlp", netns=ns)
    rs6 = read_ruleset(Family.IP6, "nlp", netns=ns)

    assert rs is not None
    assert list(rs.chains) == ["mine"]
    assert rs.rules == {"mine": [Rule(chain="mine", exprs=(Cmp(Field.IP_DADDR, A1), ACCEPT))]}
    assert rs.sets == {}
    assert rs6 is not None
    assert list(rs6.chains) == ["mine6"]
    assert list(rs6.elements["v6"]) == [(IPv6Address("fd00::1"),)]


def test_adjacent_and_open_ended_intervals(make_netns: Callable[[str], str]) -> None:
    """Adjacent intervals share a key (one's end, the next one's start); the last interval of
    the address space has no end element at all."""
    ns = make_netns("read")
    load_nft(
        ns,
        """
table ip nlp {
  map iv { type ipv4_addr : verdict; flags interval;
           elements = { 10.0.0.0/8 : accept, 11.0.0.0/8 : drop, 13.0.0.0/8 : accept } }
  set s { type ipv4_addr; flags interval;
          elements = { 0.0.0.0/8, 10.0.0.0/8, 11.0.0.0/8, 255.255.255.0/24 } }
}
""",
    )

    rs = read_ruleset(Family.IP, "nlp", netns=ns)

    assert rs is not None
    assert {k: e.value for k, e in rs.elements["iv"].items()} == {
        (IPv4Network("10.0.0.0/8"),): ACCEPT,
        (IPv4Network("11.0.0.0/8"),): DROP,
        (IPv4Network("13.0.0.0/8"),): ACCEPT,
    }
    assert set(rs.elements["s"]) == {
        (IPv4Network("0.0.0.0/8"),),
        (IPv4Network("10.0.0.0/8"),),
        (IPv4Network("11.0.0.0/8"),),
        (IPv4Network("255.255.255.0/24"),),
    }


def test_ip6_sets_and_interval_networks(make_netns: Callable[[str], str]) -> None:
    ns = make_netns("read")
    load_nft(
        ns,
        """
table ip6 nlp {
  set src { type ipv6_addr; flags interval; elements = { fd00::/64, fd01::1 } }
  map be { type ipv6_addr . inet_service : ipv6_addr . inet_service;
           elements = { fd00::1 . 80 : fd10::5 . 8080 } }
}
""",
    )

    rs = read_ruleset(Family.IP6, "nlp", netns=ns)

    assert rs is not None
    assert set(rs.elements["src"]) == {
        (IPv6Network("fd00::/64"),),
        (IPv6Network("fd01::1/128"),),
    }
    assert rs.elements["be"][(IPv6Address("fd00::1"), 80)].value == (
        IPv6Address("fd10::5"),
        8080,
    )


def test_caller_socket_is_used_and_left_open(make_netns: Callable[[str], str]) -> None:
    ns = make_netns("read")
    load_nft(ns, "table ip nlp { chain c { drop; }; }")

    with NetfilterSocket(ns) as sock:
        first = read_ruleset(Family.IP, "nlp", sock=sock)
        second = read_ruleset(Family.IP, "nlp", sock=sock)

    assert first is not None
    assert second is not None
    assert first.rules == second.rules == {"c": [Rule(chain="c", exprs=(DROP,))]}


RENDERED = """table ip nlp {
	comment "owned by nlproxy"
	set aff {
		type ipv4_addr . inet_proto . inet_service
		flags dynamic,timeout
		timeout 3h
		comment "affinity"
	}

	set src {
		type ipv4_addr
		flags interval
		elements = { 10.0.0.0/8 }
	}

	map svc {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "dispatch"
		elements = { 10.0.0.1 . tcp . 80 : goto ep }
	}

	map dyn {
		type ipv4_addr : verdict
		flags timeout
		timeout 1d2h3m4s
	}

	chain ep {
		comment "endpoints"
	}

	chain pre {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr . meta l4proto . th dport vmap @svc
	}

	chain fw {
		comment "forward"
		type filter hook forward priority -110; policy drop;
		ct state established,related accept
		ip saddr @src counter drop comment "ranges"
	}
}
"""


def test_render_ruleset_matches_nft_list(make_netns: Callable[[str], str]) -> None:
    ns = make_netns("read")
    load_nft(ns, RENDERED)

    rs = read_ruleset(Family.IP, "nlp", netns=ns)

    assert rs is not None
    assert render_ruleset(rs) == sh("nft", "-s", "list", "table", "ip", "nlp", ns=ns)


ELEMENTS = """table ip nlp {
	set a {
		type ipv4_addr
		elements = { 10.0.0.1, 10.0.0.2,
@@10.0.0.3, 10.0.0.4,
@@10.0.0.5 }
	}

	set p {
		type inet_service
		elements = { 1, 2, 3, 4, 5,
@@6, 7 }
	}

	set pr {
		type inet_proto
		elements = { icmp, tcp, udp, sctp }
	}

	set n {
		type ipv4_addr
		flags interval
		elements = { 10.0.0.0/8, 192.168.0.1,
@@192.168.1.0/24 }
	}

	set c2 {
		type ipv4_addr . inet_service
		elements = { 10.0.0.1 . 1,
@@10.0.0.1 . 2 }
	}

	set v6 {
		type ipv6_addr
		elements = { fd00::1,
@@fd00::2 }
	}

	map m {
		type ipv4_addr : ipv4_addr
		elements = { 10.0.0.1 : 1.1.1.1, 10.0.0.2 : 1.1.1.2,
@@10.0.0.3 : 1.1.1.3 }
	}

	map mp {
		type inet_service : verdict
		elements = { 1 : accept, 2 : drop, 3 : jump c }
	}

	chain c {
	}
}
""".replace("@@", "\t\t\t     ")  # nft aligns continued elements with spaces


def test_render_elements_wrap_as_nft_lists_them(make_netns: Callable[[str], str]) -> None:
    ns = make_netns("read")
    load_nft(ns, ELEMENTS)

    rs = read_ruleset(Family.IP, "nlp", netns=ns)

    assert rs is not None
    assert render_ruleset(rs) == sh("nft", "-s", "list", "table", "ip", "nlp", ns=ns)
