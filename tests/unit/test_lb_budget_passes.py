"""The load-balancing budget's two passes (``sync/balancing.py``): the pass over the changed
keys gives what the pass over every Service gives, whatever the Services do between syncs, and
a Service that leaves the opted-in set and comes back is planned from its new objects."""

from __future__ import annotations

import random
from ipaddress import ip_address

import msgspec
import pytest
import structlog

from nlproxy.cluster.model import ClusterSnapshot, LoadBalancing, Service, ServiceKey
from nlproxy.conntrack.fake import FakeConntrack
from nlproxy.inspect.reachability import without_unreachable
from nlproxy.nft.fake import FakeNftables
from nlproxy.nft.ir import Family
from nlproxy.nft.render import render_ruleset
from nlproxy.proxy import naming as n
from nlproxy.proxy.budget import demand
from nlproxy.sync import balancing
from nlproxy.sync.balancing import BalancingGuard
from nlproxy.sync.kernel import SyncKernel
from nlproxy.sync.syncer import Syncer
from tests import world as tr
from tests.unit.test_lb_budget import CH, RR, _guard, _snap, _svc

KEYED, EVERY = 0, 10**9
"""``balancing.WHOLE`` values that make every pass keyed (0) or whole (when a key changed)."""

Pair = tuple[Service, object]


def _passes(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Records, per :meth:`BalancingGuard.apply`, whether it passed over every Service."""
    seen: list[bool] = []
    real = BalancingGuard._update_demands

    def spy(self: BalancingGuard, snapshot: ClusterSnapshot, keys: set[ServiceKey] | None) -> bool:
        seen.append(keys is None)
        return real(self, snapshot, keys)

    monkeypatch.setattr(BalancingGuard, "_update_demands", spy)
    return seen


def _ch(i: int, count: int) -> Pair:
    return _svc(f"s{i}", 1, count, load_balancing=CH, created=f"2026-01-01T00:00:0{i}Z")


def _eight_built() -> tuple[BalancingGuard, list[Pair]]:
    """Eight consistent-hash Services under a quota of one table, all built."""
    guard = _guard()
    pairs = [_ch(i, 3) for i in range(8)]
    svc, sl = pairs[0]
    guard.quota = demand(svc, [sl], CH)  # type: ignore[list-item]  # one table a sync
    guard.apply(_snap(*pairs), None)
    for _ in range(8):
        guard.apply(_snap(*pairs), set())
    assert guard.deferred == set()
    return guard, pairs


@pytest.mark.parametrize("leaves", ["deleted", "random"])
@pytest.mark.parametrize("whole", [KEYED, EVERY], ids=["keyed", "whole"])
def test_a_service_back_in_the_opted_in_set_and_deferred_starts_on_random_choice(
    leaves: str, whole: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight consistent-hash Services under a quota of one table, all built; s7 is deleted (or
    goes to random choice), then comes back beside s0's growth: s0 (older) is rebuilt, s7 waits
    on random choice from its new objects and is in the changed set, not planned from the
    objects it was last built from."""
    monkeypatch.setattr(balancing, "WHOLE", whole)
    passes = _passes(monkeypatch)
    guard, pairs = _eight_built()
    key = pairs[7][0].key
    if leaves == "deleted":
        guard.apply(_snap(*pairs[:7]), {key})
    else:
        guard.apply(_snap(*pairs[:7], _svc("s7", 1, 3, created="2026-01-01T00:00:07Z")), {key})
    back = [_ch(0, 4), *pairs[1:7], _ch(7, 5)]
    snap, changed = guard.apply(_snap(*back), {back[0][0].key, key})
    assert passes[-1] is (whole == EVERY)
    assert guard.deferred == {key}
    assert snap.services[key] == msgspec.structs.replace(
        back[7][0], load_balancing=LoadBalancing.RANDOM
    )
    assert snap.slices[key] == (back[7][1],)
    assert changed == {back[0][0].key, key}
    # Its turn: its tables, from its new objects.
    snap, changed = guard.apply(_snap(*back), set())
    assert (snap.services[key], snap.slices[key]) == (back[7][0], (back[7][1],))
    assert (changed, guard.deferred) == ({key}, set())


def test_a_service_recreated_with_a_new_cluster_ip_is_reachable_at_it_while_deferred() -> None:
    """Through a Syncer on the fake tables, with the sync's default (the keyed pass for a few
    changed Services), two round-robin Services beside eight on random choice, under a quota
    of one table: s1 deleted, then recreated with another ClusterIP beside s0's growth;
    deferred, it is programmed at once at its new address (random choice), the old one gone."""
    nft = FakeNftables(n.TABLE)
    others = [_svc(f"s{i}", 1, 2) for i in range(2, 10)]
    pairs = [_rr(0, 3), _rr(1, 3), *others]
    svc, sl = pairs[0]
    quota = demand(svc, [sl], RR)  # type: ignore[list-item]
    kernel = SyncKernel(tables=nft.open, readback=nft, flows=FakeConntrack())
    syncer = Syncer(tr.config(), kernel, quota=quota)
    syncer.sync(_snap(*pairs))
    assert not syncer.sync(_snap(*pairs), changed=set()).deferred
    key = pairs[1][0].key
    syncer.sync(_snap(pairs[0], *others), changed={key})
    s1, sl1 = _rr(1, 5)
    s1 = msgspec.structs.replace(s1, cluster_ips=(ip_address("172.30.9.9"),))
    grown = _snap(_rr(0, 4), (s1, sl1), *others)
    result = syncer.sync(grown, changed={pairs[0][0].key, key})
    assert result.deferred == {key}
    rs = nft.dump(Family.IP)
    assert rs is not None
    text = render_ruleset(rs)
    assert "172.30.9.9 " in text
    assert "172.30.0.2 " not in text


@pytest.mark.parametrize("whole", [KEYED, EVERY], ids=["keyed", "whole"])
def test_a_service_deleted_and_created_again_in_one_window_is_not_planned_from_the_deleted_one(
    whole: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight consistent-hash Services under a quota of one table, all built; between two syncs
    s7 is deleted and created again (a new uid, ClusterIP and creation time) beside s0's
    growth: deferred, it waits on random choice from its new objects, never planned from the
    deleted Service (whose ClusterIP may already be another's)."""
    monkeypatch.setattr(balancing, "WHOLE", whole)
    guard, pairs = _eight_built()
    key = pairs[7][0].key
    again, sl7 = _svc("s7", 1, 5, load_balancing=CH, created="2026-02-01T00:00:00Z")
    again = msgspec.structs.replace(again, uid="u-new", cluster_ips=(ip_address("172.30.9.9"),))
    back = [_ch(0, 4), *pairs[1:7], (again, sl7)]
    snap, changed = guard.apply(_snap(*back), {back[0][0].key, key})
    assert guard.deferred == {key}
    assert snap.services[key] == msgspec.structs.replace(again, load_balancing=LoadBalancing.RANDOM)
    assert snap.slices[key] == (sl7,)
    assert key in changed


def test_a_snapshot_filter_making_equal_objects_at_every_sync_leaves_nothing_deferred() -> None:
    """The unreachable endpoints' exclusion hands every sync new slice objects for what did not
    change: six consistent-hash Services with one unreachable endpoint each, under a quota of
    one table, are all built within six syncs and then stay built (they were deferred at every
    sync, and the loop synced again at once, for as long as an endpoint was unreachable)."""
    guard = _guard()
    pairs = [_ch(i, 3) for i in range(6)]
    svc, sl = pairs[0]
    guard.quota = demand(svc, [sl], CH)  # type: ignore[list-item]
    whole = _snap(*pairs)
    bad = frozenset(ip_address(f"10.{100 + i}.0.1") for i in range(6))
    seen = []
    for _ in range(10):
        filtered = without_unreachable(whole, bad)
        assert filtered.slices[pairs[0][0].key][0] is not whole.slices[pairs[0][0].key][0]
        guard.apply(filtered, None)
        seen.append(len(guard.deferred))
    assert seen[:6] == [5, 4, 3, 2, 1, 0]
    assert seen[6:] == [0, 0, 0, 0]


def _rr(i: int, count: int) -> Pair:
    return _svc(f"s{i}", 1, count, load_balancing=RR, created=f"2026-01-01T00:00:0{i}Z")


def _step(rng: random.Random, i: int) -> Pair:
    alg = rng.choice([CH, RR, None])
    kw = {} if alg is None else {"load_balancing": alg}
    ports = rng.choice([1, 1, 2, 5])
    count = rng.randint(1, 6)
    return _svc(f"s{i}", ports, count, created=f"2026-01-01T00:{i:02d}:00Z", **kw)


def _history(
    seed: int, steps: int = 40, size: int = 14
) -> list[tuple[list[Pair], set[ServiceKey]]]:
    """A seeded run of snapshots and their changed keys: Services created, changed (algorithm,
    ports, endpoints), deleted, and brought back as the very objects they were."""
    rng = random.Random(seed)
    cur = {i: _step(rng, i) for i in range(size) if rng.random() < 0.7}
    gone: dict[int, Pair] = {}
    out = [(list(cur.values()), set[ServiceKey]())]
    for _ in range(steps):
        prev = dict(cur)
        for _ in range(rng.randint(1, 6)):
            i, r = rng.randrange(size), rng.random()
            if i in cur and r < 0.3:
                gone[i] = cur.pop(i)
            elif i not in cur and i in gone and r < 0.6:
                cur[i] = gone.pop(i)
            else:
                cur[i] = _step(rng, i)
        changed = {p[0].key for i, p in cur.items() if prev.get(i) is not p}
        changed |= {p[0].key for i, p in prev.items() if i not in cur}
        out.append((list(cur.values()), changed))
    return out


def _run(history: list[tuple[list[Pair], set[ServiceKey]]]) -> list[object]:
    """What each apply of ``history`` hands the planner: per Service, whether it is the input
    object, the random-choice substitute of it or which other object, its algorithm and its
    slices (by identity), and the changed, deferred and fallen-back Services."""
    guard = _guard()
    guard.quota = 2 * 4096
    out: list[object] = []
    for i, (pairs, changed) in enumerate(history):
        snap, handed = guard.apply(_snap(*pairs), None if i == 0 else changed)
        given = {svc.key: svc for svc, _ in pairs}
        seen = {}
        for key, svc in snap.services.items():
            mine = given[key]
            if svc is mine:
                what = "input"
            elif svc == msgspec.structs.replace(mine, load_balancing=LoadBalancing.RANDOM):
                what = "random"
            else:
                what = f"other {id(svc)}"  # an object of ``history``: the same in each run
            seen[key] = (what, svc.load_balancing, tuple(map(id, snap.slices.get(key, ()))))
        out.append((seen, set(handed or ()), set(guard.deferred), dict(guard.fallbacks)))
    return out


@pytest.mark.parametrize("seed", range(30))
def test_the_keyed_pass_gives_what_the_whole_pass_gives(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random histories of opted-in and random-choice Services under a quota that defers: the
    keyed pass and the whole pass hand the planner the same objects, changed set, deferred
    Services and fallbacks at every sync."""
    history = _history(seed)
    passes = _passes(monkeypatch)
    monkeypatch.setattr(balancing, "WHOLE", KEYED)
    keyed = _run(history)
    assert passes == [True] + [False] * (len(history) - 1)
    passes.clear()
    monkeypatch.setattr(balancing, "WHOLE", EVERY)
    whole = _run(history)
    assert passes == [True] + [bool(changed) for _, changed in history[1:]]
    for step, (a, b) in enumerate(zip(keyed, whole, strict=True)):
        assert a == b, f"step {step}"


@pytest.mark.parametrize(
    ("default", "whole"),
    [(LoadBalancing.RANDOM, True), (RR, False)],
    ids=["random-default", "round-robin-default"],
)
def test_the_pass_over_every_service_is_taken_only_when_few_opt_in(
    default: LoadBalancing, whole: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sync naming 12 of 40 Services passes over every Service when the node's default is
    random choice (each Service not opted in costs next to nothing), over the 12 keys when
    every Service opts in (each would have its demand looked up)."""
    passes = _passes(monkeypatch)
    guard = BalancingGuard(default, structlog.get_logger("test"))
    pairs = [_svc(f"s{i}", 1, 2) for i in range(40)]
    guard.apply(_snap(*pairs), None)
    guard.apply(_snap(*pairs), set())
    grown = [_svc(f"s{i}", 1, 3) if i < 12 else pairs[i] for i in range(40)]
    guard.apply(_snap(*grown), {svc.key for svc, _ in grown[:12]})
    assert passes == [True, False, whole]
