"""Incremental syncs on the real kernel end with the table a fresh sync programs.

A long-lived :class:`Syncer` follows random Service/EndpointSlice changes (every feature, both
families) in a fresh namespace, taking the in-place path after the first sync; a second Syncer
programs only the final snapshot in another namespace. Both tables, read back, must be equal.
Conntrack cleanup on the in-place path: flows inserted with ``conntrack -I`` towards a removed
UDP endpoint go, the others stay.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from nlproxy.nft.ir import Family, SetFlag
from nlproxy.nft.readback import read_ruleset
from nlproxy.nft.reconcile import diff
from nlproxy.proxy.naming import TABLE as TABLE_NAME
from nlproxy.proxy.planner import plan
from nlproxy.sync.fingerprint import take_record
from nlproxy.sync.kernel import real as real_kernel
from nlproxy.sync.syncer import Syncer
from tests.netns import sh
from tests.unit.builders import endpoint, eps_slice, port, service, upsert
from tests.unit.incremental import CONFIG, World, sorted_slots, state_with_node

STEPS = 40


def test_incremental_syncs_end_where_a_fresh_sync_starts(
    make_netns: Callable[[str], str],
) -> None:
    live_ns, fresh_ns = make_netns("incr"), make_netns("fresh")
    world, state = World(seed=7), state_with_node()
    for _ in range(15):  # something to start from
        state.apply(world.step())
    syncer = Syncer(CONFIG, real_kernel(live_ns))
    try:
        first = syncer.sync(state.snapshot())
        assert not first.incremental
        paths = []
        for i in range(STEPS):
            changed = state.apply(world.step())
            result = syncer.sync(state.snapshot(), changed=changed if i % 2 else None)
            paths.append(result.incremental)
        assert all(paths)
        # And one change that surely leaves slots out of sorted order: the first of four goes.
        eps = [endpoint(f"10.99.0.{i}") for i in range(1, 5)]
        kept = service("z", "slots", "172.30.9.9", [port("z", "slots", node_port=31999)])
        for now in (eps, eps[1:]):
            sl = eps_slice("z", "slots", now, [("p80", 8080, "TCP")])
            changed = state.apply([upsert(kept), upsert(sl)])
            assert syncer.sync(state.snapshot(), changed=changed).incremental
        # After a verify the cache comes from the kernel: the full path, and nothing to do.
        syncer.verify()
        again = syncer.sync(state.snapshot())
        assert not again.incremental
        assert again.total_ops == 0
    finally:
        syncer.close()
    fresh = Syncer(CONFIG, real_kernel(fresh_ns))
    try:
        fresh.sync(state.snapshot())
    finally:
        fresh.close()
    planned = plan(state.snapshot(), CONFIG)
    tables = {}
    for family in (Family.IP, Family.IP6):
        got = read_ruleset(family, TABLE_NAME, netns=live_ns)
        want = read_ruleset(family, TABLE_NAME, netns=fresh_ns)
        assert got is not None
        assert want is not None
        tables[family] = got
        # The restart records carry each namespace's own generation.
        assert take_record(got) is not None
        assert take_record(want) is not None
        assert got.chains == want.chains
        assert got.rules == want.rules
        assert got.sets == want.sets
        # Endpoints kept their backends slots across changes: the same elements but for
        # the order of each frontend's slots.
        assert sorted_slots(got).elements == want.elements
        assert diff(planned.rulesets[family], want) == []
    # A restarted process reads the tables back (its records name slots a cold plan would
    # not fill so) and keeps the kernel's slots: nothing to do. Its next change lands right.
    again = Syncer(CONFIG, real_kernel(live_ns))
    try:
        assert again.sync(state.snapshot()).total_ops == 0
        for family in (Family.IP, Family.IP6):
            after = read_ruleset(family, TABLE_NAME, netns=live_ns)
            assert after is not None
            assert after.elements == tables[family].elements  # (the record is rewritten)
        sl = eps_slice("z", "slots", eps[2:], [("p80", 8080, "TCP")])
        changed = state.apply([upsert(sl)])
        assert again.sync(state.snapshot(), changed=changed).incremental
        assert again.sync(state.snapshot()).total_ops == 0
    finally:
        again.close()
    planned = plan(state.snapshot(), CONFIG)
    for family in (Family.IP, Family.IP6):
        after = read_ruleset(family, TABLE_NAME, netns=live_ns)
        assert after is not None
        assert sorted_slots(after).elements == planned.rulesets[family].elements


def _flows(ns: str) -> str:
    return sh("conntrack", "-L", "-p", "udp", ns=ns)


def _insert_flow(ns: str, dst: str, dport: int, endpoint: str, sport: int) -> None:
    sh(
        "conntrack", "-I", "-p", "udp", "-s", "192.168.0.9", "-d", dst, "--sport", str(sport),
        "--dport", str(dport), "-r", endpoint, "-q", "192.168.0.9", "--reply-port-src", "8080",
        "--reply-port-dst", str(sport), "-t", "120", ns=ns,
    )  # fmt: skip


def test_incremental_sync_deletes_the_flows_of_a_removed_udp_endpoint(
    make_netns: Callable[[str], str],
) -> None:
    ns = make_netns("incr-ct")
    state = state_with_node()
    svc = service("a", "dns", "172.30.0.1", [port("a", "dns", "p80", 80, "UDP", node_port=30001)])
    two = [endpoint("10.0.0.1"), endpoint("10.0.0.2")]
    state.apply([upsert(svc), upsert(eps_slice("a", "dns", two, [("p80", 8080, "UDP")]))])
    syncer = Syncer(CONFIG, real_kernel(ns))
    try:
        syncer.sync(state.snapshot())
        frontends = (("172.30.0.1", 80), ("192.168.0.2", 30001))  # ClusterIP, NodePort
        for n, (dst, dport) in enumerate(frontends):
            for sport, ep in ((1001 + 2 * n, "10.0.0.1"), (1002 + 2 * n, "10.0.0.2")):
                _insert_flow(ns, dst, dport, ep, sport)
        one = eps_slice("a", "dns", two[:1], [("p80", 8080, "UDP")])
        changed = state.apply([upsert(one)])
        result = syncer.sync(state.snapshot(), changed=changed)
    finally:
        syncer.close()
    assert result.incremental
    assert result.conntrack_deleted == 2
    left = _flows(ns)
    assert "src=10.0.0.2" not in left
    assert left.count("src=10.0.0.1") == 2


def test_changed_affinity_timeout_is_applied_in_place(make_netns: Callable[[str], str]) -> None:
    ns = make_netns("incr-aff")
    state = state_with_node()
    sticky = service("a", "web", "172.30.0.1", affinity_timeout=300)
    eps = [endpoint("10.0.0.1"), endpoint("10.0.0.2")]
    state.apply([upsert(sticky), upsert(eps_slice("a", "web", eps, [("p80", 8080, "TCP")]))])
    syncer = Syncer(CONFIG, real_kernel(ns))
    try:
        syncer.sync(state.snapshot())
        changed = state.apply([upsert(msgspec.structs.replace(sticky, affinity_timeout=60))])
        result = syncer.sync(state.snapshot(), changed=changed)
    finally:
        syncer.close()
    assert result.incremental
    got = read_ruleset(Family.IP, TABLE_NAME, netns=ns)
    assert got is not None
    assert take_record(got) is not None
    # (the clients map of the port: the map layout)
    timeouts = {s.timeout for s in got.sets.values() if s.flags & SetFlag.EVAL}
    assert timeouts == {60}
    assert diff(plan(state.snapshot(), CONFIG).rulesets[Family.IP], got) == []
