"""After a full commit the programmed state is the plan's own element maps, not a copy
(``result.as_programmed(share=True)``); the first thing that would change either (the next sync,
a repair, the loop once a sync is reported) gives the programmed state its own copy, so an
in-place plan update never reaches the cache behind the kernel's back."""

from __future__ import annotations

from nlproxy.conntrack.fake import FakeConntrack
from nlproxy.nft.fake import FakeNftables
from nlproxy.nft.ir import Family
from nlproxy.nft.reconcile import diff
from nlproxy.proxy import naming as n
from nlproxy.sync.fingerprint import take_record
from nlproxy.sync.kernel import SyncKernel
from nlproxy.sync.syncer import Syncer
from tests.unit.builders import endpoint, eps_slice, service, upsert
from tests.unit.incremental import CONFIG, state_with_node


def test_a_cold_commit_keeps_the_plans_maps_and_the_next_sync_copies_them() -> None:
    nft = FakeNftables("n")
    syncer = Syncer(CONFIG, SyncKernel(tables=nft.open, readback=nft, flows=FakeConntrack()))
    state = state_with_node()
    state.apply(
        [
            upsert(service("a", "web", "172.30.0.1")),
            upsert(eps_slice("a", "web", [endpoint("10.0.0.1"), endpoint("10.0.0.2")])),
        ]
    )
    first = syncer.sync(state.snapshot())
    assert first.plan is not None
    planned = first.plan.rulesets[Family.IP]
    programmed = syncer._programmed[Family.IP]
    assert programmed is not None
    assert programmed.elements[n.BACKENDS] is planned.elements[n.BACKENDS]  # no copy

    # One endpoint goes: the plan's map changes in place, the cache follows by its operations.
    changed = state.apply([upsert(eps_slice("a", "web", [endpoint("10.0.0.1")]))])
    second = syncer.sync(state.snapshot(), changed=changed)
    assert second.incremental
    assert second.total_ops > 0
    assert second.plan is not None
    now = second.plan.rulesets[Family.IP]
    programmed = syncer._programmed[Family.IP]
    assert programmed is not None
    assert programmed.elements[n.BACKENDS] is not planned.elements[n.BACKENDS]
    kernel = nft.dump(Family.IP)
    take_record(kernel)
    assert kernel is not None
    assert diff(now, kernel) == []  # the kernel holds the plan
    assert programmed.elements == now.elements  # and the cache says so
    assert syncer.sync(state.snapshot(), changed=set()).total_ops == 0


def test_settle_copies_once_and_a_repeat_is_free() -> None:
    nft = FakeNftables("n")
    syncer = Syncer(CONFIG, SyncKernel(tables=nft.open, readback=nft, flows=FakeConntrack()))
    state = state_with_node()
    state.apply(
        [
            upsert(service("a", "web", "172.30.0.1")),
            upsert(eps_slice("a", "web", [endpoint("10.0.0.1")])),
        ]
    )
    result = syncer.sync(state.snapshot())
    assert result.plan is not None
    planned = result.plan.rulesets[Family.IP]
    syncer.settle()
    programmed = syncer._programmed[Family.IP]
    assert programmed is not None
    kept = programmed.elements[n.BACKENDS]
    assert kept is not planned.elements[n.BACKENDS]
    assert kept == planned.elements[n.BACKENDS]
    syncer.settle()
    assert programmed.elements[n.BACKENDS] is kept
