"""Consistent hashing: Maglev tables, the kernel's jhash, and what moves when an endpoint goes."""

from __future__ import annotations

import random
from collections import Counter
from ipaddress import IPv4Address, ip_address

import pytest

from nlproxy.cluster.model import ClusterSnapshot, LoadBalancing, ServiceKey
from nlproxy.nft.ir import DnatMap, Family, Field, Jhash, Ruleset, Verb
from nlproxy.nft.jhash import hash_of, jhash, nft_jhash
from nlproxy.nft.reconcile import diff
from nlproxy.nft.render import render_ruleset
from nlproxy.proxy import naming as n
from nlproxy.proxy.hashring import MAX_TABLE, TIERS, default_seed, lookup_table, table_size
from nlproxy.proxy.planner import plan
from nlproxy.proxy.tracer import trace
from nlproxy.sync.syncer import as_programmed
from tests import world as tr
from tests.unit.builders import endpoint, eps_slice, port, service, snapshot

CH = LoadBalancing.CONSISTENT_HASH
_RNG = random.Random(7)
CLIENTS = [IPv4Address(_RNG.getrandbits(32)) for _ in range(4000)]


@pytest.mark.parametrize(
    ("data", "seed", "want"),
    [
        # What the kernel wrote for `ct mark set jhash … mod 1000 seed 0x1234` (checked once by
        # hand in a namespace, and by the datapath tests for every client they send).
        pytest.param(bytes([127, 0, 0, 9]), 0x1234, 3, id="ip-saddr"),
        pytest.param(bytes([127, 0, 0, 10]), 0x1234, 244, id="ip-saddr-2"),
        pytest.param(bytes([127, 0, 0, 5, 0x9C, 0x40, 0, 0]), 0x1234, 68, id="saddr-sport"),
    ],
)
def test_jhash_is_the_kernels(data: bytes, seed: int, want: int) -> None:
    assert nft_jhash(data, 1000, seed) == want


def test_jhash_of_more_than_one_block() -> None:
    """IPv6 address and port: 20 bytes, a full 12-byte round then the tail."""
    assert jhash(bytes(range(20)), 1) != jhash(bytes(range(20))[:12], 1)
    assert 0 <= nft_jhash(bytes(range(20)), 7, 1) < 7


@pytest.mark.parametrize(
    ("count", "size"),
    [(1, 4096), (2, 4096), (64, 4096), (65, 4096), (128, 4096), (129, 16384), (512, 16384),
     (513, 65536), (5000, 65536)],
)  # fmt: skip
def test_table_size_keeps_to_its_tiers(count: int, size: int) -> None:
    assert table_size(count) == size
    assert size <= MAX_TABLE
    assert all(size >= 32 * most for most, size in TIERS), "at least 32 slots each"


def _eps(count: int) -> tuple[tuple[IPv4Address, int], ...]:
    return tuple((IPv4Address(f"10.180.{i // 200}.{i % 200 + 1}"), 8080) for i in range(count))


@pytest.mark.parametrize("count", [2, 3, 10, 65, 100])
def test_every_endpoint_gets_its_share_of_slots(count: int) -> None:
    """Within 1.5 times the mean and above half of it (the ring's spread, see hashring.py)."""
    size = table_size(count)
    shares = Counter(lookup_table(_eps(count), size))
    assert set(shares) == set(range(count))
    assert max(shares.values()) <= 1.5 * size / count
    assert min(shares.values()) >= 0.5 * size / count


def _web(
    count: int, *, uid: str = "uid-1", without: int | None = None, **overrides: object
) -> ClusterSnapshot:
    svc = service(
        "ns", "web", "172.30.0.10", [port("ns", "web", node_port=30080)],
        load_balancing=CH, uid=uid, **overrides,
    )  # fmt: skip
    eps = [endpoint(str(ip)) for i, (ip, _) in enumerate(_eps(count)) if i != without]
    return snapshot([svc], [eps_slice("ns", "web", eps, [("p80", 8080, "TCP")])])


def _ruleset(count: int, **config: object) -> Ruleset:
    return plan(_web(count), tr.config(**config)).rulesets[Family.IP]


def _chooser(rs: Ruleset) -> dict[IPv4Address, IPv4Address]:
    """Each simulated client's endpoint, computed from the planned rule and map alone."""
    ref = port("ns", "web").ref
    (dnat,) = [
        e for r in rs.rules[n.balanced_chain("internal", ref)] for e in r.exprs
        if isinstance(e, DnatMap)
    ]  # fmt: skip
    (sel,) = dnat.key
    assert isinstance(sel, Jhash)
    elements = rs.elements[dnat.map]
    assert len(elements) == sel.modulus
    out = {}
    for c in CLIENTS:
        value = elements[(hash_of(sel, [c]),)].value
        assert isinstance(value, tuple)
        addr = value[0]
        assert isinstance(addr, IPv4Address)
        out[c] = addr
    return out


@pytest.mark.parametrize(
    ("count", "gone"), [(4, 0), (7, 6), (10, 3), (10, 9), (16, 7), (100, 42), (128, 0)]
)
def test_at_most_one_nth_and_two_percent_move_when_an_endpoint_goes(count: int, gone: int) -> None:
    before_rs = _ruleset(count)
    after_rs = plan(_web(count, without=gone), tr.config()).rulesets[Family.IP]
    before, after = _chooser(before_rs), _chooser(after_rs)
    removed = _eps(count)[gone][0]
    moved = sum(1 for c in CLIENTS if before[c] != after[c])
    assert moved / len(CLIENTS) <= 1 / count + 0.02
    # Those of the removed endpoint had to move; of the others, few did.
    assert all(after[c] != removed for c in CLIENTS)
    # The table was changed by element updates only: same chains, rules and map declaration.
    ops = diff(after_rs, as_programmed(before_rs))
    assert ops
    kinds = {type(op.obj).__name__ for op in ops}
    assert kinds, "an endpoint went: elements change"
    assert kinds <= {"Element", "PackedRun"}  # elements only, some held packed  # elements only
    assert {op.verb for op in ops} <= {Verb.ADD, Verb.DELETE, Verb.DESTROY, Verb.REPLACE}


def test_crossing_a_tier_resizes_the_table() -> None:
    """The documented exception: 129 -> 128 endpoints changes M (16384 -> 4096), hence the
    rules; 3 -> 2 (a power of two) does not."""
    after = plan(_web(129, without=1), tr.config()).rulesets[Family.IP]
    ops = diff(after, as_programmed(_ruleset(129)))
    assert "Rule" in {type(op.obj).__name__ for op in ops}
    after = plan(_web(3, without=1), tr.config()).rulesets[Family.IP]
    ops = diff(after, as_programmed(_ruleset(3)))
    kinds = {type(op.obj).__name__ for op in ops}
    assert kinds, "an endpoint went: elements change"
    assert kinds <= {"Element", "PackedRun"}  # elements only, some held packed


def test_every_node_builds_the_same_table() -> None:
    """Another node (its name, addresses and local endpoints differ) plans the same map and
    the same hash: a client reaches the same endpoint through either."""
    ours = _ruleset(10)
    other = plan(_web(10), tr.config(node_name="elsewhere")).rulesets[Family.IP]
    assert _chooser(ours) == _chooser(other)
    ref = port("ns", "web").ref
    name = n.balanced_map(False, ref)
    assert ours.elements[name] == other.elements[name]


def test_seed_from_the_uid_or_the_configuration() -> None:
    def seed(rs: Ruleset) -> int:
        ref = port("ns", "web").ref
        rule = rs.rules[n.balanced_chain("internal", ref)][-1]
        dnat = rule.exprs[-1]
        assert isinstance(dnat, DnatMap)
        assert isinstance(dnat.key[0], Jhash)
        return dnat.key[0].seed

    by_uid = seed(plan(_web(3, uid="abc"), tr.config()).rulesets[Family.IP])
    svc = service("ns", "web", "172.30.0.10", uid="abc")
    assert by_uid == default_seed(svc)
    assert by_uid != seed(plan(_web(3, uid="abd"), tr.config()).rulesets[Family.IP])
    assert seed(_ruleset(3, hash_seed=12345)) == 12345
    assert default_seed(service("ns", "web", "172.30.0.10")) == default_seed(
        service("ns", "web", "172.30.0.11")
    ), "without a UID, the namespace/name decides"
    assert ServiceKey(namespace="ns", name="web")


def test_one_client_one_endpoint_in_the_trace() -> None:
    rs = _ruleset(10)
    got = {
        trace(rs, ip_address(f"10.0.{i}.2"), tr.TCP, ip_address("172.30.0.10"), 80, local_addrs=())
        for i in range(20)
    }
    assert all(len(t.endpoints) == 1 for t in got)
    assert len({t.endpoints for t in got}) > 1, "twenty clients, ten endpoints: more than one"


def test_client_port_in_the_hash_with_the_second_annotation() -> None:
    snap = _web(10, hash_source_port=True)
    rs = plan(snap, tr.config()).rulesets[Family.IP]
    text = render_ruleset(rs)
    assert "dnat ip to jhash ip saddr . tcp sport mod 4096 seed 0x" in text
    src, dst = ip_address("10.0.0.2"), ip_address("172.30.0.10")
    seen = {
        trace(rs, src, tr.TCP, dst, 80, local_addrs=(), sport=p).endpoints
        for p in range(1024, 1064)
    }
    assert len(seen) > 1, "one client, forty source ports: more than one endpoint"
    assert Field.TH_SPORT


_MANY = [IPv4Address(_RNG.getrandbits(32)) for _ in range(20000)]
_POOL = [f"10.{181 + i // 250}.{i % 250}.{_RNG.randrange(1, 250)}" for i in range(65)]
_RNG.shuffle(_POOL)


def _pool_ruleset(count: int) -> Ruleset:
    """The first ``count`` endpoints of a shuffled pool: the one added next is anywhere in the
    address order, not always the last."""
    svc = service("ns", "web", "172.30.0.10", load_balancing=CH, uid="uid-1")
    eps = [endpoint(ip) for ip in _POOL[:count]]
    return plan(
        snapshot([svc], [eps_slice("ns", "web", eps, [("p80", 8080, "TCP")])]), tr.config()
    ).rulesets[Family.IP]


def _choices(rs: Ruleset, slots: dict[int, list[int]]) -> list[object]:
    """Every client of ``_MANY``'s endpoint, from the planned rule and map; client slots are
    hashed once per modulus."""
    ref = port("ns", "web").ref
    (dnat,) = [
        e for r in rs.rules[n.balanced_chain("internal", ref)] for e in r.exprs
        if isinstance(e, DnatMap)
    ]  # fmt: skip
    (sel,) = dnat.key
    assert isinstance(sel, Jhash)
    if sel.modulus not in slots:
        slots[sel.modulus] = [hash_of(sel, [c]) for c in _MANY]
    table = rs.elements[dnat.map]
    return [table[(s,)].value for s in slots[sel.modulus]]


def test_one_endpoint_more_or_less_moves_at_most_two_in_n_plus_one_clients() -> None:
    """For every N up to 64, powers of two included: going from N to N+1 endpoints (or back)
    moves at most 2/(N+1) of 20,000 client addresses."""
    slots: dict[int, list[int]] = {}
    before = _choices(_pool_ruleset(1), slots)
    worst = []
    for count in range(1, 65):
        after = _choices(_pool_ruleset(count + 1), slots)
        moved = sum(1 for a, b in zip(before, after, strict=True) if a != b) / len(_MANY)
        if moved > 2 / (count + 1):
            worst.append((count, round(moved, 3)))
        before = after
    assert worst == [], "N, share of clients moved, past 2/(N+1)"
