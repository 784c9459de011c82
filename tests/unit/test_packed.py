"""Packed element maps change the representation, never the ruleset: over the tracer's worlds,
the plan with its backends maps held as the kernel's bytes renders, diffs and encodes byte for
byte as the same plan with every element an IR ``Element`` (the representation the encoder,
the diff and the read-back used before), and every packed element passes the full validation.
"""

from __future__ import annotations

import struct
from copy import copy
from ipaddress import IPv4Address, IPv6Address

import pytest

from nlproxy.cluster.model import LoadBalancing
from nlproxy.nft.encode import Batch
from nlproxy.nft.ir import (
    DataType,
    Element,
    Family,
    L4Proto,
    Map,
    Operation,
    PackedRun,
    Ruleset,
    Set,
    Verb,
)
from nlproxy.nft.packed import PackedElements
from nlproxy.nft.reconcile import advance, count_ops, diff
from nlproxy.nft.render import render_ruleset
from nlproxy.nft.uapi import NFT_MSG_DELSETELEM, NFT_MSG_NEWSETELEM
from nlproxy.nft.validate import check_packed_elements, validate
from nlproxy.proxy import naming as n
from nlproxy.proxy.fragments import Fill
from nlproxy.proxy.layout import programmed_frontends, targets, udp_only
from nlproxy.proxy.planner import plan
from nlproxy.proxy.skeleton import BACKENDS_MAPS, PACKED
from nlproxy.sync.isolation import owners
from nlproxy.sync.syncer import as_programmed
from tests.world import config, world

NLA_F_NESTED = 0x8000

CONFIGS = [
    pytest.param({}, id="default"),
    pytest.param({"nodeport_addresses": ("192.168.1.0/24",)}, id="nodeport-cidr"),
    pytest.param({"cluster_cidrs": ()}, id="no-cluster-cidrs"),
    pytest.param({"service_cidrs": ()}, id="no-service-cidrs"),
    pytest.param({"load_balancing": LoadBalancing.ROUND_ROBIN}, id="round-robin"),
    pytest.param({"service_counters": True}, id="counters"),
]


def unpacked(rs: Ruleset) -> Ruleset:
    """``rs`` with every packed map as a dict of IR elements."""
    return Ruleset(
        table=rs.table,
        chains=dict(rs.chains),
        rules={c: list(r) for c, r in rs.rules.items()},
        sets=dict(rs.sets),
        elements={s: {el.key: el for el in els.values()} for s, els in rs.elements.items()},
    )


def encoded(rs: Ruleset, ops: list[Operation]) -> list[bytes]:
    """The batch's element messages, each as sent but with attribute padding zeroed (the
    encoder leaves it as the buffer had it; the kernel ignores it)."""
    batch = Batch(rs.table, rs.sets, 1)
    batch.add(ops)
    data = bytes(batch.finish())
    out, off = [], 0
    while off < len(data):
        length, kind = struct.unpack_from("=IH", data, off)
        if kind & 0xFF in (NFT_MSG_NEWSETELEM, NFT_MSG_DELSETELEM):
            # nlmsghdr without its sequence number, nfgenmsg, the attributes
            msg = data[off : off + 8] + data[off + 12 : off + 20]
            out.append(msg + _attrs(data[off + 20 : off + length]))
        off += (length + 3) & ~3
    return out


def _attrs(data: bytes) -> bytes:
    out, off = bytearray(), 0
    while off + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, off)
        body = data[off + 4 : off + length]
        body = _attrs(body) if kind & NLA_F_NESTED else body
        out += struct.pack("=HH", length, kind) + body + bytes(-len(body) % 4)
        off += (length + 3) & ~3
    return bytes(out)


@pytest.mark.parametrize("overrides", CONFIGS)
def test_packed_plan_is_the_element_plan_byte_for_byte(overrides: dict[str, object]) -> None:
    planned = plan(world(), config(**overrides)).rulesets
    packed_seen = 0
    for rs in planned.values():
        names = [name for name in PACKED if name in rs.sets]
        assert all(isinstance(rs.elements[name], PackedElements) for name in names)
        packed_seen += sum(len(rs.elements[name]) for name in BACKENDS_MAPS)
        plain = unpacked(rs)
        assert render_ruleset(rs) == render_ruleset(plain)
        ops, plain_ops = diff(rs, None), diff(plain, None)
        assert any(isinstance(op.obj, PackedRun) for op in ops) == any(
            rs.elements[name] for name in names
        )
        assert not any(isinstance(op.obj, PackedRun) for op in plain_ops)
        validate(rs.table, ops)
        assert encoded(rs, ops) == encoded(plain, plain_ops) != []
        for op in ops:
            if isinstance(op.obj, PackedRun):
                check_packed_elements(rs.table, op.obj, op.verb, rs)
        # What an unchanged restart compares: the cached copy, and a read-back (elements).
        assert diff(rs, as_programmed(rs)) == []
        assert diff(rs, as_programmed(plain)) == []
    # the world's endpoints are in the packed maps (with round robin, in per-service maps)
    assert packed_seen > 10 or "load_balancing" in overrides


def test_packed_diff_and_advance_follow_a_change() -> None:
    """An endpoint changed: one delete and one add run, the same bytes as the element diff's,
    and the programmed copy advanced by them equals the new plan."""
    before = plan(world(), config()).rulesets[Family.IP]
    after = plan(world(), config()).rulesets[Family.IP]
    backends = after.elements[n.BACKENDS]
    key = next(iter(backends))
    backends[key] = Element(set=n.BACKENDS, key=key, value=(IPv4Address("10.9.9.9"), 99))
    programmed = as_programmed(before)
    ops = diff(after, programmed)
    assert [(op.verb, type(op.obj)) for op in ops] == [
        (Verb.DELETE, PackedRun),
        (Verb.ADD, PackedRun),
    ]
    plain = diff(unpacked(after), as_programmed(unpacked(before)))
    assert encoded(after, ops) == encoded(
        after, [op for op in plain if getattr(op.obj, "set", "") == n.BACKENDS]
    )
    advance(programmed, ops)
    assert programmed.elements[n.BACKENDS] == after.elements[n.BACKENDS]
    assert diff(after, programmed) == []


def test_packed_elements_read_as_a_mapping() -> None:
    s = Map(
        name="m",
        key=(DataType.IPV6_ADDR, DataType.INET_PROTO, DataType.INET_SERVICE, DataType.INTEGER),
        data=(DataType.IPV6_ADDR, DataType.INET_SERVICE),
    )
    els = PackedElements(s)
    key = (IPv6Address("fd00::1"), L4Proto.UDP, 53, 2)
    els[key] = Element(set="m", key=key, value=(IPv6Address("fd00:10::5"), 5353))
    assert key in els
    assert list(els) == [key]
    assert els[key].value == (IPv6Address("fd00:10::5"), 5353)
    assert (IPv4Address("10.0.0.1"), 17, 53, 2) not in els  # another family's key: absent
    assert els.get(("x",)) is None
    assert copy(els) == els
    assert copy(els) is not els
    with pytest.raises(ValueError, match="no comment"):
        els[key] = Element(set="m", key=key, value=(IPv6Address("fd00::2"), 1), comment="c")
    del els[key]
    assert not els


def test_operations_count_every_packed_element() -> None:
    """What ``sync.applied`` reports as ``ops``: a packed run counts as its elements."""
    rs = plan(world(), config()).rulesets[Family.IP]
    ops, plain = diff(rs, None), diff(unpacked(rs), None)
    assert len(ops) < len(plain)
    assert count_ops(ops) == count_ops(plain) == len(plain)


def test_advance_unpacks_a_set_given_an_element_bytes_cannot_hold() -> None:
    """A set read back packed (its elements were plain) that is then given an element with a
    comment becomes a plain set rather than refusing it."""
    rs = plan(world(), config()).rulesets[Family.IP]
    programmed = as_programmed(rs)
    key = next(iter(rs.elements[n.CLUSTER_IPS]))
    el = Element(set=n.CLUSTER_IPS, key=key, comment="another writer's")
    advance(programmed, [Operation(Verb.ADD, el)])
    els = programmed.elements[n.CLUSTER_IPS]
    assert not isinstance(els, PackedElements)
    assert els[key] == el
    assert len(els) == len(rs.elements[n.CLUSTER_IPS])


def test_the_service_behind_a_refused_packed_element_is_found() -> None:
    planned = plan(world(), config())
    frags = planned.fragments[Family.IP]
    key, fill = next(
        (k, op) for k, f in frags.items() for op in f.ops if isinstance(op, Fill) and op.keys
    )
    run = PackedRun(set=fill.set, keys=[b"\0" * len(fill.keys[0]), fill.keys[-1]])
    assert owners(planned, Family.IP, run, fill.keys[-1]) == [key]
    assert owners(planned, Family.IP, run) == []


def test_udp_only_selects_packed_elements_by_their_protocol_bytes() -> None:
    """The cold sync's conntrack cleanup reads only UDP frontends: a packed backends map is
    filtered as bytes, to exactly the elements a filter on decoded keys keeps."""
    rs = plan(world(), config()).rulesets[Family.IP]
    udp = udp_only(rs)
    names = [name for name in BACKENDS_MAPS if name in udp.elements]
    assert names
    for name in names:
        got = udp.elements[name]
        want = {k: el for k, el in rs.elements[name].items() if L4Proto.UDP in k}
        assert isinstance(got, PackedElements)
        assert dict(got.items()) == want
    assert any(udp.elements[name] for name in names)


@pytest.mark.parametrize("overrides", CONFIGS)
def test_frontends_read_backwards_from_packed_maps_as_from_elements(
    overrides: dict[str, object],
) -> None:
    """What conntrack cleanup and the inspector read from a ruleset (``layout.py``, the one
    reader backwards) is the same whether its backends maps are packed or IR elements."""
    rulesets = plan(world(), config(**overrides)).rulesets.values()
    packed = programmed_frontends(rulesets)
    plain = programmed_frontends([unpacked(rs) for rs in rulesets])
    assert dict(packed.backends) == dict(plain.backends)
    assert dict(packed.services) == dict(plain.services)
    assert any(packed.backends.values())


def test_a_few_frontends_targets_from_a_packed_map_as_from_elements() -> None:
    rs = plan(world(), config()).rulesets[Family.IP]
    everything = targets(unpacked(rs), n.BACKENDS, 3)
    wanted = set(list(everything)[:3])
    assert targets(rs, n.BACKENDS, 3, wanted) == {fk: everything[fk] for fk in wanted}
    assert targets(rs, n.BACKENDS, 3) == everything


def test_fast_packing_is_the_converters_packing() -> None:
    """The planner's shortcuts (an IPv4 address's int as is, address pairs from ints) give
    the bytes the converters give, and what they cannot take is still converted."""
    data = Map(
        name="m",
        key=(DataType.IPV4_ADDR,),
        data=(DataType.IPV4_ADDR, DataType.INET_SERVICE),
    )
    store = PackedElements(data)
    converted = store._data
    assert converted is not None
    rows: list[tuple[object, object]] = [(IPv4Address("10.0.0.1"), 80), (IPv4Address("1.2.3.4"), 1)]
    want = [converted.pack(r) for r in rows]  # type: ignore[arg-type]
    assert store.pack_rows(rows) == want  # type: ignore[arg-type]
    odd = [(IPv4Address("10.0.0.1"), 80), (167772161, "80")]  # an int address, a str port
    assert store.pack_rows(odd) == [converted.pack(r) for r in odd]  # type: ignore[arg-type]
    # One port for every address: the rows' packing, the odd ones converted as well.
    ips = [IPv4Address("10.0.0.1"), IPv4Address("1.2.3.4"), 167772161]
    assert store.pack_port(ips, 8080) == store.pack_rows([(a, 8080) for a in ips])
    assert store.pack_port(ips[:2], 80) == [converted.pack((a, 80)) for a in ips[:2]]
    with pytest.raises((ValueError, struct.error)):
        store.pack_port(ips[:1], 70000)  # out of an inet_service's range, as pack_rows says
    with pytest.raises((ValueError, struct.error)):
        store.pack_rows([(ips[0], 70000)])
    six = PackedElements(
        Map(name="m6", key=(DataType.IPV6_ADDR,), data=(DataType.IPV6_ADDR, DataType.INET_SERVICE))
    )
    v6 = [IPv6Address("fd00::1"), IPv6Address("fd00::2")]
    assert six.pack_port(v6, 53) == six.pack_rows([(a, 53) for a in v6])
    for dt, ips in (
        (DataType.IPV4_ADDR, [IPv4Address("10.0.0.1"), IPv4Address("255.1.2.3")]),
        (DataType.IPV6_ADDR, [IPv6Address("fd00::1"), IPv6Address("ffff::2")]),
    ):
        pairs = PackedElements(Set(name="s", key=(dt, dt)))  # type: ignore[arg-type]
        got = pairs.pack_pairs([ip._ip for ip in ips])  # type: ignore[attr-defined]
        assert got == pairs.pack_keys([(ip, ip) for ip in ips])


def test_a_key_head_is_the_key_less_its_last_part() -> None:
    """``pack_head`` (the planner's backends key before the index) is ``pack_key``'s start,
    for each backends map of each family, an int address included."""
    for family in (Family.IP, Family.IP6):
        rs = plan(world(), config()).rulesets[family]
        for name in BACKENDS_MAPS:
            store = rs.elements[name]
            assert isinstance(store, PackedElements)
            for key in list(store)[:3]:
                head = key[:-1]
                assert store.pack_head(head) == store.pack_key(key)[:-4], (name, key)
                if isinstance(head[0], IPv4Address):
                    as_int = (int(head[0]), *head[1:])
                    assert store.pack_head(as_int) == store.pack_key(key)[:-4]
