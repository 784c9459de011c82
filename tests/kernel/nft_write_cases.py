"""Rules nlproxy writes, each with the text nft prints for it: the write-side case table, with the
prelude each family's table starts from."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

from nlproxy.nft.ir import (
    ACCEPT,
    DROP,
    PRIORITY_DSTNAT,
    PRIORITY_SRCNAT,
    RETURN,
    Chain,
    ChainType,
    Cmp,
    Counter,
    CtState,
    CtStatus,
    DataType,
    Dnat,
    DnatMap,
    Expr,
    Family,
    FibType,
    Field,
    Hook,
    InlineVMap,
    Jhash,
    L4Proto,
    Lookup,
    Map,
    MarkSet,
    Masquerade,
    Numgen,
    NumgenKind,
    Op,
    Operation,
    Policy,
    Reject,
    RejectKind,
    Set,
    SetFlag,
    SetUpdate,
    Verb,
    Verdict,
    VerdictKind,
    VMap,
    goto,
    jump,
)
from tests.netns import sh

V4 = IPv4Address
V6 = IPv6Address
TCP_KEY = (Field.IP_DADDR, Field.META_L4PROTO, Field.TH_DPORT)


def nft(ns: str, *args: str) -> str:
    return sh("nft", *args, ns=ns)


def prelude(family: Family) -> tuple[str, list[Operation]]:
    """Chains and sets every case may use: as nft text (for ``ref``) and as IR (for ``t``)."""
    addr = "ipv4_addr" if family is not Family.IP6 else "ipv6_addr"
    v = DataType.IPV4_ADDR if family is not Family.IP6 else DataType.IPV6_ADDR
    text = f"""
        chain c1 {{ }}
        chain c2 {{ }}
        chain pre {{ type nat hook prerouting priority dstnat; policy accept; }}
        chain post {{ type nat hook postrouting priority srcnat; policy accept; }}
        chain in {{ type filter hook input priority filter; policy accept; }}
        set svc2 {{ type {addr} . inet_proto . inet_service; }}
        set nets {{ type {addr}; flags interval; }}
        map svc {{ type {addr} . inet_proto . inet_service : verdict; }}
        set aff {{ type {addr}; flags dynamic,timeout; timeout 3h; }}
    """
    ops = [
        Chain(name="c1"),
        Chain(name="c2"),
        Chain(
            name="pre",
            type=ChainType.NAT,
            hook=Hook.PREROUTING,
            priority=PRIORITY_DSTNAT,
            policy=Policy.ACCEPT,
        ),
        Chain(
            name="post",
            type=ChainType.NAT,
            hook=Hook.POSTROUTING,
            priority=PRIORITY_SRCNAT,
            policy=Policy.ACCEPT,
        ),
        Chain(name="in", type=ChainType.FILTER, hook=Hook.INPUT, priority=0, policy=Policy.ACCEPT),
        Set(name="svc2", key=(v, DataType.INET_PROTO, DataType.INET_SERVICE)),
        Set(name="nets", key=(v,), flags=SetFlag.INTERVAL),
        Map(
            name="svc",
            key=(v, DataType.INET_PROTO, DataType.INET_SERVICE),
            data=(DataType.VERDICT,),
        ),
        Set(name="aff", key=(v,), flags=SetFlag.EVAL | SetFlag.TIMEOUT, timeout=3 * 3600),
    ]
    if family is not Family.IP6:
        text += (
            "map backends { typeof ip daddr . meta l4proto . th dport . numgen random mod 3"
            " : ip daddr . th dport; }"
        )
        key = (DataType.IPV4_ADDR, DataType.INET_PROTO, DataType.INET_SERVICE, DataType.MARK)
        ops.append(Map(name="backends", key=key, data=(DataType.IPV4_ADDR, DataType.INET_SERVICE)))
        text += "\nmap slots { typeof numgen random mod 65536 : ip daddr . th dport; }"
        slots = Map(
            name="slots", key=(DataType.INTEGER,), data=(DataType.IPV4_ADDR, DataType.INET_SERVICE)
        )
        ops.append(slots)
    else:
        text += (
            "map backends { type ipv6_addr . inet_proto . inet_service"
            " : ipv6_addr . inet_service; }"
        )
        key = (DataType.IPV6_ADDR, DataType.INET_PROTO, DataType.INET_SERVICE)
        ops.append(Map(name="backends", key=key, data=(DataType.IPV6_ADDR, DataType.INET_SERVICE)))
    return text, [Operation(Verb.ADD, o) for o in ops]


# (id, family, chain, nft text of the rule, IR expressions)
CASES: list[tuple[str, Family, str, str, tuple[Expr, ...]]] = [
    ("ip-daddr", Family.IP, "c1", "ip daddr 10.0.0.1", (Cmp(Field.IP_DADDR, V4("10.0.0.1")),)),
    ("ip-saddr-ne", Family.IP, "c1", "ip saddr != 10.0.0.1 drop",
     (Cmp(Field.IP_SADDR, V4("10.0.0.1"), Op.NE), DROP)),
    ("prefix-8", Family.IP, "c1", "ip daddr 10.0.0.0/8 accept",
     (Cmp(Field.IP_DADDR, IPv4Network("10.0.0.0/8")), ACCEPT)),
    ("prefix-12", Family.IP, "c1", "ip daddr 10.16.0.0/12 accept",
     (Cmp(Field.IP_DADDR, IPv4Network("10.16.0.0/12")), ACCEPT)),
    ("prefix-16-ne", Family.IP, "c1", "ip saddr != 192.168.0.0/16 accept",
     (Cmp(Field.IP_SADDR, IPv4Network("192.168.0.0/16"), Op.NE), ACCEPT)),
    ("prefix-32", Family.IP, "c1", "ip daddr 10.0.0.7 accept",
     (Cmp(Field.IP_DADDR, IPv4Network("10.0.0.7/32")), ACCEPT)),
    ("th-dport", Family.IP, "c1", "th dport 80 accept", (Cmp(Field.TH_DPORT, 80), ACCEPT)),
    ("th-sport-ne", Family.IP, "c1", "th sport != 53 accept",
     (Cmp(Field.TH_SPORT, 53, Op.NE), ACCEPT)),
    ("th-dport-lt", Family.IP, "c1", "th dport < 1024 accept",
     (Cmp(Field.TH_DPORT, 1024, Op.LT), ACCEPT)),
    ("th-dport-ge", Family.IP, "c1", "th dport >= 30000 accept",
     (Cmp(Field.TH_DPORT, 30000, Op.GE), ACCEPT)),
    ("th-dport-le-gt", Family.IP, "c1", "th dport > 10 th dport <= 20 accept",
     (Cmp(Field.TH_DPORT, 10, Op.GT), Cmp(Field.TH_DPORT, 20, Op.LE), ACCEPT)),
    ("l4proto", Family.IP, "c1", "meta l4proto udp accept",
     (Cmp(Field.META_L4PROTO, L4Proto.UDP), ACCEPT)),
    ("mark", Family.IP, "c1", "meta mark 0x10 accept", (Cmp(Field.META_MARK, 0x10), ACCEPT)),
    ("mark-mask", Family.IP, "c1", "meta mark & 0x4000 == 0 return",
     (Cmp(Field.META_MARK, 0, mask=0x4000), RETURN)),
    ("mark-mask-ne", Family.IP, "c1", "meta mark & 0x4000 != 0 return",
     (Cmp(Field.META_MARK, 0, Op.NE, mask=0x4000), RETURN)),
    ("ct-state", Family.IP, "c1", "ct state new accept",
     (Cmp(Field.CT_STATE, CtState.NEW), ACCEPT)),
    ("ct-state-two", Family.IP, "c1", "ct state established,related accept",
     (Cmp(Field.CT_STATE, CtState.ESTABLISHED | CtState.RELATED), ACCEPT)),
    ("ct-state-none", Family.IP, "c1", "ct state & (invalid) == 0 accept",
     (Cmp(Field.CT_STATE, CtState.INVALID, Op.NE), ACCEPT)),
    ("ct-status", Family.IP, "c1", "ct status dnat accept",
     (Cmp(Field.CT_STATUS, CtStatus.DNAT), ACCEPT)),
    ("fib-daddr", Family.IP, "c1", "fib daddr type local accept",
     (Cmp(Field.FIB_DADDR_TYPE, FibType.LOCAL), ACCEPT)),
    ("fib-saddr", Family.IP, "c1", "fib saddr type != local accept",
     (Cmp(Field.FIB_SADDR_TYPE, FibType.LOCAL, Op.NE), ACCEPT)),
    ("iifname", Family.IP, "c1", 'iifname "cbr0" accept',
     (Cmp(Field.META_IIFNAME, "cbr0"), ACCEPT)),
    ("iifname-prefix", Family.IP, "c1", 'iifname "veth*" accept',
     (Cmp(Field.META_IIFNAME, "veth*"), ACCEPT)),
    ("iifname-prefix-ne", Family.IP, "c1", 'iifname != "veth*" return',
     (Cmp(Field.META_IIFNAME, "veth*", Op.NE), RETURN)),
    ("lookup-concat", Family.IP, "c1", "ip daddr . meta l4proto . th dport @svc2 accept",
     (Lookup(TCP_KEY, "svc2"), ACCEPT)),
    ("lookup-negate", Family.IP, "c1", "ip saddr != @nets drop",
     (Lookup((Field.IP_SADDR,), "nets", negate=True), DROP)),
    ("vmap", Family.IP, "c1", "ip daddr . meta l4proto . th dport vmap @svc",
     (VMap(TCP_KEY, "svc"),)),
    ("inline-vmap", Family.IP, "c1",
     "ip daddr . th dport vmap { 10.0.0.1 . 80 : goto c1, 10.0.0.2 . 81 : drop }",
     (InlineVMap((Field.IP_DADDR, Field.TH_DPORT),
                 (((V4("10.0.0.1"), 80), goto("c1")), ((V4("10.0.0.2"), 81), DROP))),)),
    ("numgen-vmap", Family.IP, "c1", "numgen random mod 2 vmap { 0 : jump c1, 1 : jump c2 }",
     (InlineVMap((Numgen(2),), (((0,), jump("c1")), ((1,), jump("c2")))),)),
    ("numgen-inc-vmap", Family.IP, "c1", "numgen inc mod 2 vmap { 0 : jump c1, 1 : jump c2 }",
     (InlineVMap((Numgen(2, NumgenKind.INC),), (((0,), jump("c1")), ((1,), jump("c2")))),)),
    ("counter", Family.IP, "c1", "counter", (Counter(),)),
    ("mark-or", Family.IP, "c1", "meta mark set meta mark | 0x4000", (MarkSet(0x4000),)),
    ("mark-xor", Family.IP, "c1", "meta mark set meta mark ^ 0x4000", (MarkSet(0x4000, "xor"),)),
    ("mark-set", Family.IP, "c1", "meta mark set 0x10", (MarkSet(0x10, "set"),)),
    ("dnat-addr", Family.IP, "pre", "dnat to 10.0.0.5", (Dnat(V4("10.0.0.5")),)),
    ("dnat-addr-port", Family.IP, "pre", "meta l4proto tcp dnat to 10.0.0.5:8080",
     (Cmp(Field.META_L4PROTO, L4Proto.TCP), Dnat(V4("10.0.0.5"), 8080))),
    ("dnat-map", Family.IP, "pre",
     "dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @backends",
     (DnatMap((*TCP_KEY, Numgen(3)), "backends"),)),
    ("jhash-dnat-map", Family.IP, "pre",
     "meta l4proto tcp dnat ip to jhash ip saddr mod 809 seed 0xdeadbeef map @slots",
     (Cmp(Field.META_L4PROTO, L4Proto.TCP),
      DnatMap((Jhash((Field.IP_SADDR,), 809, 0xDEADBEEF),), "slots"))),
    ("jhash-port-dnat-map", Family.IP, "pre",
     "meta l4proto udp dnat ip to jhash ip saddr . udp sport mod 7 seed 0x1 map @slots",
     (Cmp(Field.META_L4PROTO, L4Proto.UDP),
      DnatMap((Jhash((Field.IP_SADDR, Field.TH_SPORT), 7, 1),), "slots"))),
    ("masquerade", Family.IP, "post", "masquerade", (Masquerade(),)),
    ("masquerade-random", Family.IP, "post", "meta mark & 0x4000 != 0 masquerade fully-random",
     (Cmp(Field.META_MARK, 0, Op.NE, mask=0x4000), Masquerade(fully_random=True))),
    ("reject", Family.IP, "in", "reject", (Reject(),)),
    ("reject-code", Family.IP, "in", "reject with icmp type host-unreachable",
     (Reject(code=1),)),
    ("reject-tcp", Family.IP, "in", "meta l4proto tcp reject with tcp reset",
     (Cmp(Field.META_L4PROTO, L4Proto.TCP), Reject(RejectKind.TCP_RESET))),
    ("update", Family.IP, "c1", "update @aff { ip saddr timeout 3h }",
     (SetUpdate("aff", (Field.IP_SADDR,), 3 * 3600),)),
    ("update-no-timeout", Family.IP, "c1", "update @aff { ip saddr }",
     (SetUpdate("aff", (Field.IP_SADDR,)),)),
    ("accept", Family.IP, "c1", "accept", (ACCEPT,)),
    ("drop", Family.IP, "c1", "drop", (DROP,)),
    ("return", Family.IP, "c1", "return", (RETURN,)),
    ("continue", Family.IP, "c1", "continue", (Verdict(VerdictKind.CONTINUE),)),
    ("jump", Family.IP, "c1", "jump c2", (jump("c2"),)),
    ("goto", Family.IP, "c1", "goto c2", (goto("c2"),)),
    # ip6
    ("ip6-daddr", Family.IP6, "c1", "ip6 daddr 2001:db8::1 accept",
     (Cmp(Field.IP6_DADDR, V6("2001:db8::1")), ACCEPT)),
    ("ip6-prefix", Family.IP6, "c1", "ip6 saddr 2001:db8::/32 accept",
     (Cmp(Field.IP6_SADDR, IPv6Network("2001:db8::/32")), ACCEPT)),
    ("ip6-prefix-odd", Family.IP6, "c1", "ip6 saddr 2001:db8:8000::/33 accept",
     (Cmp(Field.IP6_SADDR, IPv6Network("2001:db8:8000::/33")), ACCEPT)),
    ("ip6-lookup", Family.IP6, "c1", "ip6 daddr . meta l4proto . th dport @svc2 accept",
     (Lookup((Field.IP6_DADDR, Field.META_L4PROTO, Field.TH_DPORT), "svc2"), ACCEPT)),
    ("ip6-dnat", Family.IP6, "pre", "meta l4proto tcp dnat to [2001:db8::5]:80",
     (Cmp(Field.META_L4PROTO, L4Proto.TCP), Dnat(V6("2001:db8::5"), 80))),
    ("ip6-dnat-map", Family.IP6, "pre",
     "dnat ip6 to ip6 daddr . meta l4proto . th dport map @backends",
     (DnatMap((Field.IP6_DADDR, Field.META_L4PROTO, Field.TH_DPORT), "backends"),)),
    ("ip6-reject", Family.IP6, "in", "reject", (Reject(),)),
    # inet: nft adds a ``meta nfproto`` dependency before ip/ip6 header loads
    ("inet-ip", Family.INET, "c1", "ip daddr 10.0.0.1 th dport 80 accept",
     (Cmp(Field.IP_DADDR, V4("10.0.0.1")), Cmp(Field.TH_DPORT, 80), ACCEPT)),
    ("inet-nfproto", Family.INET, "c1", "meta nfproto ipv4 accept",
     (Cmp(Field.META_NFPROTO, 2), ACCEPT)),
    ("inet-reject", Family.INET, "in", "reject", (Reject(),)),
    ("inet-reject-icmpx", Family.INET, "in", "reject with icmpx type admin-prohibited",
     (Reject(RejectKind.ICMPX, 3),)),
    ("inet-lookup", Family.INET, "c1", "ip daddr . meta l4proto . th dport @svc2 accept",
     (Lookup(TCP_KEY, "svc2"), ACCEPT)),
    ("comment", Family.IP, "c1", 'ip daddr 10.0.0.1 counter comment "svc default/web:http"',
     (Cmp(Field.IP_DADDR, V4("10.0.0.1")), Counter())),
]  # fmt: skip
COMMENTS = {"comment": "svc default/web:http"}
