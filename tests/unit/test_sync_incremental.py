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

import random
from dataclasses import replace
from ipaddress import ip_network
from types import MappingProxyType
from typing import Any

import pytest

from nlproxy.cluster.model import (
    Change,
    Delete,
    Endpoint,
    EndpointSlice,
    IPFamily,
    ObjectRef,
    Service,
    ServiceKey,
    Upsert,
)
from nlproxy.cluster.state import ClusterState
from nlproxy.conntrack.kernel import programmed_frontends, stale_flow_filters
from nlproxy.nft.fake import apply
from nlproxy.nft.ir import Family, Ruleset, SetFlag
from nlproxy.nft.reconcile import Delta, advance, diff, ops_for_delta
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.incremental import attach, changed_services, plan_update
from nlproxy.proxy.planner import Plan, plan
from nlproxy.sync.syncer import as_programmed, delta_frontends, udp_only
from tests.unit.builders import NODE, OTHER_NODE, endpoint, eps_slice, node, port, service, upsert

CONFIG = ProxyConfig(
    node_name=NODE,
    cluster_cidrs=(ip_network("10.0.0.0/8"), ip_network("fd00:10::/32")),
    service_cidrs=(ip_network("172.30.0.0/16"), ip_network("fd00:30::/64")),
)
NODE_ADDRS = node().addresses
FAMILIES = (Family.IP, Family.IP6)


class World:
    """Random cluster objects; service ``i`` owns its own addresses and node ports, so no two
    services ever claim the same element (that case has its own test)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.services: dict[int, Service] = {}
        self.endpoints: dict[tuple[int, int], list[Endpoint]] = {}

    def _ns(self, i: int) -> tuple[str, str]:
        return f"ns{i % 3}", f"svc{i}"

    def new_service(self, i: int) -> Service:
        rng, (ns, name) = self.rng, self._ns(i)
        families = rng.choice([(4,), (6,), (4, 6), (6, 4)])
        cips = [f"172.30.0.{i + 1}" if v == 4 else f"fd00:30::{i + 1:x}" for v in families]
        external = rng.random() < 0.4
        ports = [
            port(
                ns,
                name,
                f"p{p}",
                80 + p,
                rng.choice(["TCP", "UDP"]),
                node_port=30000 + 10 * i + p if external and rng.random() < 0.7 else None,
            )
            for p in range(rng.randint(1, 3))
        ]
        over: dict[str, Any] = {}
        if external:
            over["external_ips"] = [f"1.1.{i}.{k + 1}" for k in range(rng.randint(0, 2))]
            lbs = [f"2.2.{i}.{k + 1}" for k in range(rng.randint(0, 1))]
            lbs += [f"fd00:2:{i:x}::{k + 1}" for k in range(rng.randint(0, 1))]
            over["load_balancer_ips"] = lbs
            if lbs and rng.random() < 0.5:
                over["load_balancer_source_ranges"] = rng.choice(
                    [["192.168.0.0/16"], ["203.0.113.0/24", "fd00:99::/64"]]
                )
            over["external_policy_local"] = rng.random() < 0.5
            over["health_check_node_port"] = 32000 + i if over["external_policy_local"] else None
        over["internal_policy_local"] = rng.random() < 0.2
        if rng.random() < 0.25:
            over["affinity_timeout"] = rng.choice([300, 10800])
        return service(ns, name, cips, ports, **over)

    def new_endpoint(self, i: int, version: int) -> Endpoint:
        rng, j = self.rng, self.rng.randint(1, 200)
        ip = f"10.{i}.0.{j}" if version == 4 else f"fd00:10:{i:x}::{j:x}"
        state = rng.choice(["ready", "ready", "ready", "terminating", "gone"])
        return endpoint(
            ip,
            rng.choice([NODE, OTHER_NODE]),
            ready=state == "ready",
            serving=state != "gone",
            terminating=state != "ready",
        )

    def slice_of(self, i: int, version: int) -> EndpointSlice:
        ns, name = self._ns(i)
        eps = self.endpoints.get((i, version), [])
        ports = [(f"p{p}", 8080 + p, proto) for p in range(3) for proto in ("TCP", "UDP")]
        sl = eps_slice(ns, name, eps, ports, slice_name=f"{name}-v{version}")
        if not eps and version == 6:  # the builder takes the family from the first endpoint
            sl = replace(sl, family=IPFamily.IPV6)
        return sl

    def step(self) -> list[Change]:
        """One random change, as the sources would send it."""
        rng = self.rng
        i = rng.randrange(10)
        ns, name = self._ns(i)
        what = rng.random()
        if i not in self.services or what < 0.15:
            self.services[i] = self.new_service(i)
            return [upsert(self.services[i])]
        if what < 0.22:
            del self.services[i]
            return [Delete(ref=ObjectRef(kind="Service", namespace=ns, name=name))]
        version = rng.choice([4, 6])
        eps = self.endpoints.setdefault((i, version), [])
        if what < 0.27:
            eps.clear()
            return [
                Delete(ref=ObjectRef(kind="EndpointSlice", namespace=ns, name=f"{name}-v{version}"))
            ]
        if what < 0.6 or not eps:
            eps.append(self.new_endpoint(i, version))
        elif what < 0.85:
            eps.pop(rng.randrange(len(eps)))
        else:
            eps[rng.randrange(len(eps))] = self.new_endpoint(i, version)
        return [upsert(self.slice_of(i, version))]


def _check_ops(delta: Delta, before: Ruleset, fresh: Ruleset) -> Ruleset:
    """The delta's operations on ``before`` leave what the full diff leaves; returns it."""
    ops = ops_for_delta(delta, before)
    assert ops is not None, "the delta lists every chain using a redefined set"
    got = apply(before, ops)  # reference checks at every step
    want = apply(before, diff(fresh, before))
    assert got == want
    assert diff(fresh, got) == []
    cached = as_programmed_copy(before)
    advance(cached, ops)
    assert cached == as_programmed(fresh)
    return cached


def as_programmed_copy(rs: Ruleset) -> Ruleset:
    return Ruleset(
        table=rs.table,
        chains=dict(rs.chains),
        rules={c: list(r) for c, r in rs.rules.items()},
        sets=dict(rs.sets),
        elements={s: dict(els) for s, els in rs.elements.items()},
    )


def _check_conntrack(deltas: dict[Family, Delta], old: list[Ruleset], new: Plan) -> None:
    full_old = programmed_frontends(old)
    full_new = programmed_frontends([new.rulesets[f] for f in FAMILIES])
    want = stale_flow_filters(full_old, full_new, node_addrs=NODE_ADDRS, flush_tcp=True)
    b, a = delta_frontends(deltas, new.rulesets)
    got = stale_flow_filters(
        programmed_frontends(b), programmed_frontends(a), node_addrs=NODE_ADDRS, flush_tcp=True
    )
    assert got == want


def _state_with_node() -> ClusterState:
    state = ClusterState(NODE)
    state.apply([Upsert(ref=ObjectRef(kind="Node", namespace="", name=NODE), obj=node())])
    return state


@pytest.mark.parametrize("seed", range(8))
def test_random_changes_keep_the_live_plan_equal_to_a_fresh_one(seed: int) -> None:
    world, state = World(seed), _state_with_node()
    snap = state.snapshot()
    live = plan(snap, CONFIG)
    assert attach(live, snap)
    programmed = {f: as_programmed(live.rulesets[f]) for f in FAMILIES}
    incremental = 0
    for _ in range(60):
        batch = [c for _ in range(world.rng.choice([1, 1, 1, 2, 3])) for c in world.step()]
        changed = state.apply(batch)
        snap = state.snapshot()
        # Found by identity, the changed services include all the cluster state reported.
        assert changed & (set(snap.services) | _planned(live)) <= changed_services(live, snap)
        old_tables = [programmed[f] for f in FAMILIES]
        given = changed if world.rng.random() < 0.5 else None
        live, deltas = plan_update(live, snap, CONFIG, given)
        fresh = plan(snap, CONFIG)
        assert live.rulesets == fresh.rulesets
        assert live.ports == fresh.ports
        if deltas is None:
            programmed = {f: as_programmed(fresh.rulesets[f]) for f in FAMILIES}
            continue
        incremental += 1
        _check_conntrack(deltas, old_tables, fresh)
        programmed = {f: _check_ops(deltas[f], programmed[f], fresh.rulesets[f]) for f in FAMILIES}
    assert incremental == 60  # no shared elements, same config: never a full plan


def _planned(p: Plan) -> set[ServiceKey]:
    return set(p.fragments[Family.IP])


def _small() -> tuple[ClusterState, list[Service]]:
    state = _state_with_node()
    svcs = [
        service("a", "web", "172.30.0.1", [port("a", "web", node_port=30001)]),
        service("a", "api", "172.30.0.2", external_ips=["1.1.1.1"]),
    ]
    slices = [
        eps_slice("a", "web", [endpoint("10.0.0.1"), endpoint("10.0.0.2")], [("p80", 8080, "TCP")]),
        eps_slice("a", "api", [endpoint("10.0.0.2")], [("p80", 8080, "TCP")]),
    ]
    state.apply([upsert(o) for o in (*svcs, *slices)])
    return state, svcs


def test_one_endpoint_change_touches_a_few_elements() -> None:
    state, _ = _small()
    snap = state.snapshot()
    live = plan(snap, CONFIG)
    assert attach(live, snap)
    programmed = as_programmed(live.rulesets[Family.IP])
    sl = eps_slice("a", "web", [endpoint("10.0.0.1")], [("p80", 8080, "TCP")])
    changed = state.apply([upsert(sl)])
    live, deltas = plan_update(live, state.snapshot(), CONFIG, changed)
    assert deltas is not None
    assert deltas[Family.IP6].elements == {}
    # ClusterIP and NodePort: goto cluster-ip-2 -> -1 (api's), nodeport-2 -> -1 (new), backend 1
    # gone; the hairpin pair of 10.0.0.2 stays (api still uses it).
    changed_sets = sorted({name for name, _ in deltas[Family.IP].elements})
    assert changed_sets == ["backends", "nodeport-backends", "service-ips", "service-nodeports"]
    assert sorted(deltas[Family.IP].chains) == ["cluster-ip-2", "nodeport-1", "nodeport-2"]
    ops = ops_for_delta(deltas[Family.IP], programmed)
    assert ops is not None
    kinds = [(op.verb.value, type(op.obj).__name__) for op in ops]
    assert kinds == [
        *[("flush", "Chain")] * 2,
        *[("delete", "Element")] * 4,  # two vmap elements, two backends at index 1
        *[("delete", "Chain")] * 2,
        ("add", "Chain"),
        *[("add", "Element")] * 2,
        *[("add", "Rule")] * 2,  # nodeport-1: mark for masquerade, dnat
    ]
    _check_ops(deltas[Family.IP], programmed, plan(state.snapshot(), CONFIG).rulesets[Family.IP])


def test_config_change_plans_afresh() -> None:
    state, _ = _small()
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
    state, _ = _small()
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
    state, _ = _small()
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
    state, _ = _small()
    snap = state.snapshot()
    live = plan(snap, CONFIG)
    assert attach(live, snap)
    state.apply([Delete(ref=ObjectRef(kind="Service", namespace="a", name="api"))])
    live, deltas = plan_update(live, state.snapshot(), CONFIG, changed=set())
    assert deltas is None  # one service gone, none reported: do not trust it
    assert live.rulesets == plan(state.snapshot(), CONFIG).rulesets


def test_set_definition_change_is_left_to_the_full_diff() -> None:
    state, _ = _small()
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
    state = _state_with_node()
    sticky = service("a", "web", "172.30.0.1", affinity_timeout=300)
    eps = eps_slice("a", "web", [endpoint("10.0.0.1")], [("p80", 8080, "TCP")])
    state.apply([upsert(sticky), upsert(eps)])
    snap = state.snapshot()
    live = plan(snap, CONFIG)
    assert attach(live, snap)
    before = as_programmed(live.rulesets[Family.IP])
    changed = state.apply([upsert(replace(sticky, affinity_timeout=60))])
    live, deltas = plan_update(live, state.snapshot(), CONFIG, changed)
    assert deltas is not None
    delta = deltas[Family.IP]
    assert [b.timeout for b, a in delta.sets.values() if b and a] == [300]
    _check_ops(delta, before, plan(state.snapshot(), CONFIG).rulesets[Family.IP])


def test_services_trading_addresses_in_one_update_stay_in_place() -> None:
    state, _ = _small()
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
    world, state = World(seed), _state_with_node()
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
