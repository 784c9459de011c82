"""kube-proxy's iptables mode read from its compat expressions (``inspect/xt.py``) and merged into
one traceable ruleset (``inspect/iptables.py``), without a kernel: each xt struct as the kernel
holds it, packed here, and traced. The kernel half is ``tests/kernel/test_compare.py``."""

from __future__ import annotations

import struct
from ipaddress import ip_address

import pytest

from nlproxy.cluster.model import Protocol
from nlproxy.inspect.iptables import RawRule, RawTable, merge
from nlproxy.inspect.kubeproxy import KubeProxyRulesetError
from nlproxy.inspect.xt import XtError, match, target, translate
from nlproxy.nft.decode import RawExpr
from nlproxy.nft.ir import (
    Chain,
    ChainType,
    Cmp,
    CtState,
    CtStatus,
    Dnat,
    Family,
    FibType,
    Field,
    Hook,
    MarkSet,
    Masquerade,
    Op,
    Reject,
    RejectKind,
    SetUpdate,
)
from nlproxy.proxy.tracer import trace

NFT_JUMP = (1 << 32) - 3
NF_ACCEPT = 1
LOCAL = ()  # the node's addresses: none needed here


def mt(name: str, info: bytes, rev: int = 0) -> RawExpr:
    return RawExpr("match", {"name": name, "rev": rev, "info": info})


def tg(name: str, info: bytes, rev: int = 0) -> RawExpr:
    return RawExpr("target", {"name": name, "rev": rev, "info": info})


def jump(chain: str) -> RawExpr:
    return RawExpr("immediate", {"dreg": 0, "verdict": NFT_JUMP, "chain": chain})


def daddr(addr: str) -> list[RawExpr]:
    return [
        RawExpr("payload", {"dreg": 1, "base": 1, "offset": 16, "len": 4}),
        RawExpr("cmp", {"sreg": 1, "op": 0, "data": ip_address(addr).packed}),
    ]


def statistic(probability: int, invert: bool = False) -> RawExpr:
    return mt("statistic", struct.pack("=HHI12x8x", 0, int(invert), probability))


def dnat_v4(addr: str, port: int) -> RawExpr:
    a = ip_address(addr).packed + bytes(12)
    return tg("DNAT", struct.pack("=I", 3) + a + a + struct.pack(">HHH", port, port, 0), rev=2)


def conntrack(state: int, invert: bool = False) -> bytes:
    """struct xt_conntrack_mtinfo3 with --ctstate only."""
    return bytes(146) + struct.pack("=HHHH", 1, int(invert), state, 0) + bytes(12)


COUNTER = RawExpr("counter", {})
COMMENT = mt("comment", b"shop/web:http".ljust(256, b"\0"))


def base(name: str, hook: Hook, priority: int, kind: ChainType = ChainType.NAT) -> Chain:
    return Chain(name=name, type=kind, hook=hook, priority=priority)


def kube_proxy_tables(svc_rules: list[RawRule], extra: tuple[RawRule, ...] = ()) -> list[RawTable]:
    """A small kube-proxy: one Service 10.96.0.10:any, two endpoints chosen at random."""
    nat_chains = (
        base("PREROUTING", Hook.PREROUTING, -100),
        base("OUTPUT", Hook.OUTPUT, -100),
        base("POSTROUTING", Hook.POSTROUTING, 100),
        Chain(name="KUBE-SERVICES"),
        Chain(name="KUBE-SVC-X"),
        Chain(name="KUBE-SEP-A"),
        Chain(name="KUBE-SEP-B"),
        Chain(name="KUBE-MARK-MASQ"),
        Chain(name="KUBE-POSTROUTING"),
        Chain(name="DOCKER"),
    )
    rules = (
        RawRule("PREROUTING", 1, (COMMENT, COUNTER, jump("KUBE-SERVICES"))),
        RawRule("OUTPUT", 2, (COMMENT, COUNTER, jump("KUBE-SERVICES"))),
        RawRule("POSTROUTING", 3, (COUNTER, jump("KUBE-POSTROUTING"))),
        RawRule("KUBE-SERVICES", 4, (*daddr("10.96.0.10"), COMMENT, COUNTER, jump("KUBE-SVC-X"))),
        *svc_rules,
        RawRule("KUBE-SEP-A", 7, (COMMENT, COUNTER, dnat_v4("10.244.1.5", 8080))),
        RawRule("KUBE-SEP-B", 8, (COMMENT, COUNTER, dnat_v4("10.244.2.7", 8080))),
        RawRule("KUBE-MARK-MASQ", 9, (COUNTER, tg("MARK", struct.pack("=II", 0x4000, 0x4000), 2))),
        RawRule("KUBE-POSTROUTING", 10, (COUNTER, tg("MASQUERADE", struct.pack("=II", 1, 0x10)))),
        # Docker's: in a built-in chain, with a match compare does not read; left out.
        RawRule("PREROUTING", 11, (mt("limit", b"\0" * 32), COUNTER, jump("DOCKER"))),
        RawRule("DOCKER", 12, (mt("time", b"\0" * 40), COUNTER, dnat_v4("192.0.2.9", 80))),
        *extra,
    )
    return [RawTable(name="nat", chains=nat_chains, rules=rules)]


def endpoints(tables: list[RawTable]) -> tuple[frozenset[str], str]:
    rs = merge(Family.IP, tables)
    assert rs is not None
    r = trace(rs, ip_address("10.244.1.9"), Protocol.TCP, ip_address("10.96.0.10"), 80,
              local_addrs=LOCAL)  # fmt: skip
    return r.endpoints, r.verdict


def test_random_choice_reaches_every_endpoint() -> None:
    svc = [
        RawRule("KUBE-SVC-X", 5, (COMMENT, statistic(0x40000000), COUNTER, jump("KUBE-SEP-A"))),
        RawRule("KUBE-SVC-X", 6, (COMMENT, COUNTER, jump("KUBE-SEP-B"))),
    ]
    assert endpoints(kube_proxy_tables(svc)) == (
        frozenset({"10.244.1.5:8080", "10.244.2.7:8080"}), "ACCEPT",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("probability", "invert", "reached"),
    [
        pytest.param(0, False, {"10.244.2.7:8080"}, id="never"),
        pytest.param(0x80000000, False, {"10.244.1.5:8080"}, id="always"),
        pytest.param(0, True, {"10.244.1.5:8080"}, id="never-inverted"),
    ],
)
def test_certain_probabilities_take_one_path(
    probability: int, invert: bool, reached: set[str]
) -> None:
    svc = [
        RawRule("KUBE-SVC-X", 5, (statistic(probability, invert), COUNTER, jump("KUBE-SEP-A"))),
        RawRule("KUBE-SVC-X", 6, (COUNTER, jump("KUBE-SEP-B"))),
    ]
    assert endpoints(kube_proxy_tables(svc)) == (frozenset(reached), "ACCEPT")


def test_recent_lists_read_empty_so_affinity_rules_pass() -> None:
    name = b"KUBE-SEP-A".ljust(200, b"\0")
    rcheck = struct.pack("=IIBB", 600, 0, 1 | 32, 0) + name + b"\0" + bytes(1) + b"\xff" * 16
    svc = [
        RawRule("KUBE-SVC-X", 5, (COMMENT, mt("recent", rcheck, 1), COUNTER, jump("KUBE-SEP-A"))),
        RawRule("KUBE-SVC-X", 6, (COMMENT, COUNTER, jump("KUBE-SEP-B"))),
    ]
    assert endpoints(kube_proxy_tables(svc)) == (frozenset({"10.244.2.7:8080"}), "ACCEPT")
    setter = struct.pack("=IIBB", 0, 0, 2, 0) + name + b"\0" + bytes(1) + b"\xff" * 16
    m = match("recent", 1, setter, Family.IP)
    assert isinstance(m, tuple)
    assert m[0] == (SetUpdate(set="xt_recent ip KUBE-SEP-A", key=(Field.IP_SADDR,)),)


def test_masquerade_follows_the_mark() -> None:
    svc = [
        RawRule("KUBE-SVC-X", 5, (COUNTER, jump("KUBE-MARK-MASQ"))),
        RawRule("KUBE-SVC-X", 6, (COUNTER, jump("KUBE-SEP-A"))),
    ]
    postrouting = RawRule("KUBE-POSTROUTING", 0, (
        RawExpr("meta", {"key": 3, "dreg": 1}),
        RawExpr("bitwise", {"sreg": 1, "dreg": 1, "mask": struct.pack("=I", 0x4000),
                            "xor": bytes(4), "op": 0}),
        RawExpr("cmp", {"sreg": 1, "op": 1, "data": struct.pack("=I", 0x4000)}),
        COUNTER,
        RawExpr("immediate", {"dreg": 0, "verdict": (1 << 32) - 5}),
    ))  # fmt: skip
    tables = kube_proxy_tables(svc)
    t = tables[0]
    rules = (postrouting, *t.rules)  # the RETURN first, as kube-proxy orders them
    rs = merge(Family.IP, [RawTable(name="nat", chains=t.chains, rules=rules)])
    assert rs is not None
    r = trace(rs, ip_address("10.244.1.9"), Protocol.TCP, ip_address("10.96.0.10"), 80,
              local_addrs=LOCAL)  # fmt: skip
    assert (r.endpoints, r.masquerade) == (frozenset({"10.244.1.5:8080"}), True)


def test_without_kube_services_there_is_no_kube_proxy() -> None:
    t = kube_proxy_tables([])[0]
    chains = tuple(c for c in t.chains if c.name != "KUBE-SERVICES")
    assert merge(Family.IP, [RawTable(name="nat", chains=chains, rules=())]) is None


def test_ipvs_mode_is_named() -> None:
    t = kube_proxy_tables([])[0]
    ipvs = RawTable(name="nat", chains=(*t.chains, Chain(name="KUBE-LOAD-BALANCER")), rules=())
    with pytest.raises(KubeProxyRulesetError, match=r"IPVS mode .*nat/KUBE-LOAD-BALANCER"):
        merge(Family.IP, [ipvs])


def test_a_kube_proxy_rule_it_cannot_read_names_its_chain() -> None:
    bad = RawRule("KUBE-SVC-X", 5, (mt("set", b"\0" * 40, 1), COUNTER, jump("KUBE-SEP-A")))
    with pytest.raises(KubeProxyRulesetError) as err:
        merge(Family.IP, kube_proxy_tables([bad]))
    assert str(err.value) == (
        "chain ip nat KUBE-SVC-X: rule 5: match set rev 1: not a match kube-proxy's iptables "
        "mode uses"
    )


def test_conntrack_states() -> None:
    assert match("conntrack", 3, conntrack(8), Family.IP) == (
        (Cmp(Field.CT_STATE, int(CtState.NEW)),), (),
    )  # fmt: skip
    # ! --ctstate RELATED,ESTABLISHED,DNAT (KUBE-FIREWALL): neither those states nor DNAT'd.
    info = conntrack(2 | 4 | 128, invert=True)
    assert match("conntrack", 3, info, Family.IP) == (
        (
            Cmp(Field.CT_STATE, int(CtState.ESTABLISHED | CtState.RELATED), Op.NE),
            Cmp(Field.CT_STATUS, int(CtStatus.DNAT), Op.NE),
        ),
        (),
    )
    with pytest.raises(XtError, match="both states and SNAT/DNAT"):
        match("conntrack", 3, conntrack(8 | 128), Family.IP)


def test_addrtype_ports_and_marks() -> None:
    assert match("addrtype", 1, struct.pack("=HHI", 0, 4, 0), Family.IP) == (
        (Cmp(Field.FIB_DADDR_TYPE, int(FibType.LOCAL)),), (),
    )  # fmt: skip
    assert match("addrtype", 1, struct.pack("=HHI", 4, 0, 1), Family.IP) == (
        (Cmp(Field.FIB_SADDR_TYPE, int(FibType.LOCAL), Op.NE),), (),
    )  # fmt: skip
    with pytest.raises(XtError, match="interface limits"):
        match("addrtype", 1, struct.pack("=HHI", 0, 4, 4), Family.IP)
    assert match("tcp", 0, struct.pack("=4H4B", 0, 0xFFFF, 0, 0xFFFF, 0, 0, 0, 0), Family.IP) == (
        (), (),
    )  # fmt: skip
    assert match("udp", 0, struct.pack("=4HB", 0, 0xFFFF, 53, 53, 0), Family.IP) == (
        (Cmp(Field.TH_DPORT, 53),), (),
    )  # fmt: skip
    assert match("mark", 1, struct.pack("=IIB", 0x4000, 0x4000, 1), Family.IP) == (
        (Cmp(Field.META_MARK, 0x4000, Op.NE, 0x4000),), (),
    )  # fmt: skip


def test_targets() -> None:
    assert target("MARK", 2, struct.pack("=II", 0x4000, 0), Family.IP) == (MarkSet(0x4000, "xor"),)
    with pytest.raises(XtError, match="--set-xmark"):
        target("MARK", 2, struct.pack("=II", 0x1, 0xF0), Family.IP)
    v6 = ip_address("fd00:10:244:1::17")
    info = struct.pack("=I", 3) + v6.packed * 2 + struct.pack(">HHH", 8080, 8080, 0)
    assert target("DNAT", 2, info, Family.IP6) == (Dnat(v6, 8080),)
    assert target("REJECT", 0, struct.pack("=I", 3), Family.IP) == (Reject(RejectKind.ICMP),)
    assert target("REJECT", 0, struct.pack("=I", 6), Family.IP6) == (Reject(RejectKind.TCP_RESET),)
    assert target("MASQUERADE", 0, struct.pack("=I", 0x10), Family.IP6) == (Masquerade(True),)
    with pytest.raises(XtError, match="not a target"):
        target("TPROXY", 1, b"", Family.IP)


def test_a_random_match_before_a_target_is_refused() -> None:
    with pytest.raises(XtError, match="random match"):
        translate([statistic(0x40000000), COUNTER, dnat_v4("10.0.0.1", 80)], Family.IP, str)
