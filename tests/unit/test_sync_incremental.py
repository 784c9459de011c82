"""In-place plan updates: after any sequence of changes, the same plan and table as a fresh sync.

Random sequences of Service and EndpointSlice adds, changes and removals (ClusterIP, NodePort,
external and LoadBalancer IPs with source ranges, traffic policies, affinity, several ports,
both families) go through the real cluster state. After every step the plan updated in place
must equal a fresh ``plan()`` of the same snapshot, and the operations made from its delta,
applied to what was programmed (with the reference checks of ``test_reconcile.apply``), must
leave the same table as the full ``diff``; stale-flow filters from the touched frontends must
equal those from the whole tables.
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import msgspec
import pytest

from nlproxy.cluster.model import (
    Delete,
    ObjectRef,
)
from nlproxy.conntrack.kernel import programmed_frontends, stale_flow_filters
from nlproxy.nft.ir import Family, SetFlag
from nlproxy.nft.packed import PackedElements
from nlproxy.nft.reconcile import Delta, ops_for_delta
from nlproxy.proxy.incremental import REPLAN_SHARE, attach, changed_services, plan_update
from nlproxy.proxy.planner import plan
from nlproxy.sync.syncer import as_programmed, udp_only
from tests.unit.builders import endpoint, eps_slice, port, service, upsert
from tests.unit.incremental import (
    CONFIG,
    FAMILIES,
    NODE_ADDRS,
    World,
    check_conntrack,
    check_ops,
    fresh_like,
    planned,
    same_objects,
    small,
    state_with_node,
)


@pytest.mark.parametrize("replan_share", [REPLAN_SHARE, 0.0], ids=["in-place", "replanned"])
@pytest.mark.parametrize("seed", range(8))
def test_random_changes_keep_the_live_plan_equal_to_a_fresh_one(
    seed: int, replan_share: float
) -> None:
    """In place (a few of ten services change at a time), and with every change planned
    afresh and compared with the last plan (what a burst of many changed services takes)."""
    world, state = World(seed), state_with_node()
    snap = state.snapshot()
    live = plan(snap, CONFIG)
    assert attach(live, snap)
    programmed = {f: as_programmed(live.rulesets[f]) for f in FAMILIES}
    incremental = 0
    for _ in range(60):
        batch = [c for _ in range(world.rng.choice([1, 1, 1, 2, 3])) for c in world.step()]
        changed = state.apply(batch)
        before, snap = snap, state.snapshot()
        # Found by identity, the changed services include every one whose objects the batch
        # changed (the state also names one whose slice came and went in the same batch).
        moved = {k for k in changed if not same_objects(before, snap, k)}
        assert moved & (set(snap.services) | planned(live)) <= changed_services(live, snap)
        old_tables = [programmed[f] for f in FAMILIES]
        given = changed if world.rng.random() < 0.5 else None
        live, deltas = plan_update(live, snap, CONFIG, given, replan_share=replan_share)
        fresh = fresh_like(live, snap, CONFIG)
        assert live.rulesets == fresh.rulesets
        assert live.ports == fresh.ports
        if deltas is None:
            programmed = {f: as_programmed(fresh.rulesets[f]) for f in FAMILIES}
            continue
        incremental += 1
        check_conntrack(deltas, old_tables, fresh)
        programmed = {f: check_ops(deltas[f], programmed[f], fresh.rulesets[f]) for f in FAMILIES}
    assert incremental == 60  # no shared elements, same config: never a full plan


@pytest.mark.parametrize("replan_share", [REPLAN_SHARE, 0.0], ids=["in-place", "replanned"])
@pytest.mark.parametrize("seed", range(2))
def test_bursts_of_many_services_keep_the_live_plan_equal_to_a_fresh_one(
    seed: int, replan_share: float
) -> None:
    """Bursts that change most of 60 services at once (endpoints, Services added, changed
    and removed), updated in place and planned afresh: each burst's deltas leave the tables a
    full diff leaves, and find every stale flow."""
    world, state = World(seed, size=60), state_with_node()
    state.apply([c for _ in range(200) for c in world.step()])
    snap = state.snapshot()
    live = plan(snap, CONFIG)
    assert attach(live, snap)
    programmed = {f: as_programmed(live.rulesets[f]) for f in FAMILIES}
    for _ in range(3):
        changed = state.apply([c for _ in range(100) for c in world.step()])
        snap = state.snapshot()
        assert len(changed) > len(snap.services) // 2
        old_tables = [programmed[f] for f in FAMILIES]
        live, deltas = plan_update(live, snap, CONFIG, changed, replan_share=replan_share)
        fresh = fresh_like(live, snap, CONFIG)
        assert live.rulesets == fresh.rulesets
        assert live.ports == fresh.ports
        assert deltas is not None
        check_conntrack(deltas, old_tables, fresh)
        programmed = {f: check_ops(deltas[f], programmed[f], fresh.rulesets[f]) for f in FAMILIES}


@pytest.mark.parametrize("replan_share", [REPLAN_SHARE, 0.0], ids=["in-place", "replanned"])
@pytest.mark.parametrize("seed", range(4))
def test_an_update_without_deltas_makes_the_same_plan(seed: int, replan_share: float) -> None:
    """``deltas=False`` (a plan made ahead following the pages): the plan each update gives
    is a fresh one's (updated in place where it can be), and no delta is noted."""
    world, state = World(seed), state_with_node()
    snap = state.snapshot()
    live = plan(snap, CONFIG)
    assert attach(live, snap)
    for _ in range(30):
        changed = state.apply([c for _ in range(world.rng.choice([1, 2, 3])) for c in world.step()])
        snap = state.snapshot()
        live, deltas = plan_update(
            live, snap, CONFIG, changed, replan_share=replan_share, deltas=False
        )
        assert deltas is None
        fresh = fresh_like(live, snap, CONFIG)
        assert live.rulesets == fresh.rulesets
        assert live.ports == fresh.ports


def test_one_endpoint_change_touches_a_few_elements() -> None:
    state, _ = small()
    snap = state.snapshot()
    live = plan(snap, CONFIG)
    assert attach(live, snap)
    programmed = as_programmed(live.rulesets[Family.IP])
    sl = eps_slice("a", "web", [endpoint("10.0.0.1")], [("p80", 8080, "TCP")])
    changed = state.apply([upsert(sl)])
    live, deltas = plan_update(live, state.snapshot(), CONFIG, changed)
    assert deltas is not None
    assert deltas[Family.IP6].elements == deltas[Family.IP6].packed == {}
    # ClusterIP and NodePort: goto cluster-ip-2 -> -1 (api's), nodeport-2 -> -1 (new), backend 1
    # gone; the hairpin pair of 10.0.0.2 stays (api still uses it). The backends maps are held
    # packed: their changes are bytes.
    changed_sets = sorted({name for name, _ in deltas[Family.IP].elements})
    assert changed_sets == ["service-ips", "service-nodeports"]
    assert sorted(deltas[Family.IP].packed) == ["backends", "nodeport-backends"]
    assert [len(c) for c in deltas[Family.IP].packed.values()] == [1, 1]
    assert sorted(deltas[Family.IP].chains) == ["cluster-ip-2", "nodeport-1", "nodeport-2"]
    ops = ops_for_delta(deltas[Family.IP], programmed)
    assert ops is not None
    kinds = [(op.verb.value, type(op.obj).__name__) for op in ops]
    assert kinds == [
        *[("flush", "Chain")] * 2,
        *[("delete", "Element")] * 2,  # two vmap elements
        *[("delete", "PackedRun")] * 2,  # the backends at index 1, one run per map
        *[("delete", "Chain")] * 2,
        ("add", "Chain"),
        *[("add", "Element")] * 2,
        *[("add", "Rule")] * 2,  # nodeport-1: mark for masquerade, dnat
    ]
    check_ops(deltas[Family.IP], programmed, plan(state.snapshot(), CONFIG).rulesets[Family.IP])


@pytest.mark.parametrize("foreign_comment", [False, True])
def test_a_packed_delta_against_a_cache_held_unpacked(foreign_comment: bool) -> None:
    """After a read-back the cache holds a packed map's elements one by one; a delta's
    packed changes are compared with them (repacked as bytes, or, when an element carries
    what bytes cannot hold, such as another writer's comment, element by element) and
    leave what the full diff leaves."""
    state, _ = small()
    snap = state.snapshot()
    live = plan(snap, CONFIG)
    assert attach(live, snap)
    packed = as_programmed(live.rulesets[Family.IP])
    elements = {
        name: dict(els.items()) if isinstance(els, PackedElements) else els
        for name, els in packed.elements.items()
    }
    sl = eps_slice("a", "web", [endpoint("10.0.0.1")], [("p80", 8080, "TCP")])
    changed = state.apply([upsert(sl)])
    live, deltas = plan_update(live, state.snapshot(), CONFIG, changed)
    assert deltas is not None
    (key,) = deltas[Family.IP].packed["backends"]  # the backend at index 1, gone
    if foreign_comment:
        store = packed.elements["backends"]
        assert isinstance(store, PackedElements)
        gone = store.decode_key(key)
        elements["backends"][gone] = msgspec.structs.replace(
            elements["backends"][gone], comment="theirs"
        )
    unpacked = replace(packed, elements=elements)
    check_ops(deltas[Family.IP], unpacked, plan(state.snapshot(), CONFIG).rulesets[Family.IP])


def test_config_change_plans_afresh() -> None:
    state, _ = small()
    snap = state.snapshot()
    live = plan(snap, CONFIG)
    assert attach(live, snap)
    other = replace(CONFIG, masquerade_bit=3)
    live, deltas = plan_update(live, snap, other)
    assert deltas is None
    assert live.rulesets == plan(snap, other).rulesets
    _, deltas = plan_update(live, snap, other)  # attached again: in place from now on
    assert deltas is not None
    assert all(len(d) == 0 for d in deltas.values())


def test_element_claimed_by_two_services_falls_back_to_a_full_plan() -> None:
    """The state refuses a second claim of one frontend (``claims.py``); a snapshot built
    without it (another caller of the planner) still must not be updated in place."""
    state, _ = small()
    snap = state.snapshot()
    live = plan(snap, CONFIG)
    assert attach(live, snap)
    # A second service on api's external IP and port: both write service-ips 1.1.1.1 . tcp . 80.
    clash = service("b", "clash", "172.30.0.3", external_ips=["1.1.1.1"])
    clash_eps = eps_slice("b", "clash", [endpoint("10.0.0.9")], [("p80", 8080, "TCP")])
    both = replace(
        snap,
        services=MappingProxyType({**snap.services, clash.key: clash}),
        slices=MappingProxyType({**snap.slices, clash.key: (clash_eps,)}),
    )
    live, deltas = plan_update(live, both, CONFIG, {clash.key})
    assert deltas is None
    assert live.rulesets == plan(both, CONFIG).rulesets
    assert live.live is None  # attach refused: undoing one could not tell what the other needs
    live, deltas = plan_update(live, snap, CONFIG, {clash.key})
    assert deltas is None
    assert live.live is not None  # no clash left: attached again
    assert live.rulesets == plan(snap, CONFIG).rulesets


def test_the_state_refuses_the_second_claim_and_plans_in_place() -> None:
    state, _ = small()
    snap = state.snapshot()
    live = plan(snap, CONFIG)
    assert attach(live, snap)
    clash = service("b", "clash", "172.30.0.3", external_ips=["1.1.1.1"])
    clash_eps = eps_slice("b", "clash", [endpoint("10.0.0.9")], [("p80", 8080, "TCP")])
    changed = state.apply([upsert(clash), upsert(clash_eps)])
    assert state.refused == [
        "Service b/clash: spec.externalIPs: 1.1.1.1 port 80/TCP is also Service a/api's "
        "(older); 1.1.1.1 left out"
    ]
    live, deltas = plan_update(live, state.snapshot(), CONFIG, changed)
    assert deltas is not None
    assert live.rulesets == plan(state.snapshot(), CONFIG).rulesets


def test_changed_set_that_miscounts_services_falls_back() -> None:
    state, _ = small()
    snap = state.snapshot()
    live = plan(snap, CONFIG)
    assert attach(live, snap)
    state.apply([Delete(ref=ObjectRef(kind="Service", namespace="a", name="api"))])
    live, deltas = plan_update(live, state.snapshot(), CONFIG, changed=set())
    assert deltas is None  # one service gone, none reported: do not trust it
    assert live.rulesets == plan(state.snapshot(), CONFIG).rulesets


def test_set_definition_change_is_left_to_the_full_diff() -> None:
    state, _ = small()
    rs = plan(state.snapshot(), CONFIG).rulesets[Family.IP]
    # A planned set with elements would need them all again; a dynamic set used by a chain the
    # delta does not list would need that chain rewritten.
    name = "hairpin"
    redefined = replace(rs.sets[name], timeout=60)
    delta = Delta(sets={name: (rs.sets[name], redefined)})
    assert ops_for_delta(delta, as_programmed(rs)) is None
    rs.sets[name] = dynamic = replace(rs.sets[name], flags=rs.sets[name].flags | SetFlag.EVAL)
    delta = Delta(sets={name: (dynamic, replace(dynamic, timeout=60))})
    assert ops_for_delta(delta, as_programmed(rs)) is None


def test_changed_affinity_timeout_recreates_the_sets_and_rewrites_their_chains() -> None:
    state = state_with_node()
    sticky = service("a", "web", "172.30.0.1", affinity_timeout=300)
    eps = eps_slice("a", "web", [endpoint("10.0.0.1")], [("p80", 8080, "TCP")])
    state.apply([upsert(sticky), upsert(eps)])
    snap = state.snapshot()
    live = plan(snap, CONFIG)
    assert attach(live, snap)
    before = as_programmed(live.rulesets[Family.IP])
    changed = state.apply([upsert(msgspec.structs.replace(sticky, affinity_timeout=60))])
    live, deltas = plan_update(live, state.snapshot(), CONFIG, changed)
    assert deltas is not None
    delta = deltas[Family.IP]
    assert [b.timeout for b, a in delta.sets.values() if b and a] == [300]
    check_ops(delta, before, plan(state.snapshot(), CONFIG).rulesets[Family.IP])


def test_services_trading_addresses_in_one_update_stay_in_place() -> None:
    state, _ = small()
    snap = state.snapshot()
    live = plan(snap, CONFIG)
    assert attach(live, snap)
    # web takes api's ClusterIP and external IP and api web's: every element changes writer.
    web = service("a", "web", "172.30.0.2", [port("a", "web", node_port=30001)])
    api = service("a", "api", "172.30.0.1", external_ips=["1.1.1.2"])
    web2 = service(
        "a", "web", "172.30.0.2", [port("a", "web", node_port=30001)], external_ips=["1.1.1.1"]
    )
    changed = state.apply([upsert(web2), upsert(api)])
    live, deltas = plan_update(live, state.snapshot(), CONFIG, changed)
    assert deltas is not None
    assert live.rulesets == plan(state.snapshot(), CONFIG).rulesets
    assert web.key in changed


@pytest.mark.parametrize("seed", range(5))
def test_cold_start_filters_from_udp_frontends_only_equal_the_full_ones(seed: int) -> None:
    world, state = World(seed), state_with_node()
    for _ in range(40):
        state.apply(world.step())
    rulesets = list(plan(state.snapshot(), CONFIG).rulesets.values())
    nothing = programmed_frontends([])
    full = stale_flow_filters(nothing, programmed_frontends(rulesets), node_addrs=NODE_ADDRS)
    udp = stale_flow_filters(
        nothing, programmed_frontends([udp_only(rs) for rs in rulesets]), node_addrs=NODE_ADDRS
    )
    assert udp == full
    assert any(f.proto == "udp" for f in full), "the random cluster has UDP frontends"
