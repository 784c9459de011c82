"""Stable backends slots: one endpoint of a big random-choice port changes O(ports) elements,
every endpoint keeps exactly one slot, and a restart seeded from the kernel keeps the slots."""

from __future__ import annotations

from ipaddress import IPv4Address

import pytest

from nlproxy.nft.ir import Family
from nlproxy.nft.reconcile import diff, ops_for_delta
from nlproxy.proxy.incremental import attach, plan_update
from nlproxy.proxy.planner import plan, plan_slot_token
from nlproxy.proxy.slots import keep_slots
from nlproxy.sync.syncer import as_programmed
from tests.unit import incremental as inc
from tests.unit.builders import endpoint, eps_slice, port, service, upsert

PORTS = 20
ENDPOINTS = 200


@pytest.mark.parametrize(
    ("prior", "now", "want"),
    [
        pytest.param("abcd", "abcd", "abcd", id="same"),
        pytest.param("dcba", "abcd", "dcba", id="same-set-kept"),
        pytest.param("abcd", "acd", "adc", id="middle-goes-last-moves-in"),
        pytest.param("abcd", "abc", "abc", id="last-goes"),
        pytest.param("abcd", "abcde", "abcde", id="one-comes-last"),
        pytest.param("abcd", "bcde", "ebcd", id="one-goes-one-comes"),
        pytest.param("abcd", "cd", "cd", id="two-go-first-slots"),
        pytest.param("dcba", "ab", "ba", id="both-movers-in-slot-order"),
        pytest.param("", "ab", "ab", id="no-prior"),
    ],
)
def test_keep_slots(prior: str, now: str, want: str) -> None:
    got = keep_slots([c.encode() for c in prior], tuple(c.encode() for c in now))
    assert b"".join(got).decode() == want


def _ports() -> list:  # type: ignore[type-arg]
    return [port("a", "big", f"p{i}", 1000 + i, node_port=31000 + i) for i in range(PORTS)]


def _slice(addrs: list[str]):  # type: ignore[no-untyped-def]
    ports = [(f"p{i}", 8000 + i, "TCP") for i in range(PORTS)]
    return eps_slice("a", "big", [endpoint(a) for a in addrs], ports)


def _addrs(count: int) -> list[str]:
    return [str(IPv4Address("10.1.0.0") + i) for i in range(count)]


def test_one_endpoint_of_a_big_port_changes_a_few_elements_per_frontend() -> None:
    state = inc.state_with_node()
    svc = service("a", "big", "172.30.0.9", _ports())
    addrs = _addrs(ENDPOINTS)
    state.apply([upsert(svc), upsert(_slice(addrs))])
    snap = state.snapshot()
    live = plan(snap, inc.CONFIG)
    assert attach(live, snap)
    programmed = as_programmed(live.rulesets[Family.IP])
    assert plan_slot_token(live) == ""
    steps = [addrs[:3] + addrs[4:], addrs[:3] + addrs[4:] + ["10.2.0.1"], addrs]
    for now in steps:
        changed = state.apply([upsert(_slice(now))])
        snap = state.snapshot()
        live, deltas = plan_update(live, snap, inc.CONFIG, changed)
        assert deltas is not None
        ops = ops_for_delta(deltas[Family.IP], programmed)
        assert ops is not None
        elements = [op for op in ops if type(op.obj).__name__ == "Element"]
        # Per port and frontend (ClusterIP, node port): its slot rewritten (delete, add), the
        # last one deleted, the dispatch element rewritten (another endpoint count), and the
        # hairpin pair: never the ~200 slots after it (about 16,000 operations).
        assert len(elements) <= PORTS * 2 * 5 + 2, len(elements)
        fresh = inc.fresh_like(live, snap, inc.CONFIG)
        assert live.rulesets == fresh.rulesets
        programmed = inc.check_ops(deltas[Family.IP], programmed, fresh.rulesets[Family.IP])
    assert plan_slot_token(live) != ""
    # A restart reading the kernel back plans the same slots: nothing to rewrite.
    restarted = plan(snap, inc.CONFIG, slots={Family.IP: programmed})
    assert diff(restarted.rulesets[Family.IP], programmed) == []
    assert plan_slot_token(restarted) == plan_slot_token(live)
    # Without the read-back (a cold plan) the order is sorted, and the token says it differs.
    assert plan_slot_token(plan(snap, inc.CONFIG)) == ""
