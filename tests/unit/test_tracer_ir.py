"""The tracer on hand-written rulesets: every IR expression, hook order, and its errors."""

from __future__ import annotations

from ipaddress import IPv4Network, ip_address

import pytest

from nlproxy.cluster.model import Protocol
from nlproxy.nft.ir import (
    ACCEPT,
    DROP,
    PRIORITY_DSTNAT,
    PRIORITY_FILTER,
    PRIORITY_SRCNAT,
    RETURN,
    Chain,
    ChainType,
    Cmp,
    Counter,
    DataType,
    Dnat,
    DnatMap,
    Element,
    Expr,
    Family,
    Field,
    Hook,
    InlineVMap,
    L4Proto,
    Lookup,
    Map,
    MarkSet,
    Masquerade,
    Numgen,
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
    Verdict,
    VerdictKind,
    goto,
    jump,
)
from nlproxy.proxy.tracer import TraceError, TraceResult, trace

NODE = ip_address("192.168.0.2")


def _rs(*chains: tuple[Chain, list[tuple[Expr, ...]]]) -> Ruleset:
    rs = Ruleset(table=Table(family=Family.IP, name="t"))
    for chain, rules in chains:
        rs.add_chain(chain)
        for exprs in rules:
            rs.add_rule(Rule(chain=chain.name, exprs=exprs))
    return rs


def _base(name: str, hook: Hook, prio: int, ctype: ChainType = ChainType.FILTER) -> Chain:
    return Chain(name=name, type=ctype, hook=hook, priority=prio, policy=Policy.ACCEPT)


def _run(rs: Ruleset, src: str = "10.0.0.1", dst: str = "10.9.9.9", dport: int = 80) -> TraceResult:
    return trace(
        rs, ip_address(src), Protocol.TCP, ip_address(dst), dport, local_addrs=[NODE], sport=1234
    )


PRE = _base("pre", Hook.PREROUTING, PRIORITY_FILTER)


@pytest.mark.parametrize(
    ("exprs", "verdict"),
    [
        pytest.param((Cmp(Field.TH_DPORT, 80), DROP), "DROP", id="cmp-eq"),
        pytest.param((Cmp(Field.TH_DPORT, 80, Op.NE), DROP), "ACCEPT", id="cmp-ne"),
        pytest.param((Cmp(Field.TH_DPORT, 81, Op.LT), DROP), "DROP", id="cmp-lt"),
        pytest.param((Cmp(Field.TH_DPORT, 80, Op.GT), DROP), "ACCEPT", id="cmp-gt"),
        pytest.param((Cmp(Field.TH_DPORT, 80, Op.LE), DROP), "DROP", id="cmp-le"),
        pytest.param((Cmp(Field.TH_DPORT, 81, Op.GE), DROP), "ACCEPT", id="cmp-ge"),
        pytest.param((Cmp(Field.TH_SPORT, 1234), DROP), "DROP", id="sport"),
        pytest.param((Cmp(Field.META_L4PROTO, L4Proto.TCP), DROP), "DROP", id="l4proto"),
        pytest.param((Cmp(Field.META_NFPROTO, 2), DROP), "DROP", id="nfproto"),
        pytest.param((Cmp(Field.IP_SADDR, IPv4Network("10.0.0.0/8")), DROP), "DROP", id="prefix"),
        pytest.param(
            (Cmp(Field.IP_DADDR, IPv4Network("10.0.0.0/8"), Op.NE), DROP), "ACCEPT", id="not-prefix"
        ),
        pytest.param((Cmp(Field.CT_STATE, 8), Counter(), Reject()), "REJECT", id="ct-new-reject"),
        pytest.param((Cmp(Field.CT_STATUS, 0x20), DROP), "ACCEPT", id="ct-status-no-dnat-yet"),
        pytest.param((Cmp(Field.FIB_DADDR_TYPE, 2), DROP), "ACCEPT", id="fib-daddr-not-local"),
        pytest.param((Cmp(Field.FIB_SADDR_TYPE, 1), DROP), "DROP", id="fib-saddr-unicast"),
        pytest.param((Reject(RejectKind.TCP_RESET),), "REJECT", id="reset"),
        pytest.param((MarkSet(5, "set"), Cmp(Field.META_MARK, 5), DROP), "DROP", id="mark-set"),
        pytest.param(
            (MarkSet(6), MarkSet(2, "xor"), Cmp(Field.META_MARK, 4), DROP), "DROP", id="mark-or-xor"
        ),
        pytest.param(
            (MarkSet(0x4001), Cmp(Field.META_MARK, 0, mask=0x4000), DROP), "ACCEPT", id="mask"
        ),
        pytest.param((InlineVMap((Field.TH_DPORT,), (((80,), DROP),)),), "DROP", id="inline-vmap"),
        pytest.param((InlineVMap((Field.TH_DPORT,), (((81,), DROP),)),), "ACCEPT", id="vmap-miss"),
        pytest.param((SetUpdate("dyn", (Field.IP_SADDR,), 10), ACCEPT), "ACCEPT", id="set-update"),
        pytest.param((Lookup((Field.IP_SADDR,), "dyn"), DROP), "ACCEPT", id="empty-dynamic-set"),
        pytest.param((Verdict(VerdictKind.CONTINUE), DROP), "DROP", id="continue"),
    ],
)
def test_expressions(exprs: tuple[Expr, ...], verdict: str) -> None:
    rs = _rs((PRE, [exprs]))
    rs.add_set(Set(name="dyn", key=(DataType.IPV4_ADDR,), flags=SetFlag.TIMEOUT, timeout=10))
    assert _run(rs).verdict == verdict


@pytest.mark.parametrize(
    ("pattern", "op", "iifname", "src", "verdict"),
    [
        pytest.param("cbr0", Op.EQ, "cbr0", "10.0.0.1", "DROP", id="name"),
        pytest.param("cbr0", Op.EQ, "cbr01", "10.0.0.1", "ACCEPT", id="name-is-not-a-prefix"),
        pytest.param("cbr0", Op.NE, "eth0", "10.0.0.1", "DROP", id="name-ne"),
        pytest.param("veth*", Op.EQ, "veth1a2b", "10.0.0.1", "DROP", id="prefix"),
        pytest.param("veth*", Op.EQ, "eth0", "10.0.0.1", "ACCEPT", id="prefix-miss"),
        pytest.param("veth*", Op.NE, "eth0", "10.0.0.1", "DROP", id="prefix-ne"),
        pytest.param("veth*", Op.EQ, "", "10.0.0.1", "ACCEPT", id="no-interface"),
        # the node's own packets have no input interface, whatever the caller says
        pytest.param("veth*", Op.EQ, "veth1", str(NODE), "ACCEPT", id="local-source"),
    ],
)
def test_iifname(pattern: str, op: Op, iifname: str, src: str, verdict: str) -> None:
    out = _base("out", Hook.OUTPUT, PRIORITY_FILTER)
    rule = (Cmp(Field.META_IIFNAME, pattern, op), DROP)
    rs = _rs((PRE, [rule]), (out, [rule]))
    got = trace(
        rs, ip_address(src), Protocol.TCP, ip_address("10.9.9.9"), 80,
        local_addrs=[NODE], iifname=iifname,
    )  # fmt: skip
    assert got.verdict == verdict


def test_jump_returns_goto_does_not() -> None:
    sub = Chain(name="sub")
    rs = _rs(
        (PRE, [(jump("sub"),), (Cmp(Field.TH_DPORT, 80), goto("sub")), (DROP,)]),
        (sub, [(Cmp(Field.TH_DPORT, 99), DROP), (RETURN,), (DROP,)]),
    )
    # jump: back to the next rule; goto: falling off "sub" ends "pre" (policy accept).
    assert _run(rs).verdict == "ACCEPT"
    assert _run(rs, dport=81).verdict == "DROP"
    assert _run(rs, dport=99).verdict == "DROP"


def test_hook_order_dnat_then_forward_then_masquerade() -> None:
    nat = _base("nat-pre", Hook.PREROUTING, PRIORITY_DSTNAT, ChainType.NAT)
    fwd = _base("fwd", Hook.FORWARD, PRIORITY_FILTER)
    post = _base("post", Hook.POSTROUTING, PRIORITY_SRCNAT, ChainType.NAT)
    early = _base("early", Hook.PREROUTING, PRIORITY_DSTNAT - 10)
    rs = _rs(
        (nat, [(Cmp(Field.IP_DADDR, ip_address("10.9.9.9")), Dnat(ip_address("10.1.1.1"), 8080))]),
        (early, [(Cmp(Field.IP_DADDR, ip_address("10.1.1.1")), DROP)]),  # runs before DNAT
        (fwd, [(Cmp(Field.TH_DPORT, 80), DROP)]),  # runs after DNAT: port is 8080 now
        (post, [(Cmp(Field.CT_STATUS, 0x20), Masquerade(fully_random=True))]),
    )
    assert _run(rs) == TraceResult("ACCEPT", frozenset({"10.1.1.1:8080"}), True)


def test_local_source_takes_output_path_and_local_destination_input() -> None:
    out = _base("out", Hook.OUTPUT, PRIORITY_FILTER)
    inp = _base("in", Hook.INPUT, PRIORITY_FILTER)
    pre = _base("pre", Hook.PREROUTING, PRIORITY_FILTER)
    rs = _rs((out, [(Cmp(Field.TH_DPORT, 1), DROP)]), (inp, [(Cmp(Field.TH_DPORT, 2), DROP)]))
    rs.add_chain(pre)
    rs.add_rule(Rule(chain="pre", exprs=(DROP,)))
    assert _run(rs, src=str(NODE), dport=1).verdict == "DROP"
    assert _run(rs, src=str(NODE), dst=str(NODE), dport=2).verdict == "DROP"
    assert _run(rs, src=str(NODE), dport=3).verdict == "ACCEPT"
    assert _run(rs, dport=3).verdict == "DROP"


def test_numgen_branches_report_the_worst_outcome() -> None:
    nat = _base("nat", Hook.PREROUTING, PRIORITY_DSTNAT, ChainType.NAT)
    rs = _rs(
        (nat, [(InlineVMap((Numgen(2),), (((0,), goto("a")), ((1,), goto("b")))),)]),
        (Chain(name="a"), [(Dnat(ip_address("10.1.1.1")),)]),
        (Chain(name="b"), [(Cmp(Field.TH_DPORT, 80), DROP)]),
    )
    got = _run(rs)
    assert got.verdict == "DROP"  # one branch drops: the worst outcome is reported
    assert got.endpoints == {"10.1.1.1:80"}  # ... and the accepted branches' endpoints


def test_interval_concat_lookup() -> None:
    key = (Field.IP_DADDR, Field.IP_SADDR)
    rs = _rs((PRE, [(Lookup(key, "allow", negate=True), DROP)]))
    rs.add_set(
        Set(
            name="allow",
            key=(DataType.IPV4_ADDR, DataType.IPV4_ADDR),
            flags=SetFlag.INTERVAL | SetFlag.CONCAT,
        )
    )
    k = (ip_address("10.9.9.9"), IPv4Network("10.0.0.0/24"))
    rs.add_element(Element(set="allow", key=k))
    assert _run(rs).verdict == "ACCEPT"
    assert _run(rs, src="10.0.1.1").verdict == "DROP"


def test_missing_chain_and_set_and_loops_are_named() -> None:
    with pytest.raises(TraceError, match="chain nowhere"):
        _run(_rs((PRE, [(jump("nowhere"),)])))
    with pytest.raises(TraceError, match="set absent"):
        _run(_rs((PRE, [(Lookup((Field.IP_SADDR,), "absent"), DROP)])))
    with pytest.raises(TraceError, match="chain loop: jumps nest deeper"):
        _run(_rs((PRE, [(jump("loop"),)]), (Chain(name="loop"), [(jump("loop"),)])))


def test_dnat_map_with_bad_data_is_named() -> None:
    nat = _base("nat", Hook.PREROUTING, PRIORITY_DSTNAT, ChainType.NAT)
    rs = _rs((nat, [(DnatMap((Field.TH_DPORT,), "m"),)]))
    rs.add_set(Map(name="m", key=(DataType.INET_SERVICE,), data=(DataType.IPV4_ADDR,)))
    rs.add_element(Element(set="m", key=(80,), value=(ip_address("10.1.1.1"),)))
    with pytest.raises(TraceError, match="map m"):
        _run(rs)
    assert _run(rs, dport=81).verdict == "ACCEPT"
