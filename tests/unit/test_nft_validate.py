"""Validation of transactions and the encoder's value rules, without a kernel."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import pytest

from nlproxy.errors import InvalidNftObject
from nlproxy.nft.encode import (
    Packer,
    concat_len,
    concat_type,
    element_runs,
    interval_bounds,
    register,
    set_udata,
)
from nlproxy.nft.ir import (
    ACCEPT,
    Chain,
    ChainType,
    Cmp,
    CtState,
    DataType,
    DnatMap,
    Element,
    Family,
    Field,
    Hook,
    InlineVMap,
    L4Proto,
    Lookup,
    Map,
    MarkSet,
    Numgen,
    Op,
    Operation,
    Policy,
    Rule,
    Ruleset,
    Set,
    SetFlag,
    SetUpdate,
    Table,
    Verb,
    VMap,
    jump,
)
from nlproxy.nft.validate import check_value, describe, validate

V4 = IPv4Address
T = Table(family=Family.IP, name="nlp")
KEY3 = (DataType.IPV4_ADDR, DataType.INET_PROTO, DataType.INET_SERVICE)
SVC = Map(name="svc", key=KEY3, data=(DataType.VERDICT,))
BACKENDS = Map(
    name="backends", key=(*KEY3, DataType.MARK), data=(DataType.IPV4_ADDR, DataType.INET_SERVICE)
)


def known() -> Ruleset:
    rs = Ruleset(table=T)
    rs.add_chain(Chain(name="c1"))
    rs.add_set(SVC)
    rs.add_set(BACKENDS)
    return rs


def add(*objs: object) -> list[Operation]:
    return [Operation(Verb.ADD, o) for o in objs]  # type: ignore[arg-type]


# -- what passes -------------------------------------------------------------------------------


def test_a_full_valid_transaction_passes() -> None:
    ops = add(
        T,
        Chain(name="pre", type=ChainType.NAT, hook=Hook.PREROUTING, policy=Policy.ACCEPT),
        Chain(name="lb2"),
        Set(name="aff", key=(DataType.IPV4_ADDR,), flags=SetFlag.TIMEOUT, timeout=60),
        Element(set="svc", key=(V4("10.0.0.1"), L4Proto.TCP, 80), value=jump("lb2")),
        Element(set="backends", key=(V4("10.0.0.1"), 6, 80, 1), value=(V4("10.1.0.1"), 8080)),
        Element(set="aff", key=(V4("10.2.0.1"),), timeout=30),
        Rule(chain="pre", exprs=(VMap((Field.IP_DADDR,), "svc"),)),
        Rule(
            chain="lb2",
            exprs=(
                DnatMap(
                    (Field.IP_DADDR, Field.META_L4PROTO, Field.TH_DPORT, Numgen(2)), "backends"
                ),
            ),
        ),
        Rule(chain="lb2", exprs=(SetUpdate("aff", (Field.IP_SADDR,), 60),)),
        Rule(chain="lb2", exprs=(InlineVMap((Numgen(2),), (((0,), jump("c1")),)),)),
        Rule(chain="c1", exprs=(Cmp(Field.CT_STATE, CtState.NEW), MarkSet(0x4000), ACCEPT)),
    )
    # VMap with a one-part key on a three-part map is wrong; fix that one and the rest passes
    with pytest.raises(InvalidNftObject, match=r"key has 1 parts, svc wants 3"):
        validate(T, ops, known())
    full_key = (Field.IP_DADDR, Field.META_L4PROTO, Field.TH_DPORT)
    ops[7] = Operation(Verb.ADD, Rule(chain="pre", exprs=(VMap(full_key, "svc"),)))
    validate(T, ops, known())


def test_deleting_a_chain_hides_it_from_later_jumps() -> None:
    ops = [
        Operation(Verb.DELETE, Chain(name="c1")),
        Operation(Verb.ADD, Element(set="svc", key=(V4("10.0.0.1"), 6, 80), value=jump("c1"))),
    ]
    with pytest.raises(InvalidNftObject, match="jump to chain c1, which neither"):
        validate(T, ops, known())


def test_delete_element_ignores_the_value() -> None:
    validate(T, [Operation(Verb.DELETE, Element(set="svc", key=(V4("10.0.0.1"), 6, 80)))], known())


# -- what fails, and how it reads -------------------------------------------------------------

BAD = [
    pytest.param(add(Chain(name="a" * 255)), None, id="name-255-ok"),
    pytest.param(add(Chain(name="a" * 256)), "chain name is 256 bytes", id="name-256"),
    pytest.param(add(Chain(name="é" * 128)), "chain name is 256 bytes", id="name-bytes-not-chars"),
    pytest.param(add(Chain(name="")), "empty chain name", id="empty-name"),
    pytest.param(add(Chain(name="x", comment="c" * 253)), None, id="comment-253-ok"),
    pytest.param(add(Chain(name="x", comment="c" * 254)), "comment is 254 bytes", id="comment"),
    pytest.param(add(Chain(name="x", type=ChainType.NAT)), "needs both type and hook", id="base"),
    pytest.param(add(Chain(name="x", policy=Policy.DROP)), "only a base chain", id="policy"),
    pytest.param(add(Set(name="s", key=())), "at least one part", id="empty-key"),
    pytest.param(add(Set(name="s", key=(DataType.IPV6_ADDR,) * 5)), "longer than the kernel's 64",
                 id="key-too-long"),
    pytest.param(add(Map(name="m", key=(DataType.MARK,), data=(DataType.VERDICT, DataType.MARK))),
                 "a verdict alone", id="verdict-in-concat"),
    pytest.param(add(Set(name="s", key=(DataType.MARK,), timeout=0)), "timeout 0", id="timeout"),
    pytest.param(add(Element(set="svc", key=(V4("10.0.0.1"), 256, 80), value=jump("c1"))),
                 r"key\[1\]: 256 is not in 0..255", id="proto-range"),
    pytest.param(add(Element(set="svc", key=(V4("10.0.0.1"), True, 80), value=jump("c1"))),
                 r"key\[1\]: True is not an integer", id="bool-is-not-a-proto"),
    pytest.param(add(Element(set="backends", key=(V4("10.0.0.1"), 6, 80, -1),
                             value=(V4("10.1.0.1"), 1))),
                 r"key\[3\]: -1 is not in 0..4294967295", id="mark-negative"),
    pytest.param(add(Element(set="backends", key=(V4("10.0.0.1"), 6, 80, 1),
                             value=(V4("10.1.0.1"), "80"))),
                 r"value\[1\]: '80' is not an integer", id="port-string"),
    pytest.param(add(Element(set="svc", key=(V4("10.0.0.1"), 6, 80), value=jump("c1"),
                             timeout=5)),
                 "timeout 5: positive, in a set with timeouts", id="timeout-in-plain-set"),
    pytest.param(add(Element(set="svc", key=("10.0.0.1", 6, 80), value=jump("c1"))),
                 r"key\[0\]: '10.0.0.1' is not an IPv4 address", id="address-as-string"),
    pytest.param(add(Rule(chain="c1", exprs=(Cmp(Field.TH_DPORT, IPv4Network("10.0.0.0/8")),))),
                 "is not an integer", id="network-for-port"),
    pytest.param(add(Rule(chain="c1", exprs=(Cmp(Field.IP_DADDR, IPv4Network("10.0.0.0/8"),
                                                 Op.LT),))),
                 "a prefix match takes == or !=", id="prefix-lt"),
    pytest.param(add(Rule(chain="c1", exprs=(Cmp(Field.CT_STATE, 8, Op.GT),))),
                 "ct state is a bitmask", id="bitmask-gt"),
    pytest.param(add(Rule(chain="c1", exprs=(Lookup((Field.CT_STATE,), "svc"),))),
                 "ct state cannot be part of a key", id="key-field"),
    pytest.param(add(Rule(chain="c1", exprs=(Lookup((Field.IP_DADDR, Field.META_L4PROTO,
                                                     Field.TH_DPORT), "svc"),))),
                 "lookup in map svc", id="lookup-in-map"),
    pytest.param(add(Rule(chain="c1", exprs=(DnatMap((Field.IP_DADDR, Field.META_L4PROTO,
                                                      Field.TH_DPORT), "svc"),))),
                 "svc wants 3|needs data addr", id="dnat-map-vmap"),
    pytest.param(add(Rule(chain="c1", exprs=(Cmp(Field.META_IIFNAME, "veth*"),))), None,
                 id="iifname-prefix-ok"),
    pytest.param(add(Rule(chain="c1", exprs=(Cmp(Field.META_IIFNAME, "a" * 15, Op.NE),))), None,
                 id="iifname-15-ok"),
    pytest.param(add(Rule(chain="c1", exprs=(Cmp(Field.META_IIFNAME, "a" * 16),))),
                 "longer than 15 bytes", id="iifname-16"),
    pytest.param(add(Rule(chain="c1", exprs=(Cmp(Field.META_IIFNAME, "*"),))),
                 "names no interface", id="iifname-star-only"),
    pytest.param(add(Rule(chain="c1", exprs=(Cmp(Field.META_IIFNAME, "v*eth"),))),
                 "not an interface name", id="iifname-inner-star"),
    pytest.param(add(Rule(chain="c1", exprs=(Cmp(Field.META_IIFNAME, "a b"),))),
                 "not an interface name", id="iifname-space"),
    pytest.param(add(Rule(chain="c1", exprs=(Cmp(Field.META_IIFNAME, "eth0", Op.LT),))),
                 "iifname takes == or !=", id="iifname-lt"),
    pytest.param(add(Rule(chain="c1", exprs=(Cmp(Field.META_IIFNAME, 3),))),
                 "is not in its type", id="iifname-int"),
    pytest.param(add(Rule(chain="c1", exprs=(Cmp(Field.TH_DPORT, "eth0"),))),
                 "is not in its type", id="name-for-port"),
    pytest.param(add(Rule(chain="c1", exprs=(Lookup((Field.META_IIFNAME,), "svc"),))),
                 "iifname cannot be part of a key", id="iifname-key"),
    pytest.param(add(Rule(chain="c1", exprs=(MarkSet(1, "and"),))), "op 'and'", id="mark-op"),
    pytest.param(add(Table(family=Family.IP6, name="nlp")), "bound to table ip nlp",
                 id="other-table"),
]  # fmt: skip


@pytest.mark.parametrize(("ops", "message"), BAD)
def test_invalid(ops: list[Operation], message: str | None) -> None:
    if message is None:
        validate(T, ops, known())
        return
    with pytest.raises(InvalidNftObject, match=message):
        validate(T, ops, known())


def test_error_names_object_and_field() -> None:
    el = Element(set="backends", key=(V4("10.0.0.1"), 6, 80, 0x4000), value=(V4("10.1.0.1"),))
    with pytest.raises(InvalidNftObject) as info:
        validate(T, add(el), known())
    assert str(info.value) == (
        "element 10.0.0.1 . tcp . 80 . 0x00004000 in map backends: value: "
        "map backends wants 2 data parts"
    )
    assert info.value.field == "value"


def test_describe() -> None:
    sets = {"svc": SVC}
    assert describe(Chain(name="x")) == "chain x"
    assert describe(Element(set="svc", key=(V4("1.2.3.4"), 17, 53)), sets) == (
        "element 1.2.3.4 . udp . 53 in map svc"
    )
    assert describe(Rule(chain="c", exprs=(), comment="svc a/b", handle=7)) == (
        "rule in chain c handle 7 (svc a/b)"
    )


@pytest.mark.parametrize(
    ("dt", "value", "ok"),
    [
        (DataType.IPV4_ADDR, V4("1.2.3.4"), True),
        (DataType.IPV4_ADDR, IPv6Address("::1"), False),
        (DataType.IPV6_ADDR, IPv6Address("::1"), True),
        (DataType.INET_SERVICE, 65535, True),
        (DataType.INET_SERVICE, 65536, False),
        (DataType.INET_PROTO, L4Proto.SCTP, True),
        (DataType.MARK, 0xFFFFFFFF, True),
        (DataType.MARK, 1 << 32, False),
    ],
)
def test_check_value(dt: DataType, value: object, ok: bool) -> None:
    assert (check_value(dt, value) is None) is ok  # type: ignore[arg-type]


# -- the encoder's value rules ----------------------------------------------------------------


def test_concat_type_and_len_as_nft() -> None:
    # values read from sets that nft 1.0.6 created (see test_nft_write)
    assert concat_type(KEY3) == 0x730D
    assert concat_len(KEY3) == 12
    assert concat_type((*KEY3, DataType.MARK)) == 0x1CC353
    assert concat_len((*KEY3, DataType.MARK)) == 16
    assert concat_type((DataType.IPV4_ADDR, DataType.INET_SERVICE)) == 0x1CD
    assert concat_len((DataType.IPV6_ADDR, DataType.INET_SERVICE)) == 20
    assert concat_len((DataType.INET_SERVICE,)) == 2


def test_set_udata_as_nft() -> None:
    assert set_udata(SVC).hex() == "000400000000010400000000030800040d0000000100060400000000"
    assert set_udata(Set(name="s", key=(DataType.INET_SERVICE,), comment="x")).hex() == (
        "00040200000007027800"
    )
    m = Map(name="m", key=(DataType.INET_SERVICE,), data=(DataType.MARK,))
    assert set_udata(m).hex() == "000402000000010401000000060400000000"


def test_packer() -> None:
    p = Packer((*KEY3, DataType.MARK))
    packed = p.pack((V4("10.0.0.1"), 6, 80, 1))
    assert packed.hex() == "0a0000010600000000500000" + (1).to_bytes(4, "little").hex()
    assert bytes(p.pack_many([(V4("10.0.0.1"), 6, 80, 1)] * 2)) == packed * 2
    assert Packer((DataType.INET_SERVICE,)).pack((80,)) == b"\x00\x50"
    assert Packer((DataType.IPV6_ADDR,)).pack((IPv6Network("2001:db8::/32"),))[:4].hex() == (
        "20010db8"
    )


def test_interval_bounds() -> None:
    assert interval_bounds(DataType.IPV4_ADDR, IPv4Network("10.0.0.0/8")) == (
        V4("10.0.0.0"),
        V4("11.0.0.0"),
    )
    assert interval_bounds(DataType.IPV4_ADDR, V4("1.2.3.4")) == (V4("1.2.3.4"), V4("1.2.3.5"))
    assert interval_bounds(DataType.IPV4_ADDR, IPv4Network("255.0.0.0/8"))[1] is None
    assert interval_bounds(DataType.INET_SERVICE, 65535) == (65535, None)


def test_registers_as_nft_numbers_them() -> None:
    assert [register(s) for s in range(6)] == [1, 9, 10, 11, 2, 13]


def test_element_runs_group_per_set_and_keep_each_sets_order() -> None:
    def op(verb: Verb, name: str, port: int) -> Operation:
        return Operation(verb, Element(set=name, key=(port,)))

    ops = [
        op(Verb.ADD, "a", 1),
        op(Verb.ADD, "b", 1),
        op(Verb.ADD, "a", 2),
        op(Verb.DELETE, "a", 1),
        op(Verb.ADD, "b", 2),
        op(Verb.ADD, "a", 1),
    ]
    assert element_runs(ops, 0, len(ops)) == [
        (Verb.ADD, [0, 2]),
        (Verb.ADD, [1, 4]),
        (Verb.DELETE, [3]),
        (Verb.ADD, [5]),
    ]
