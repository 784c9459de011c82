"""Rules as nft writes them and as nlproxy's IR holds them: the read-back compatibility table,
with the prelude each family's table starts from and the helpers that load and list them."""

from __future__ import annotations

import subprocess
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import pytest

from nlproxy.nft.ir import (
    ACCEPT,
    DROP,
    RETURN,
    Cmp,
    Counter,
    CtState,
    CtStatus,
    Dnat,
    DnatMap,
    Expr,
    Family,
    FibType,
    Field,
    InlineVMap,
    Jhash,
    L4Proto,
    Lookup,
    MarkSet,
    Masquerade,
    Numgen,
    NumgenKind,
    Op,
    Reject,
    RejectKind,
    SetUpdate,
    Verdict,
    VerdictKind,
    VMap,
    goto,
    jump,
)
from tests.netns import sh

TABLE = "nlpcompat"
CONTINUE = Verdict(VerdictKind.CONTINUE)

PRELUDE = {
    Family.IP: """
  set aff { type ipv4_addr . inet_proto . inet_service; flags dynamic,timeout; timeout 3h; }
  set cidrs { type ipv4_addr; flags interval; }
  set ports { type ipv4_addr . inet_service; }
  map dispatch { type ipv4_addr . inet_proto . inet_service : verdict; }
  map backends { typeof ip daddr . th dport . numgen random mod 3 : ip daddr . th dport; }
  map slots { typeof numgen random mod 65536 : ip daddr . th dport; }
""",
    Family.IP6: """
  set aff { type ipv6_addr . inet_proto . inet_service; flags dynamic,timeout; timeout 3h; }
  set cidrs { type ipv6_addr; flags interval; }
  map dispatch { type ipv6_addr . inet_proto . inet_service : verdict; }
  map backends { typeof ip6 daddr . th dport . numgen random mod 2 : ip6 daddr . th dport; }
""",
    Family.INET: "",
}

V4 = IPv4Address("10.0.0.1")
V6 = IPv6Address("fd00::1")
DPORT, SPORT, L4 = Field.TH_DPORT, Field.TH_SPORT, Field.META_L4PROTO
DADDR, SADDR = Field.IP_DADDR, Field.IP_SADDR
KEY3 = (DADDR, L4, DPORT)
KEY3_6 = (Field.IP6_DADDR, L4, DPORT)
TCP = Cmp(L4, L4Proto.TCP)


def case(
    family: Family, rule: str, exprs: tuple[Expr, ...], printed: str | None = None, *, id: str
) -> object:
    """``rule`` as loaded; ``printed``: what nft lists for it (the same text when None)."""
    return pytest.param(family, rule, exprs, printed or rule, id=f"{family}-{id}")


IP, IP6, INET = Family.IP, Family.IP6, Family.INET

CASES = [
    # Cmp: addresses, prefixes, ports, protocols
    case(IP, "ip daddr 10.0.0.1 accept", (Cmp(DADDR, V4), ACCEPT), id="daddr"),
    case(IP, "ip saddr != 10.0.0.1 drop", (Cmp(SADDR, V4, Op.NE), DROP), id="saddr-ne"),
    case(
        IP,
        "ip saddr 10.0.0.0/8 accept",
        (Cmp(SADDR, IPv4Network("10.0.0.0/8")), ACCEPT),
        id="prefix-bytes",
    ),
    case(
        IP,
        "ip saddr 10.16.0.0/12 accept",
        (Cmp(SADDR, IPv4Network("10.16.0.0/12")), ACCEPT),
        id="prefix-mask",
    ),
    case(
        IP,
        "ip daddr != 10.1.0.0/16 return",
        (Cmp(DADDR, IPv4Network("10.1.0.0/16"), Op.NE), RETURN),
        id="prefix-ne",
    ),
    case(IP, "th dport 53 accept", (Cmp(DPORT, 53), ACCEPT), id="dport"),
    case(IP, "th sport != 1000 drop", (Cmp(SPORT, 1000, Op.NE), DROP), id="sport-ne"),
    case(IP, "th dport >= 30000 drop", (Cmp(DPORT, 30000, Op.GE), DROP), id="dport-ge"),
    case(IP, "meta l4proto tcp drop", (TCP, DROP), id="l4proto-tcp"),
    case(IP, "meta l4proto udp drop", (Cmp(L4, L4Proto.UDP), DROP), id="l4proto-udp"),
    case(IP, "meta l4proto sctp drop", (Cmp(L4, L4Proto.SCTP), DROP), id="l4proto-sctp"),
    case(IP, "meta l4proto icmp accept", (Cmp(L4, L4Proto.ICMP), ACCEPT), id="l4proto-icmp"),
    case(
        IP,
        "meta l4proto tcp th dport 80 accept",
        (TCP, Cmp(DPORT, 80), ACCEPT),
        "tcp dport 80 accept",
        id="l4proto-dependency",
    ),
    case(IP, "meta mark 0x00000010 accept", (Cmp(Field.META_MARK, 0x10), ACCEPT), id="mark"),
    case(
        IP,
        "meta mark & 0x00004000 == 0x00000000 return",
        (Cmp(Field.META_MARK, 0, Op.EQ, 0x4000), RETURN),
        id="mark-mask-eq",
    ),
    case(
        IP,
        "meta mark & 0x00004000 != 0x00000000 accept",
        (Cmp(Field.META_MARK, 0, Op.NE, 0x4000), ACCEPT),
        id="mark-mask-ne",
    ),
    case(IP, "ct state new accept", (Cmp(Field.CT_STATE, CtState.NEW), ACCEPT), id="ct-new"),
    case(
        IP,
        "ct state established,related accept",
        (Cmp(Field.CT_STATE, CtState.ESTABLISHED | CtState.RELATED), ACCEPT),
        id="ct-est-rel",
    ),
    case(
        IP,
        "ct state ! invalid accept",
        (Cmp(Field.CT_STATE, CtState.INVALID, Op.NE), ACCEPT),
        id="ct-not-invalid",
    ),
    case(
        IP,
        "ct state ! established,related drop",
        (Cmp(Field.CT_STATE, CtState.ESTABLISHED | CtState.RELATED, Op.NE), DROP),
        id="ct-none-of",
    ),
    case(
        IP,
        "ct status dnat accept",
        (Cmp(Field.CT_STATUS, CtStatus.DNAT), ACCEPT),
        id="ct-status-dnat",
    ),
    case(
        IP,
        "ct status ! dnat accept",
        (Cmp(Field.CT_STATUS, CtStatus.DNAT, Op.NE), ACCEPT),
        id="ct-status-not-dnat",
    ),
    case(
        IP,
        "fib daddr type local drop",
        (Cmp(Field.FIB_DADDR_TYPE, FibType.LOCAL), DROP),
        id="fib-daddr-local",
    ),
    case(
        IP,
        "fib saddr type != local drop",
        (Cmp(Field.FIB_SADDR_TYPE, FibType.LOCAL, Op.NE), DROP),
        id="fib-saddr-not-local",
    ),
    case(
        IP,
        "fib daddr type unicast accept",
        (Cmp(Field.FIB_DADDR_TYPE, FibType.UNICAST), ACCEPT),
        id="fib-unicast",
    ),
    # iifname: a name is compared padded to IFNAMSIZ, a "prefix*" on its own bytes
    case(IP, 'iifname "cbr0" accept', (Cmp(Field.META_IIFNAME, "cbr0"), ACCEPT), id="iifname"),
    case(
        IP,
        'iifname != "cbr0" drop',
        (Cmp(Field.META_IIFNAME, "cbr0", Op.NE), DROP),
        id="iifname-ne",
    ),
    case(
        IP, 'iifname "veth*" accept', (Cmp(Field.META_IIFNAME, "veth*"), ACCEPT), id="iifname-pfx"
    ),
    case(
        IP6,
        'iifname != "cali*" return',
        (Cmp(Field.META_IIFNAME, "cali*", Op.NE), RETURN),
        id="iifname-pfx-ne",
    ),
    case(
        IP,
        'iifname "abcdefghijklmno" accept',
        (Cmp(Field.META_IIFNAME, "abcdefghijklmno"), ACCEPT),
        id="iifname-longest",
    ),
    # Lookup, VMap, InlineVMap
    case(
        IP,
        "ip daddr . meta l4proto . th dport @aff drop",
        (Lookup(KEY3, "aff"), DROP),
        id="lookup-concat",
    ),
    case(
        IP,
        "ip daddr . meta l4proto . th dport != @aff accept",
        (Lookup(KEY3, "aff", negate=True), ACCEPT),
        id="lookup-negated",
    ),
    case(IP, "ip saddr @cidrs drop", (Lookup((SADDR,), "cidrs"), DROP), id="lookup-interval"),
    case(
        IP,
        "meta l4proto udp ip daddr . th dport @ports accept",
        (Cmp(L4, L4Proto.UDP), Lookup((DADDR, DPORT), "ports"), ACCEPT),
        "ip daddr . udp dport @ports accept",
        id="lookup-l4proto-dependency",
    ),
    case(
        IP,
        "ip daddr . meta l4proto . th dport vmap @dispatch",
        (VMap(KEY3, "dispatch"),),
        id="vmap",
    ),
    case(
        IP,
        "ip daddr vmap { 10.0.0.1 : drop, 10.0.0.2 : goto target, 10.0.0.3 : jump target }",
        (
            InlineVMap(
                (DADDR,),
                (
                    ((V4,), DROP),
                    ((IPv4Address("10.0.0.2"),), goto("target")),
                    ((IPv4Address("10.0.0.3"),), jump("target")),
                ),
            ),
        ),
        id="inline-vmap",
    ),
    case(
        IP,
        "ip daddr . th dport vmap { 10.0.0.1 . 53 : accept, 10.0.0.1 . 80 : return }",
        (InlineVMap((DADDR, DPORT), (((V4, 53), ACCEPT), ((V4, 80), RETURN))),),
        id="inline-vmap-concat",
    ),
    case(
        IP,
        "numgen random mod 2 vmap { 0 : jump target, 1 : goto target }",
        (InlineVMap((Numgen(2),), (((0,), jump("target")), ((1,), goto("target")))),),
        id="numgen-inline-vmap",
    ),
    case(
        IP,
        "numgen inc mod 2 vmap { 0 : jump target, 1 : goto target }",
        (
            InlineVMap(
                (Numgen(2, NumgenKind.INC),), (((0,), jump("target")), ((1,), goto("target")))
            ),
        ),
        id="numgen-inc-inline-vmap",
    ),
    # Statements
    case(IP, "counter accept", (Counter(), ACCEPT), id="counter"),
    case(
        IP,
        "ct state new counter",
        (Cmp(Field.CT_STATE, CtState.NEW), Counter()),
        id="match-counter",
    ),
    case(
        IP,
        "meta mark set meta mark | 0x00004000",
        (MarkSet(0x4000),),
        id="mark-or",
    ),
    case(
        IP,
        "meta mark set meta mark ^ 0x00004000",
        (MarkSet(0x4000, "xor"),),
        id="mark-xor",
    ),
    case(IP, "meta mark set 0x00000010", (MarkSet(0x10, "set"),), id="mark-set"),
    case(IP, "dnat to 10.0.0.1", (Dnat(V4),), id="dnat"),
    case(
        IP,
        "meta l4proto tcp dnat to 10.0.0.1:8080",
        (TCP, Dnat(V4, 8080)),
        id="dnat-port",
    ),
    case(
        IP,
        "meta l4proto tcp dnat ip to ip daddr . th dport . numgen random mod 3 map @backends",
        (TCP, DnatMap((DADDR, DPORT, Numgen(3)), "backends")),
        "dnat ip to ip daddr . tcp dport . numgen random mod 3 map @backends",
        id="dnat-map",
    ),
    case(
        IP,
        "meta l4proto tcp dnat ip to jhash ip saddr mod 809 seed 0x5 map @slots",
        (TCP, DnatMap((Jhash((SADDR,), 809, 5),), "slots")),
        id="jhash-dnat-map",
    ),
    case(
        IP,
        "meta l4proto tcp dnat ip to jhash ip saddr . tcp sport mod 7 seed 0xdeadbeef map @slots",
        (TCP, DnatMap((Jhash((SADDR, SPORT), 7, 0xDEADBEEF),), "slots")),
        "dnat ip to jhash ip saddr . tcp sport mod 7 seed 0xdeadbeef map @slots",
        id="jhash-port-dnat-map",
    ),
    case(
        IP,
        "meta l4proto udp dnat ip to numgen inc mod 3 map @slots",
        (Cmp(L4, L4Proto.UDP), DnatMap((Numgen(3, NumgenKind.INC),), "slots")),
        id="numgen-inc-dnat-map",
    ),
    case(IP, "masquerade", (Masquerade(),), id="masquerade"),
    case(IP, "masquerade fully-random", (Masquerade(fully_random=True),), id="masq-random"),
    case(IP, "reject", (Reject(),), id="reject"),
    case(
        IP,
        "reject with icmp type host-unreachable",
        (Reject(RejectKind.ICMP, 1),),
        "reject with icmp host-unreachable",
        id="reject-host-unreachable",
    ),
    case(
        IP,
        "reject with icmp type admin-prohibited",
        (Reject(RejectKind.ICMP, 13),),
        "reject with icmp admin-prohibited",
        id="reject-admin-prohibited",
    ),
    case(
        IP,
        "reject with tcp reset",
        (TCP, Reject(RejectKind.TCP_RESET)),
        id="reject-tcp-reset",
    ),
    case(
        IP,
        "update @aff { ip saddr . meta l4proto . th dport timeout 3h }",
        (SetUpdate("aff", (SADDR, L4, DPORT), 3 * 3600),),
        id="set-update-timeout",
    ),
    case(
        IP,
        "update @aff { ip saddr . meta l4proto . th dport }",
        (SetUpdate("aff", (SADDR, L4, DPORT)),),
        id="set-update",
    ),
    # Verdicts
    case(IP, "accept", (ACCEPT,), id="accept"),
    case(IP, "drop", (DROP,), id="drop"),
    case(IP, "return", (RETURN,), id="return"),
    case(IP, "continue", (CONTINUE,), id="continue"),
    case(IP, "jump target", (jump("target"),), id="jump"),
    case(IP, "goto target", (goto("target"),), id="goto"),
    case(
        IP,
        'ip daddr 10.0.0.1 th dport 53 goto target comment "svc default/dns:dns/UDP"',
        (Cmp(DADDR, V4), Cmp(DPORT, 53), goto("target")),
        id="comment",
    ),
    # ip6
    case(IP6, "ip6 daddr fd00::1 accept", (Cmp(Field.IP6_DADDR, V6), ACCEPT), id="daddr"),
    case(
        IP6,
        "ip6 saddr fd00::/64 accept",
        (Cmp(Field.IP6_SADDR, IPv6Network("fd00::/64")), ACCEPT),
        id="prefix-bytes",
    ),
    case(
        IP6,
        "ip6 saddr != fd00::/60 drop",
        (Cmp(Field.IP6_SADDR, IPv6Network("fd00::/60"), Op.NE), DROP),
        id="prefix-mask-ne",
    ),
    case(
        IP6,
        "ip6 daddr . meta l4proto . th dport @aff drop",
        (Lookup(KEY3_6, "aff"), DROP),
        id="lookup-concat",
    ),
    case(IP6, "ip6 saddr @cidrs drop", (Lookup((Field.IP6_SADDR,), "cidrs"), DROP), id="lookup"),
    case(
        IP6,
        "ip6 daddr . meta l4proto . th dport vmap @dispatch",
        (VMap(KEY3_6, "dispatch"),),
        id="vmap",
    ),
    case(
        IP6,
        "ip6 daddr vmap { fd00::1 : drop, fd00::2 : goto target }",
        (
            InlineVMap(
                (Field.IP6_DADDR,),
                (((V6,), DROP), ((IPv6Address("fd00::2"),), goto("target"))),
            ),
        ),
        id="inline-vmap",
    ),
    case(IP6, "dnat to fd00::1", (Dnat(V6),), id="dnat"),
    case(
        IP6,
        "meta l4proto tcp dnat to [fd00::1]:8080",
        (TCP, Dnat(V6, 8080)),
        id="dnat-port",
    ),
    case(
        IP6,
        "meta l4proto udp dnat ip6 to ip6 daddr . th dport . numgen random mod 2 map @backends",
        (Cmp(L4, L4Proto.UDP), DnatMap((Field.IP6_DADDR, DPORT, Numgen(2)), "backends")),
        "dnat ip6 to ip6 daddr . udp dport . numgen random mod 2 map @backends",
        id="dnat-map",
    ),
    case(IP6, "masquerade fully-random", (Masquerade(fully_random=True),), id="masq-random"),
    case(IP6, "reject", (Reject(),), id="reject"),
    case(
        IP6,
        "reject with icmpv6 type admin-prohibited",
        (Reject(RejectKind.ICMP, 1),),
        "reject with icmpv6 admin-prohibited",
        id="reject-admin-prohibited",
    ),
    case(
        IP6,
        "reject with tcp reset",
        (TCP, Reject(RejectKind.TCP_RESET)),
        id="reject-tcp-reset",
    ),
    case(
        IP6,
        "update @aff { ip6 saddr . meta l4proto . th dport timeout 10800s }",
        (SetUpdate("aff", (Field.IP6_SADDR, L4, DPORT), 10800),),
        "update @aff { ip6 saddr . meta l4proto . th dport timeout 3h }",
        id="set-update-timeout",
    ),
    case(IP6, "meta mark set meta mark | 0x00004000", (MarkSet(0x4000),), id="mark-or"),
    # inet: meta nfproto and icmpx only exist there
    case(INET, "meta nfproto ipv4 accept", (Cmp(Field.META_NFPROTO, 2), ACCEPT), id="nfproto"),
    case(INET, "meta nfproto ipv6 drop", (Cmp(Field.META_NFPROTO, 10), DROP), id="nfproto6"),
    case(INET, "reject", (Reject(RejectKind.ICMPX),), id="reject-icmpx"),
    case(
        INET,
        "reject with icmpx type admin-prohibited",
        (Reject(RejectKind.ICMPX, 3),),
        "reject with icmpx admin-prohibited",
        id="reject-icmpx-admin",
    ),
]


def load_nft(ns: str, text: str) -> None:
    """``nft -f`` the ruleset ``text`` inside namespace ``ns``."""
    proc = subprocess.run(
        ["ip", "netns", "exec", ns, "nft", "-f", "-"],
        input=text,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"nft -f failed: {proc.stderr}\n{text}")


def nft_rules(ns: str, family: Family, chain: str) -> list[str]:
    """The rule lines ``nft -s list chain`` prints (``-s``: counters without values)."""
    out = sh("nft", "-s", "list", "chain", str(family), TABLE, chain, ns=ns)
    lines = [line.strip() for line in out.splitlines()]
    start = lines.index(f"chain {chain} {{") + 1
    return [line for line in lines[start:] if line and line != "}"]
