"""The element budget of round-robin and consistent hashing, and unknown annotation values:
past the budget a Service is planned with random choice, warned once and counted."""

from __future__ import annotations

import msgspec
import pytest
import structlog
import structlog.testing

from nlproxy.cluster.model import ClusterSnapshot, LoadBalancing, Service, ServiceKey
from nlproxy.nft.ir import Family
from nlproxy.proxy.budget import NODE_BUDGET, SERVICE_BUDGET, admit, demand
from nlproxy.proxy.incremental import attach, plan_update
from nlproxy.proxy.planner import plan
from nlproxy.sync import balancing
from nlproxy.sync.balancing import BalancingGuard
from tests import world as tr
from tests.unit.builders import endpoint, eps_slice, port, service, snapshot

CH, RR = LoadBalancing.CONSISTENT_HASH, LoadBalancing.ROUND_ROBIN


def _svc(
    name: str, ports: int, count: int, *, created: str = "", **kw: object
) -> tuple[Service, object]:
    i = int(name.removeprefix("s"))
    svc = service(
        "ns", name, f"172.30.{i // 250}.{i % 250 + 1}",
        [port("ns", name, f"p{j}", 80 + j) for j in range(ports)],
        created=created, **kw,
    )  # fmt: skip
    eps = [endpoint(f"10.{100 + i}.{k // 250}.{k % 250 + 1}") for k in range(count)]
    sl = eps_slice("ns", name, eps, [(f"p{j}", 8080, "TCP") for j in range(ports)])
    return svc, sl


def _snap(*pairs: tuple[Service, object]) -> ClusterSnapshot:
    return snapshot([s for s, _ in pairs], [sl for _, sl in pairs])  # type: ignore[misc]


def _guard() -> BalancingGuard:
    return BalancingGuard(LoadBalancing.RANDOM, structlog.get_logger("test"))


@pytest.mark.parametrize(
    ("algorithm", "ports", "count", "local", "want"),
    [
        pytest.param(CH, 1, 2, False, 4096, id="ch-one-port"),
        pytest.param(CH, 20, 1000, False, 20 * 65536, id="ch-the-attack"),
        pytest.param(CH, 2, 200, True, 2 * 2 * 16384, id="ch-local-twice"),
        pytest.param(RR, 20, 1000, False, 20 * 1000, id="rr-one-per-endpoint"),
        pytest.param(LoadBalancing.RANDOM, 20, 1000, False, 0, id="random-shared"),
    ],
)
def test_demand_counts_each_table(
    algorithm: LoadBalancing, ports: int, count: int, local: bool, want: int
) -> None:
    svc, sl = _svc("s1", ports, count, internal_policy_local=local)
    assert demand(svc, (sl,), algorithm) == want  # type: ignore[arg-type]


def test_the_attack_falls_back_to_random_and_others_keep_theirs() -> None:
    """20 ports x 1000 endpoints of consistent hashing (1.3 M elements): random choice, its
    frontends still planned; a small consistent-hash Service beside it keeps its table."""
    big, small = _svc("s1", 20, 1000, load_balancing=CH), _svc("s2", 1, 3, load_balancing=CH)
    guard = _guard()
    with structlog.testing.capture_logs() as logs:
        snap, changed = guard.apply(_snap(big, small), set())
    key = big[0].key
    assert set(guard.fallbacks) == {key}
    assert str(guard.fallbacks[key]).startswith(
        f"consistent-hash needs {20 * 65536} elements, past the budget of {SERVICE_BUDGET}"
    )
    assert snap.services[key].load_balancing is LoadBalancing.RANDOM
    assert snap.services[small[0].key] is small[0]
    assert changed == {key}
    assert [(e["event"], e["service"]) for e in logs] == [("service.over_budget", "ns/s1")]
    assert guard.counts == {"unknown annotation": 0, "service budget": 1, "node budget": 0}
    rs = plan(snap, tr.config()).rulesets[Family.IP]
    assert sum(len(e) for name, e in rs.elements.items() if name.startswith("lb-")) == 4096
    # The next sync: the same substitute (an unchanged Service), nothing logged again.
    with structlog.testing.capture_logs() as logs:
        again, changed = guard.apply(_snap(big, small), set())
    assert again.services[key] is snap.services[key]
    assert (changed, logs) == (set(), [])


def test_the_node_budget_keeps_the_older_services() -> None:
    """Services of 4 tables each (16384 elements): eight fit the node; the ninth, the youngest,
    falls back, whatever its name; when an older one goes, it gets its tables back."""
    assert NODE_BUDGET == 8 * SERVICE_BUDGET
    pairs = [
        _svc(f"s{i}", 4, 3, load_balancing=CH, created=f"2026-01-{30 - i}T00:00:00Z")
        for i in range(1, 10)
    ]  # s9 is the oldest, s1 the youngest
    guard = _guard()
    with structlog.testing.capture_logs() as logs:
        guard.apply(_snap(*pairs), None)
    assert {str(k) for k in guard.fallbacks} == {"ns/s1"}
    assert guard.fallbacks[pairs[0][0].key].reason == "node budget"
    assert [e["event"] for e in logs] == ["service.over_budget"]
    with structlog.testing.capture_logs() as logs:
        _, changed = guard.apply(_snap(*pairs[:2], *pairs[3:]), {pairs[2][0].key})  # s3 goes
    assert guard.fallbacks == {}
    assert changed == {pairs[0][0].key, pairs[2][0].key}
    assert [(e["event"], e["service"]) for e in logs] == [("service.within_budget", "ns/s1")]


def test_admit_orders_by_age_then_name() -> None:
    """Without a timestamp, after those with one; equal timestamps by namespace/name."""
    svcs = [_svc(f"s{i}", 1, 1, created="2026-01-01T00:00:00Z")[0] for i in range(1, 9)]
    svcs.insert(0, _svc("s0", 1, 1)[0])
    demands = {s.key: (CH, NODE_BUDGET // 8) for s in svcs}  # eight fit
    assert set(admit({s.key: s for s in svcs}, demands)) == {svcs[0].key}
    svcs[0] = msgspec.structs.replace(svcs[0], created="2026-01-01T00:00:00Z")
    assert set(admit({s.key: s for s in svcs}, demands)) == {svcs[-1].key}


def test_incremental_plan_follows_a_fallback_like_a_fresh_one() -> None:
    """An endpoint added to a Service pushes it past the budget: the in-place update (given
    only the changed keys) and a fresh plan agree, and the other Service is untouched."""
    guard = _guard()
    config = tr.config()
    ok, other = _svc("s1", 4, 128, load_balancing=CH), _svc("s2", 1, 3, load_balancing=RR)
    snap, _ = guard.apply(_snap(ok, other), None)
    prev = plan(snap, config)
    attach(prev, snap)
    grown = _svc("s1", 4, 129, load_balancing=CH)  # 4 x 16384: past the budget
    snap2, changed = guard.apply(_snap(grown, other), {grown[0].key})
    updated, deltas = plan_update(prev, snap2, config, changed)
    assert deltas is not None, "in place"
    fresh = plan(snap2, config)
    assert updated.rulesets == fresh.rulesets
    assert not any(
        "jhash" in str(r) for rules in fresh.rulesets[Family.IP].rules.values() for r in rules
    )


def test_unknown_annotation_warned_once_and_counted() -> None:
    svc = service("ns", "web", "172.30.0.10", annotation_warnings=("metadata.annotations[x]: bad",))
    guard = _guard()
    with structlog.testing.capture_logs() as logs:
        guard.apply(snapshot([svc]), None)
        guard.apply(snapshot([svc]), None)
    assert [(e["event"], e["error"]) for e in logs] == [
        ("service.annotation_ignored", "metadata.annotations[x]: bad")
    ]
    assert guard.counts["unknown annotation"] == 1
    guard.apply(snapshot([msgspec.structs.replace(svc, annotation_warnings=())]), None)
    assert guard.counts["unknown annotation"] == 0
    assert ServiceKey(namespace="ns", name="web")


def test_a_burst_is_built_a_quota_per_sync_and_the_plan_stays_right() -> None:
    """Three new consistent-hash Services of 16384 elements each, with a quota of 16384: one
    gets its tables per sync, oldest first; the others start on random choice. A change of a
    built one past the quota keeps its old objects until its turn. Each in-place update equals
    a fresh plan of what was handed over."""
    guard = _guard()
    guard.quota = SERVICE_BUDGET
    config = tr.config()
    pairs = [
        _svc(f"s{i}", 4, 3, load_balancing=CH, created=f"2026-01-0{4 - i}T00:00:00Z")
        for i in range(1, 4)
    ]  # s3 is the oldest
    keys = [svc.key for svc, _ in pairs]

    def tables(snap: ClusterSnapshot) -> set[str]:
        return {str(k) for k, s in snap.services.items() if s.load_balancing is CH}

    snap, _ = guard.apply(_snap(*pairs), None)
    assert (tables(snap), guard.deferred) == ({"ns/s3"}, {keys[0], keys[1]})
    prev = plan(snap, config)
    attach(prev, snap)
    for want in ({"ns/s3", "ns/s2"}, {"ns/s3", "ns/s2", "ns/s1"}):
        snap, changed = guard.apply(_snap(*pairs), set())
        assert tables(snap) == want
        prev, deltas = plan_update(prev, snap, config, changed)
        assert deltas is not None
        assert prev.rulesets == plan(snap, config).rulesets
    assert guard.deferred == set()
    # s2 and s3 change in one go: s3 (older) is rebuilt, s2 keeps its old objects a sync.
    grown = [pairs[0], _svc("s2", 4, 4, load_balancing=CH, created="2026-01-02T00:00:00Z"),
             _svc("s3", 4, 4, load_balancing=CH, created="2026-01-01T00:00:00Z")]  # fmt: skip
    snap, changed = guard.apply(_snap(*grown), {keys[1], keys[2]})
    assert (changed, guard.deferred) == ({keys[2]}, {keys[1]})
    assert snap.slices[keys[1]] == (pairs[1][1],)
    prev, _ = plan_update(prev, snap, config, changed)
    assert prev.rulesets == plan(snap, config).rulesets
    snap, changed = guard.apply(_snap(*grown), set())
    assert (changed, guard.deferred) == ({keys[1]}, set())
    assert snap.slices[keys[1]] == (grown[1][1],)
    prev, _ = plan_update(prev, snap, config, changed)
    assert prev.rulesets == plan(snap, config).rulesets


def test_a_node_default_past_the_budget_logs_a_few_lines_and_updates_like_a_full_pass() -> None:
    """``--load-balancing consistent-hash`` over 50 Services: 32 tables fit the node, 18 fall
    back, logged as ten names and one count. A later change, handled from the changed keys
    only, gives what a full pass of a fresh guard gives."""
    pairs = [_svc(f"s{i}", 1, 2, created=f"2026-01-01T00:00:{i:02d}Z") for i in range(50)]
    guard = BalancingGuard(CH, structlog.get_logger("test"))
    with structlog.testing.capture_logs() as logs:
        snap, _ = guard.apply(_snap(*pairs), None)
    assert len(guard.fallbacks) == 18
    assert len(logs) == 11
    assert logs[-1]["services"] == 8
    assert logs[-1]["over"] == 8

    def choices(s: ClusterSnapshot) -> dict[ServiceKey, object]:
        return {k: v.load_balancing for k, v in s.services.items()}

    assert choices(snap) == {
        p[0].key: (LoadBalancing.RANDOM if i >= 32 else None) for i, p in enumerate(pairs)
    }
    # s5 goes: s32, the oldest of those left out, gets its table.
    rest = pairs[:5] + pairs[6:]
    incremental, changed = guard.apply(_snap(*rest), {pairs[5][0].key})
    full, _ = BalancingGuard(CH, structlog.get_logger("test")).apply(_snap(*rest), None)
    assert choices(incremental) == choices(full)
    assert changed == {pairs[5][0].key, pairs[32][0].key}
    assert incremental.services[pairs[33][0].key] is snap.services[pairs[33][0].key]


@pytest.mark.parametrize("changing", [1, 2, 5], ids=["one", "two", "five"])
def test_a_sync_naming_many_services_gives_what_the_keyed_pass_gives(
    changing: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Of eight consistent-hash Services under a quota of two tables, ``changing`` grow (one
    deleted): the pass over every Service (what ``WHOLE`` picks when many changed) gives the
    snapshot, the changed and the deferred Services the pass over the changed keys alone gives
    (the two oldest rebuilt, the others on their old objects)."""
    passes: list[bool] = []
    update = BalancingGuard._update_demands

    def spy(self: BalancingGuard, snap: ClusterSnapshot, keys: set[ServiceKey] | None) -> bool:
        passes.append(keys is None)
        return update(self, snap, keys)

    monkeypatch.setattr(BalancingGuard, "_update_demands", spy)

    def run(whole: int) -> tuple[dict[ServiceKey, object], set[ServiceKey], set[ServiceKey]]:
        monkeypatch.setattr(balancing, "WHOLE", whole)
        guard = _guard()
        pairs = [
            _svc(f"s{i}", 1, 3, load_balancing=CH, created=f"2026-01-01T00:00:0{i}Z")
            for i in range(8)
        ]
        svc, sl = pairs[0]
        guard.quota = 2 * demand(svc, [sl], CH)  # type: ignore[list-item]  # two tables a sync
        guard.apply(_snap(*pairs), None)
        for _ in range(4):  # every table built
            guard.apply(_snap(*pairs), set())
        grown = [
            _svc(f"s{i}", 1, 4, load_balancing=CH, created=f"2026-01-01T00:00:0{i}Z")
            if i < changing
            else pairs[i]
            for i in range(8)
        ]
        gone = pairs[7][0].key
        keys = {svc.key for svc, _ in grown[:changing]} | {gone}
        passes.clear()
        snap, changed = guard.apply(_snap(*grown[:7]), keys)
        seen = {k: (v.load_balancing, snap.slices.get(k)) for k, v in snap.services.items()}
        return seen, set(changed or ()), set(guard.deferred)

    keyed = run(0)  # no share of changed Services is enough for the whole pass
    assert passes == [False]
    whole = run(1_000_000)  # any changed Service is enough
    assert passes == [True]
    assert whole == keyed
    seen, changed, deferred = keyed

    def named(numbers: range) -> set[ServiceKey]:
        return {ServiceKey(namespace="ns", name=f"s{i}") for i in numbers}

    assert len(seen) == 7
    assert changed == named(range(min(changing, 2))) | named(range(7, 8))  # rebuilt, gone
    assert deferred == named(range(2, changing))
