"""The reconciler's transactions: minimal, correctly ordered, converging.

``nlproxy.nft.fake`` applies each batch checking every reference at each step, the way the
kernel does: a rule or element may only name chains and sets that exist at that point, and a
chain or set may only be deleted once nothing refers to it.
"""

from __future__ import annotations

import copy
from ipaddress import IPv4Address

import pytest

from nlproxy.nft.fake import apply
from nlproxy.nft.ir import (
    Chain,
    ChainType,
    Cmp,
    DataType,
    DnatMap,
    Element,
    Family,
    Field,
    Hook,
    Lookup,
    Map,
    Numgen,
    Operation,
    Rule,
    Ruleset,
    Set,
    SetFlag,
    Table,
    Verb,
    VMap,
    goto,
    jump,
)
from nlproxy.nft.reconcile import diff, programmed_fingerprint, stamp

TABLE = Table(family=Family.IP, name="nlproxy")


def ruleset(endpoints: dict[str, list[str]], *, affinity: bool = False) -> Ruleset:
    """A small ruleset in nlproxy's shape: one vmap, one backends map, dnat-N chains."""
    rs = Ruleset(table=TABLE)
    rs.add_chain(
        Chain(name="nat-prerouting", type=ChainType.NAT, hook=Hook.PREROUTING, priority=-100)
    )
    rs.add_chain(Chain(name="services"))
    rs.add_rule(Rule(chain="nat-prerouting", exprs=(jump("services"),)))
    rs.add_set(
        Map(
            name="service-ips",
            key=(DataType.IPV4_ADDR, DataType.INET_PROTO, DataType.INET_SERVICE),
            data=(DataType.VERDICT,),
        )
    )
    rs.add_set(
        Map(
            name="backends",
            key=(DataType.IPV4_ADDR, DataType.INET_PROTO, DataType.INET_SERVICE, DataType.MARK),
            data=(DataType.IPV4_ADDR, DataType.INET_SERVICE),
        )
    )
    rs.add_rule(
        Rule(
            chain="services",
            exprs=(VMap((Field.IP_DADDR, Field.META_L4PROTO, Field.TH_DPORT), "service-ips"),),
        )
    )
    for vip, eps in sorted(endpoints.items()):
        n = len(eps)
        chain = f"dnat-{n}"
        if chain not in rs.chains:
            rs.add_chain(Chain(name=chain))
            key = (Field.IP_DADDR, Field.META_L4PROTO, Field.TH_DPORT, Numgen(n))
            rs.add_rule(Rule(chain=chain, exprs=(DnatMap(key, "backends"),)))
        rs.add_element(
            Element(
                set="service-ips",
                key=(IPv4Address(vip), 6, 80),
                value=goto(chain),
                comment=f"default/{vip}:http/TCP",
            )
        )
        for i, ep in enumerate(eps):
            rs.add_element(
                Element(
                    set="backends",
                    key=(IPv4Address(vip), 6, 80, i),
                    value=(IPv4Address(ep), 8080),
                )
            )
    if affinity:
        rs.add_set(
            Set(
                name="affinity-x",
                key=(DataType.IPV4_ADDR,),
                flags=SetFlag.TIMEOUT | SetFlag.EVAL,
                timeout=10800,
            )
        )
        rs.add_chain(Chain(name="affinity"))
        rs.add_rule(
            Rule(
                chain="affinity", exprs=(Lookup((Field.IP_SADDR,), "affinity-x"), jump("services"))
            )
        )
    return rs


def programmed(rs: Ruleset) -> Ruleset:
    """What read-back would return after ``rs`` was applied: rules carry their fingerprints."""
    out = copy.deepcopy(rs)
    out.rules = {c: [stamp(r) for r in rules] for c, rules in rs.rules.items()}
    return out


VIPS = {"10.96.0.10": ["10.244.1.2", "10.244.1.3"], "10.96.0.11": ["10.244.2.2"]}


def test_fresh_table_is_built_in_dependency_order() -> None:
    want = ruleset(VIPS)
    ops = diff(want, None)
    assert ops[0] == Operation(Verb.ADD, TABLE)
    got = apply(None, ops)
    assert got.elements == want.elements
    assert got.chains == want.chains
    assert {c: [programmed_fingerprint(r) for r in rs] for c, rs in got.rules.items()} == {
        c: [programmed_fingerprint(stamp(r)) for r in rs] for c, rs in want.rules.items()
    }


def test_unchanged_ruleset_needs_no_operations() -> None:
    want = ruleset(VIPS)
    assert diff(want, programmed(want)) == []


def test_endpoint_removal_touches_only_that_service_elements() -> None:
    before = ruleset(VIPS)
    after = ruleset({**VIPS, "10.96.0.10": ["10.244.1.2"]})
    ops = diff(after, programmed(before))
    kinds = sorted((op.verb.value, type(op.obj).__name__) for op in ops)
    # goto dnat-2 -> dnat-1 (delete+add of one vmap element), one backend element gone, and
    # the now unused dnat-2 chain flushed and deleted. Nothing about 10.96.0.11 is touched.
    assert kinds == [
        ("add", "Element"),
        ("delete", "Chain"),
        ("delete", "Element"),
        ("delete", "Element"),
        ("flush", "Chain"),
    ]
    assert all("10.96.0.11" not in str(getattr(op.obj, "key", "")) for op in ops)
    apply(programmed(before), ops)


def test_deletions_do_not_follow_the_kernels_listing_order() -> None:
    """A hash set lists its elements in another order after a resize: the batch is the same."""
    have = programmed(ruleset(VIPS))
    shuffled = copy.deepcopy(have)
    for name, els in shuffled.elements.items():
        shuffled.elements[name] = dict(reversed(list(els.items())))
    want = ruleset({})
    assert diff(want, have) == diff(want, shuffled)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param({}, VIPS, id="from-empty"),
        pytest.param(VIPS, {}, id="to-empty"),
        pytest.param(VIPS, {"10.96.0.12": ["10.244.3.3"] * 1}, id="replace-all"),
        pytest.param(
            VIPS, {"10.96.0.10": ["10.244.1.9", "10.244.1.3", "10.244.1.4"]}, id="grow-and-change"
        ),
    ],
)
def test_converges_to_what_a_fresh_sync_builds(
    before: dict[str, list[str]], after: dict[str, list[str]]
) -> None:
    cur = apply(None, diff(ruleset(before), None))
    cur = apply(cur, diff(ruleset(after), cur))
    fresh = apply(None, diff(ruleset(after), None))
    assert cur.elements == fresh.elements
    assert cur.chains == fresh.chains
    assert cur.sets == fresh.sets
    assert cur.rules == fresh.rules
    assert diff(ruleset(after), cur) == []


def test_dynamic_set_elements_are_left_to_the_data_path() -> None:
    want = ruleset(VIPS, affinity=True)
    cur = programmed(want)
    cur.add_element(Element(set="affinity-x", key=(IPv4Address("192.168.1.5"),), timeout=10800))
    assert diff(want, cur) == []


def test_changed_set_definition_recreates_set_and_rewrites_its_users() -> None:
    want = ruleset(VIPS, affinity=True)
    cur = programmed(want)
    cur.sets["affinity-x"] = Set(
        name="affinity-x", key=(DataType.IPV4_ADDR,), flags=SetFlag.TIMEOUT | SetFlag.EVAL
    )
    ops = diff(want, cur)
    got = apply(cur, ops)
    assert got.sets["affinity-x"] == want.sets["affinity-x"]
    assert [programmed_fingerprint(r) for r in got.rules["affinity"]] == [
        programmed_fingerprint(stamp(r)) for r in want.rules["affinity"]
    ]


def test_rule_change_rewrites_only_its_chain() -> None:
    want = ruleset(VIPS)
    cur = programmed(want)
    cur.rules["services"] = [
        stamp(Rule(chain="services", exprs=(Cmp(Field.IP_DADDR, IPv4Address("1.2.3.4")),)))
    ]
    ops = diff(want, cur)
    assert [(op.verb, getattr(op.obj, "name", getattr(op.obj, "chain", None))) for op in ops] == [
        (Verb.FLUSH, "services"),
        (Verb.ADD, "services"),
    ]
    apply(cur, ops)


def test_foreign_rule_without_fingerprint_is_replaced() -> None:
    want = ruleset(VIPS)
    cur = programmed(want)
    cur.rules["services"].append(Rule(chain="services", exprs=(), comment="added by hand"))
    ops = diff(want, cur)
    assert ops[0] == Operation(Verb.FLUSH, want.chains["services"])
    apply(cur, ops)
