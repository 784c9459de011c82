"""The UDP part of a plan that a first commit's conntrack cleanup reads (``cleanup.udp_part``)
is ``layout.udp_only``'s, found by the UDP frontends' keys instead of a pass over the packed
backends maps: the same on random clusters, planned afresh and updated in place as endpoints
come and go (the slots the endpoints keep)."""

from __future__ import annotations

import dataclasses

import pytest

from nlproxy.cluster.model import LoadBalancing
from nlproxy.proxy.incremental import attach, plan_update
from nlproxy.proxy.layout import udp_only
from nlproxy.proxy.planner import plan
from nlproxy.sync.cleanup import udp_part
from tests.unit.incremental import CONFIG, FAMILIES, World, state_with_node


@pytest.mark.parametrize("seed", range(6))
def test_the_udp_part_equals_udp_only_as_the_plan_changes(seed: int) -> None:
    balancing = LoadBalancing.RANDOM if seed % 2 else LoadBalancing.ROUND_ROBIN
    config = dataclasses.replace(CONFIG, load_balancing=balancing)
    world = World(seed, size=12)
    state = state_with_node()
    for _ in range(40):
        state.apply(world.step())
    snap = state.snapshot()
    live = plan(snap, config)
    attach(live, snap)
    found = 0
    for _ in range(60):
        for family in FAMILIES:
            rs = live.rulesets[family]
            assert udp_part(rs) == udp_only(rs), (seed, family)
            found += sum(map(len, udp_only(rs).elements.values()))
        changed = state.apply(world.step())
        live, _ = plan_update(live, state.snapshot(), config, changed)
    assert found  # UDP frontends with backends were there to find
