"""The pieces of a verify off the sync loop, on the real kernel: a read-back compared with the
plan finds another writer's change, is void when one of nlproxy's own syncs ran since it began
(never a false drift), and handed to the next sync repairs the table. Generations of nlproxy's
own commits are known, another process's are not."""

from __future__ import annotations

from collections.abc import Callable

from nlproxy.nft.ir import Family
from nlproxy.sync.kernel import real as real_kernel
from nlproxy.sync.syncer import Syncer
from tests.netns import sh
from tests.unit.builders import endpoint, eps_slice, service, upsert
from tests.unit.incremental import CONFIG, state_with_node


def test_a_read_back_finds_drift_is_void_after_a_sync_and_repairs(
    make_netns: Callable[[str], str],
) -> None:
    ns = make_netns("vol")
    state = state_with_node()
    web = service("a", "web", "172.30.0.1")
    state.apply([upsert(web), upsert(eps_slice("a", "web", [endpoint("10.0.0.1")]))])
    syncer = Syncer(CONFIG, real_kernel(ns))
    try:
        syncer.sync(state.snapshot())
        version = syncer.version
        assert syncer.repair_ops(Family.IP, syncer.read_back(Family.IP), version) == []
        assert syncer.verifier.own_generations  # the commits just made

        gen_before = syncer.verifier.own_generations[-1]
        sh("nft", "delete", "element", "ip", "nlproxy", "cluster-ips", "{ 172.30.0.1 }", ns=ns)
        stale = syncer.read_back(Family.IP)
        assert not syncer.own_commits(gen_before, gen_before + 1)  # another process's
        stale_ops = syncer.repair_ops(Family.IP, stale, version)
        assert stale_ops
        early = syncer.prepare_repair({Family.IP: stale}, {Family.IP: stale_ops}, version)
        assert early is not None

        # One of nlproxy's syncs runs after the read-back began: the comparison is void, and
        # a repair computed or prepared before it is refused.
        changed = state.apply([upsert(eps_slice("a", "web", [endpoint("10.0.0.2")]))])
        syncer.sync(state.snapshot(), changed=changed)
        assert syncer.repair_ops(Family.IP, stale, version) is None
        assert syncer.prepare_repair({Family.IP: stale}, {Family.IP: stale_ops}, version) is None
        assert syncer.repair({Family.IP: stale}, {Family.IP: []}, version, state.snapshot()) is None
        snap = state.snapshot()
        assert syncer.repair(early.tables, early.ops, version, snap, early) is None

        # Read back again: the drift is still there (the in-place sync did not touch it).
        version = syncer.version
        tables = {f: syncer.read_back(f) for f in (Family.IP, Family.IP6)}
        repairs = {f: syncer.repair_ops(f, rs, version) or [] for f, rs in tables.items()}
        prepared = syncer.prepare_repair(tables, repairs, version)
        assert prepared is not None
        assert syncer.repair(tables, repairs, version, state.snapshot(), prepared) == 1
        after = syncer.sync(state.snapshot(), changed=set())
        assert after.incremental  # the repair left the cache equal to the plan
        assert after.total_ops == 0
        version = syncer.version
        assert syncer.repair_ops(Family.IP, syncer.read_back(Family.IP), version) == []
    finally:
        syncer.close()
    assert "172.30.0.1" in sh("nft", "list", "set", "ip", "nlproxy", "cluster-ips", ns=ns)
