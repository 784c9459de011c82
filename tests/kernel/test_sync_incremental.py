"""Incremental syncs on the real kernel end with the table a fresh sync programs.

A long-lived :class:`Syncer` follows random Service/EndpointSlice changes (every feature, both
families) in a fresh namespace, taking the in-place path after the first sync; a second Syncer
programs only the final snapshot in another namespace. Both tables, read back, must be equal.
"""

from __future__ import annotations

from collections.abc import Callable

from nlproxy.nft.ir import Family
from nlproxy.nft.readback import read_ruleset
from nlproxy.nft.reconcile import diff
from nlproxy.proxy.planner import plan
from nlproxy.sync import TABLE_NAME, Syncer
from tests.unit.test_sync_incremental import CONFIG, World, _state_with_node

STEPS = 40


def test_incremental_syncs_end_where_a_fresh_sync_starts(
    make_netns: Callable[[str], str],
) -> None:
    live_ns, fresh_ns = make_netns("incr"), make_netns("fresh")
    world, state = World(seed=7), _state_with_node()
    for _ in range(15):  # something to start from
        state.apply(world.step())
    syncer = Syncer(CONFIG, netns=live_ns)
    try:
        first = syncer.sync(state.snapshot())
        assert not first.incremental
        paths = []
        for i in range(STEPS):
            changed = state.apply(world.step())
            result = syncer.sync(state.snapshot(), changed=changed if i % 2 else None)
            paths.append(result.incremental)
        assert all(paths)
        # After a verify the cache comes from the kernel: the full path, and nothing to do.
        syncer.verify()
        again = syncer.sync(state.snapshot())
        assert not again.incremental
        assert again.total_ops == 0
    finally:
        syncer.close()
    fresh = Syncer(CONFIG, netns=fresh_ns)
    try:
        fresh.sync(state.snapshot())
    finally:
        fresh.close()
    planned = plan(state.snapshot(), CONFIG)
    for family in (Family.IP, Family.IP6):
        got = read_ruleset(family, TABLE_NAME, netns=live_ns)
        want = read_ruleset(family, TABLE_NAME, netns=fresh_ns)
        assert got is not None
        assert want is not None
        assert got.chains == want.chains
        assert got.rules == want.rules
        assert got.sets == want.sets
        assert got.elements == want.elements
        assert diff(planned.rulesets[family], got) == []
