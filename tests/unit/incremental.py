"""The randomised cluster and the checks the in-place planning tests share: a World of Services and
slices changed at random, the node's state, and what a delta must do to the programmed tables."""

from __future__ import annotations

import random
from dataclasses import replace
from ipaddress import ip_network
from typing import Any

import msgspec

from nlproxy.cluster.model import (
    Change,
    ClusterSnapshot,
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
from nlproxy.nft.ir import Family, Ruleset
from nlproxy.nft.packed import PackedElements
from nlproxy.nft.reconcile import Delta, advance, diff, ops_for_delta
from nlproxy.proxy import naming as n
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.layout import flow_frontends
from nlproxy.proxy.planner import Plan, plan
from nlproxy.sync.syncer import as_programmed
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

    def __init__(self, seed: int, size: int = 10) -> None:
        assert size <= 200, "node ports and health check ports would collide"
        self.size = size
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
            sl = msgspec.structs.replace(sl, family=IPFamily.IPV6)
        return sl

    def step(self) -> list[Change]:
        """One random change, as the sources would send it."""
        rng = self.rng
        i = rng.randrange(self.size)
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


def check_ops(delta: Delta, before: Ruleset, fresh: Ruleset) -> Ruleset:
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


def check_conntrack(deltas: dict[Family, Delta], old: list[Ruleset], new: Plan) -> None:
    full_old = programmed_frontends(old)
    full_new = programmed_frontends([new.rulesets[f] for f in FAMILIES])
    for flush_tcp in (True, False):
        want = stale_flow_filters(full_old, full_new, node_addrs=NODE_ADDRS, flush_tcp=flush_tcp)
        b, a = flow_frontends(deltas, new.rulesets, flush_tcp=flush_tcp)
        got = stale_flow_filters(
            programmed_frontends(b),
            programmed_frontends(a),
            node_addrs=NODE_ADDRS,
            flush_tcp=flush_tcp,
        )
        assert got == want


def state_with_node() -> ClusterState:
    state = ClusterState(NODE)
    state.apply([Upsert(ref=ObjectRef(kind="Node", namespace="", name=NODE), obj=node())])
    return state


def same_objects(before: ClusterSnapshot, after: ClusterSnapshot, key: ServiceKey) -> bool:
    """Whether ``key``'s Service and slices are equal in the two snapshots."""
    return before.services.get(key) == after.services.get(key) and before.slices.get(
        key, ()
    ) == after.slices.get(key, ())


def planned(p: Plan) -> set[ServiceKey]:
    return set(p.fragments[Family.IP])


def small() -> tuple[ClusterState, list[Service]]:
    state = state_with_node()
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


SLOT_MAPS = (n.BACKENDS, n.BACKENDS_LOCAL, n.NODEPORT_BACKENDS, n.NODEPORT_BACKENDS_LOCAL)


def sorted_slots(rs: Ruleset) -> Ruleset:
    """``rs`` with every frontend's backends slots in sorted order (a cold plan's order)."""
    elements = dict(rs.elements)
    for name in SLOT_MAPS:
        store = elements.get(name)
        if not store:  # read back empty: not held packed
            continue
        assert isinstance(store, PackedElements)
        by_head: dict[bytes, list[tuple[bytes, bytes]]] = {}
        for key, data in store.raw.items():
            by_head.setdefault(key[:-4], []).append((key, data))
        raw = {}
        for pairs in by_head.values():
            keys = sorted(k for k, _ in pairs)
            raw.update(zip(keys, sorted(d for _, d in pairs), strict=True))
        elements[name] = PackedElements(store.set, raw)
    return replace(rs, elements=elements)


def fresh_like(live: Plan, snap: ClusterSnapshot, config: ProxyConfig) -> Plan:
    """A cold plan of ``snap`` that keeps ``live``'s backends slots (as a restarted process
    seeded from the kernel's read-back does), after checking that ``live`` differs from the
    plain cold plan in nothing but the order of slots (each endpoint in exactly one)."""
    cold = plan(snap, config)
    for f in FAMILIES:
        assert sorted_slots(live.rulesets[f]) == cold.rulesets[f]
    return plan(snap, config, slots={f: as_programmed(live.rulesets[f]) for f in FAMILIES})
