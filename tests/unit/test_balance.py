"""Round-robin and consistent-hash service ports in the plan: the outcomes of random choice
through chains and maps of their own, kept equal to a fresh plan by in-place updates."""

from __future__ import annotations

from dataclasses import replace
from ipaddress import ip_address

import msgspec
import pytest

from nlproxy.cluster.model import LoadBalancing
from nlproxy.conntrack.plan import programmed_frontends, stale_flow_filters
from nlproxy.nft.ir import DnatMap, Family, Numgen, NumgenKind, Ruleset
from nlproxy.nft.render import render_ruleset
from nlproxy.proxy import naming as n
from nlproxy.proxy.incremental import attach, plan_update
from nlproxy.proxy.planner import plan
from nlproxy.sync.syncer import as_programmed, udp_only
from tests import world as tr
from tests.unit import incremental as inc
from tests.unit.builders import endpoint, eps_slice, port, service, snapshot, upsert

RR = LoadBalancing.ROUND_ROBIN
CH = LoadBalancing.CONSISTENT_HASH


@pytest.fixture(scope="module")
def round_robin() -> dict[Family, Ruleset]:
    return plan(tr.world(), tr.config(load_balancing=RR)).rulesets


@pytest.mark.parametrize("case", tr.CASES)
def test_every_trace_is_the_same_as_with_random_choice(
    round_robin: dict[Family, Ruleset], case: tr.Case
) -> None:
    """The whole tracer table (policies, node ports, short-circuits, firewall, hairpin, v6)."""
    assert case.trace(round_robin) == case.expected


@pytest.fixture(scope="module")
def consistent_hash() -> dict[Family, Ruleset]:
    return plan(tr.world(), tr.config(load_balancing=CH)).rulesets


@pytest.mark.parametrize("case", tr.CASES)
def test_every_trace_picks_one_of_the_same_endpoints_with_consistent_hashing(
    consistent_hash: dict[Family, Ruleset], case: tr.Case, request: pytest.FixtureRequest
) -> None:
    """One client, one endpoint: one of those random choice may pick, with the same verdict
    and masquerade. ClientIP affinity wins: a new client of such a Service is placed at random."""
    got = case.trace(consistent_hash)
    assert (got.verdict, got.masquerade) == (case.verdict, case.masq)
    assert got.endpoints <= case.expected.endpoints
    affinity = request.node.callspec.id.startswith("affinity")
    want = case.expected.endpoints
    assert len(got.endpoints) == (len(want) if affinity else min(len(want), 1))


def _web(**overrides: object) -> object:
    svc = service("ns", "web", "172.30.0.10", [port("ns", "web", node_port=30080)], **overrides)
    eps = [endpoint(f"10.180.0.{i}") for i in (1, 2, 3)]
    return snapshot([svc], [eps_slice("ns", "web", eps, [("p80", 8080, "TCP")])])


def _dnats(rs: Ruleset) -> dict[str, list[DnatMap]]:
    return {
        chain: [e for r in rules for e in r.exprs if isinstance(e, DnatMap)]
        for chain, rules in rs.rules.items()
        if any(isinstance(e, DnatMap) for r in rules for e in r.exprs)
    }


def test_round_robin_port_cycles_in_its_own_rules() -> None:
    rs = plan(_web(load_balancing=RR), tr.config()).rulesets[Family.IP]
    ref = port("ns", "web").ref
    lb_map = n.balanced_map(False, ref)
    inc_ = DnatMap((Numgen(3, NumgenKind.INC),), lb_map)
    # ClusterIP traffic and external traffic (the node port) each have a counter.
    assert _dnats(rs) == {
        n.balanced_chain("internal", ref): [inc_],
        n.balanced_chain("external", ref): [inc_],
    }
    assert [(el.key, el.value) for el in rs.elements[lb_map].values()] == [
        ((i,), (ip_address(f"10.180.0.{i + 1}"), 8080)) for i in range(3)
    ]
    assert not rs.elements[n.BACKENDS]
    assert not rs.elements[n.NODEPORT_BACKENDS]
    assert "dnat ip to numgen inc mod 3 map @lb-cluster-" in render_ruleset(rs)


def test_the_annotation_overrides_the_node_default() -> None:
    rr = plan(_web(load_balancing=LoadBalancing.RANDOM), tr.config(load_balancing=RR))
    assert rr.rulesets == plan(_web(), tr.config()).rulesets


def test_session_affinity_wins() -> None:
    both = plan(_web(load_balancing=RR, affinity_timeout=60), tr.config()).rulesets
    alone = plan(_web(affinity_timeout=60), tr.config()).rulesets
    assert both == alone


@pytest.mark.parametrize(
    ("algorithm", "seed", "steps"),
    [
        *(pytest.param(RR, seed, 40, id=f"round-robin-{seed}") for seed in range(4)),
        # Thousands of table elements per service: the fake kernel's checks take their time.
        pytest.param(CH, 0, 12, id="consistent-hash-0"),
    ],
)
def test_random_changes_keep_the_live_plan_equal_to_a_fresh_one(
    algorithm: LoadBalancing, seed: int, steps: int
) -> None:
    config = replace(inc.CONFIG, load_balancing=algorithm)
    world, state = inc.World(seed), inc.state_with_node()
    snap = state.snapshot()
    live = plan(snap, config)
    assert attach(live, snap)
    programmed = {f: as_programmed(live.rulesets[f]) for f in inc.FAMILIES}
    for _ in range(steps):
        batch = [c for _ in range(world.rng.choice([1, 1, 2, 3])) for c in world.step()]
        state.apply(batch)
        snap = state.snapshot()
        old_tables = [programmed[f] for f in inc.FAMILIES]
        live, deltas = plan_update(live, snap, config)
        fresh = inc.fresh_like(live, snap, config)
        assert live.rulesets == fresh.rulesets
        assert deltas is not None
        inc.check_conntrack(deltas, old_tables, fresh)
        programmed = {
            f: inc.check_ops(deltas[f], programmed[f], fresh.rulesets[f]) for f in inc.FAMILIES
        }


@pytest.mark.parametrize("algorithm", [RR, CH])
def test_conntrack_cleanup_sees_the_ports_own_endpoints(algorithm: LoadBalancing) -> None:
    """A UDP endpoint removed from a round-robin or consistent-hash port has its flows deleted,
    like any other: the programmed endpoints include the port's own map."""
    udp = [port("ns", "dns", "dns", 53, "UDP", node_port=30053)]

    def world(ips: list[str]) -> object:
        svc = service("ns", "dns", "172.30.0.53", udp, load_balancing=algorithm)
        eps = [endpoint(ip) for ip in ips]
        return snapshot([svc], [eps_slice("ns", "dns", eps, [("dns", 53, "UDP")])])

    old = plan(world(["10.180.0.1", "10.180.0.2", "10.180.0.3"]), tr.config())
    new = plan(world(["10.180.0.1", "10.180.0.3"]), tr.config())
    before = programmed_frontends(old.rulesets.values())
    after = programmed_frontends(new.rulesets.values())
    assert {str(b.addr) for fe in before for b in before[fe]} == {
        "10.180.0.1", "10.180.0.2", "10.180.0.3"
    }  # fmt: skip
    filters = stale_flow_filters(before, after, node_addrs=(), flush_tcp=False)
    assert filters
    assert {str(f.reply_src) for f in filters} == {"10.180.0.2"}


def test_udp_only_keeps_the_ports_own_maps() -> None:
    """At start-up only UDP frontends are read for cleanup: a round-robin UDP port's endpoints
    are among them."""
    udp = [port("ns", "dns", "dns", 53, "UDP")]
    svc = service("ns", "dns", "172.30.0.53", udp, load_balancing=RR)
    eps = [endpoint("10.180.0.1"), endpoint("10.180.0.2")]
    snap = snapshot([svc], [eps_slice("ns", "dns", eps, [("dns", 53, "UDP")])])
    rs = plan(snap, tr.config()).rulesets[Family.IP]
    got = programmed_frontends([udp_only(rs)])
    assert {str(b.addr) for fe in got for b in got[fe]} == {"10.180.0.1", "10.180.0.2"}


def test_a_service_changing_its_choice_is_updated_in_place() -> None:
    """random -> round-robin -> consistent-hash -> random by annotation, in place: each update
    equals a fresh plan, its operations leave what the full diff leaves, and stale flows agree."""
    state, svcs = inc.small()
    snap = state.snapshot()
    live = plan(snap, inc.CONFIG)
    assert attach(live, snap)
    programmed = {f: as_programmed(live.rulesets[f]) for f in inc.FAMILIES}
    for lb in (RR, CH, LoadBalancing.RANDOM):
        state.apply([upsert(msgspec.structs.replace(svcs[0], load_balancing=lb))])
        snap = state.snapshot()
        old_tables = [programmed[f] for f in inc.FAMILIES]
        live, deltas = plan_update(live, snap, inc.CONFIG)
        fresh = inc.fresh_like(live, snap, inc.CONFIG)
        assert live.rulesets == fresh.rulesets
        assert deltas is not None, f"{lb}: planned afresh"
        inc.check_conntrack(deltas, old_tables, fresh)
        programmed = {
            f: inc.check_ops(deltas[f], programmed[f], fresh.rulesets[f]) for f in inc.FAMILIES
        }
