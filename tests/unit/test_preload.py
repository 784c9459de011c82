"""A cold start's initial lists taken page by page (``ClusterState.preload``,
``RestartRecords.warm``, ``sync/preload.py``): the state and the restart digest the complete
lists give afterwards are those of the lists applied at once, and only the tail is left."""

from __future__ import annotations

import threading
from ipaddress import ip_network
from typing import Any

import pytest
import structlog
import structlog.testing

from nlproxy.cluster.model import (
    Change,
    ClusterSnapshot,
    Invalid,
    ObjectRef,
    Replace,
    ServiceKey,
    Skip,
    Upsert,
)
from nlproxy.cluster.parse import to_change
from nlproxy.cluster.state import ClusterState
from nlproxy.conntrack.fake import FakeConntrack
from nlproxy.nft.fake import FakeNftables
from nlproxy.nft.ir import Family, Ruleset
from nlproxy.nft.render import render_ruleset
from nlproxy.proxy import naming as n
from nlproxy.proxy.budget import SYNC_QUOTA
from nlproxy.proxy.config import ProxyConfig
from nlproxy.sync import ahead as ahead_module
from nlproxy.sync import preload as preload_module
from nlproxy.sync import syncer as syncer_module
from nlproxy.sync.kernel import SyncKernel
from nlproxy.sync.preload import Preload
from nlproxy.sync.restart import RestartRecords
from nlproxy.sync.syncer import Syncer
from tests.objects import example_endpoint_slice as endpoint_slice
from tests.objects import example_node as node
from tests.objects import example_service as service

NODE = "node-a"
CONFIG = ProxyConfig(node_name=NODE, cluster_cidrs=(ip_network("10.0.0.0/8"),))

Listed = Upsert | Skip | Invalid


def svc(i: int, **fields: Any) -> Listed:
    ip = f"10.96.0.{i + 1}"
    doc = service(
        **{"metadata.name": f"s{i}", "spec.clusterIP": ip, "spec.clusterIPs": [ip], **fields}
    )
    change = to_change(doc)
    assert isinstance(change, Upsert | Skip | Invalid)
    return change


def eps(i: int, ip: str | None = None, **fields: Any) -> Listed:
    doc = endpoint_slice(
        **{
            "metadata.name": f"s{i}-a",
            "metadata.labels": {"kubernetes.io/service-name": f"s{i}"},
            "endpoints": [{"addresses": [ip or f"10.1.0.{i + 1}"], "nodeName": NODE}],
            **fields,
        }
    )
    change = to_change(doc)
    assert isinstance(change, Upsert | Skip | Invalid)
    return change


def the_node() -> Listed:
    change = to_change(node(**{"metadata.name": NODE}))
    assert isinstance(change, Upsert)
    return change


def lists(services: list[Listed], slices: list[Listed]) -> list[Change]:
    """The batch a source sends when its lists end."""
    return [
        Replace(kind="Service", changes=tuple(services)),
        Replace(kind="EndpointSlice", changes=tuple(slices)),
        Replace(kind="Node", changes=(the_node(),)),
    ]


def pages(changes: list[Listed], size: int) -> list[list[Listed]]:
    return [changes[i : i + size] for i in range(0, len(changes), size)]


def same(a: ClusterSnapshot, b: ClusterSnapshot) -> bool:
    return (
        dict(a.services) == dict(b.services)
        and dict(a.slices) == dict(b.slices)
        and a.node == b.node
    )


def render(rs: Ruleset | None) -> str:
    assert rs is not None
    return render_ruleset(rs)


def key(i: int) -> ServiceKey:
    return ServiceKey(namespace="default", name=f"s{i}")


def test_the_lists_over_their_preloaded_pages_make_the_state_they_make_alone() -> None:
    services = [svc(i) for i in range(7)] + [svc(7, **{"spec.clusterIP": "None"})]  # headless
    slices = [eps(i) for i in range(7)] + [eps(9)]  # s9: an orphan
    alone = ClusterState(NODE)
    changed_alone = alone.apply(lists(services, slices))

    state = ClusterState(NODE)
    for page in pages(services, 3) + pages(slices, 3):
        state.preload(page)
    changed = state.apply(lists(services, slices))
    assert same(state.snapshot(), alone.snapshot())
    assert changed == changed_alone  # every service reported once, by the lists' apply
    assert state.orphans() == alone.orphans()
    assert state.apply([]) == set()


def test_what_a_restarted_list_no_longer_holds_goes_with_the_lists_apply() -> None:
    """A list restarted from its first page (its continue token expired) hands its pages
    again; what only the first attempt held is removed by the complete list's Replace."""
    state = ClusterState(NODE)
    state.preload([svc(0), svc(1), svc(2)])  # the first attempt's first page
    state.preload([eps(0), eps(1, ip="10.1.0.99")])
    services, slices = [svc(1), svc(2)], [eps(1), eps(2)]  # s0 deleted, s1's endpoint moved
    for page in ([svc(1)], [svc(2)], slices):
        state.preload(page)
    changed = state.apply(lists(services, slices))
    alone = ClusterState(NODE)
    alone.apply(lists(services, slices))
    assert same(state.snapshot(), alone.snapshot())
    assert {key(0), key(1), key(2)} <= changed


def test_an_invalid_object_preloaded_is_named_as_the_lists_name_it() -> None:
    bad = svc(3, **{"spec.ports": [{"port": 70000}]})
    assert isinstance(bad, Invalid)
    state = ClusterState(NODE)
    state.preload([svc(0), bad])
    state.apply(lists([svc(0), bad], [eps(0)]))
    assert list(state.invalid) == [ObjectRef(kind="Service", namespace="default", name="s3")]
    fixed = ClusterState(NODE)
    fixed.preload([svc(0), bad])
    fixed.apply(lists([svc(0), svc(3)], [eps(0)]))  # fixed before the list ended
    assert not fixed.invalid
    assert key(3) in fixed.snapshot().services


def records() -> RestartRecords:
    return RestartRecords(CONFIG, FakeNftables(n.TABLE), structlog.get_logger())


def syncer_on(nft: FakeNftables) -> Syncer:
    return Syncer(CONFIG, SyncKernel(tables=nft.open, readback=nft, flows=FakeConntrack()))


def cold_and_warmed(size: int) -> tuple[RestartRecords, ClusterState, RestartRecords, list[Change]]:
    """Twelve Services and their slices (s0 without one, s20 an orphan): the records' digest of
    their lists taken at once, and a state and records warmed over them ``size`` objects a
    page; with the lists, for the warmed state to take."""
    services = [svc(i) for i in range(12)]
    slices = [eps(i) for i in range(1, 12)] + [eps(20)]  # s0 without, s20 an orphan
    alone = ClusterState(NODE)
    changed = alone.apply(lists(services, slices))
    cold = records()
    cold.take_digest(alone.snapshot(), changed, exact=True)

    state, warm = ClusterState(NODE), records()
    for page in pages(services, size) + pages(slices, size):
        changed = state.preload(page)
        warm.warm(state.snapshot(), changed)
    return cold, state, warm, lists(services, slices)


@pytest.mark.parametrize("size", [1, 3, 50])
def test_a_digest_warmed_page_by_page_is_the_digest_of_the_lists(size: int) -> None:
    cold, state, warm, listed = cold_and_warmed(size)
    changed = state.apply(listed)
    warm.take_digest(state.snapshot(), changed, exact=True)
    assert warm.digest is not None
    assert warm.digest == cold.digest


def test_warmed_services_are_not_hashed_again_by_the_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    services = [svc(i) for i in range(6)]
    slices = [eps(i) for i in range(6)]
    state, warm = ClusterState(NODE), records()
    for page in pages(services, 2) + pages(slices, 2):
        changed = state.preload(page)
        warm.warm(state.snapshot(), changed)
    hashed: list[bytes] = []
    monkeypatch.setattr("nlproxy.sync.fingerprint._h", lambda data: hashed.append(data) or 0)
    changed = state.apply(lists(services, slices))
    warm.take_digest(state.snapshot(), changed, exact=True)
    assert hashed == []


def test_the_daemons_page_hook_fills_the_state_and_the_syncers_digest() -> None:
    services = [svc(i) for i in range(5)]
    slices = [eps(i) for i in range(5)]
    state = ClusterState(NODE)
    nft = FakeNftables(n.TABLE)
    syncer = syncer_on(nft)
    on_page = Preload(state, syncer).page
    for page in pages(services, 2) + pages(slices, 2):
        on_page(page)
    changed = state.apply(lists(services, slices))
    assert changed == {key(i) for i in range(5)}
    syncer.sync(state.snapshot(), changed=changed)

    alone = ClusterState(NODE)
    cold_nft = FakeNftables(n.TABLE)
    cold = syncer_on(cold_nft)
    changed = alone.apply(lists(services, slices))
    cold.sync(alone.snapshot(), changed=changed)
    assert syncer.records.digest == cold.records.digest
    for family in (Family.IP, Family.IP6):
        assert render(nft.dump(family)) == render(cold_nft.dump(family))


# -- planned ahead (sync/ahead.py, Preload.listed) --------------------------------------------


def both_synced(
    services: list[Listed],
    early: list[Listed],
    late: list[Listed],
    *,
    quota: int | None = None,
) -> tuple[tuple[str, str], tuple[str, str], Syncer, Any]:
    """The tables and the first sync's result of a Syncer that planned ahead once the Services
    and the ``early`` slices were in (``late`` came after), beside those of one that did not."""
    state = ClusterState(NODE)
    nft = FakeNftables(n.TABLE)
    syncer = Syncer(
        CONFIG, SyncKernel(tables=nft.open, readback=nft, flows=FakeConntrack()), quota=quota
    )
    pre = Preload(state, syncer)
    for page in [[the_node()], *pages(services, 3), *pages(early, 3)]:  # the Node comes first
        pre.page(page)
    pre.listed("Service")
    assert pre.thread is not None
    for page in pages(late, 3):  # followed by the plan ahead
        pre.page(page)
    pre.listed("EndpointSlice")
    pre.thread.join(60)
    assert not pre.thread.is_alive()
    assert syncer.ahead._plan is not None  # made, not taken yet
    moved = {c.ref.name for c in late}
    final = [c for c in early if c.ref.name not in moved] + late  # each slice once, as listed
    changed = state.apply(lists(services, final))
    result = syncer.sync(state.snapshot(), changed=changed)

    alone = ClusterState(NODE)
    cold_nft = FakeNftables(n.TABLE)
    cold = Syncer(
        CONFIG,
        SyncKernel(tables=cold_nft.open, readback=cold_nft, flows=FakeConntrack()),
        quota=quota,
    )
    changed = alone.apply(lists(services, final))
    cold.sync(alone.snapshot(), changed=changed)
    assert syncer.records.digest == cold.records.digest
    ours = (render(nft.dump(Family.IP)), render(nft.dump(Family.IP6)))
    theirs = (render(cold_nft.dump(Family.IP)), render(cold_nft.dump(Family.IP6)))
    return ours, theirs, syncer, result


def updates_recorded(
    monkeypatch: pytest.MonkeyPatch,
) -> list[tuple[str, set[ServiceKey] | None]]:
    """Each plan update from now on, as (where: ``ahead`` or ``sync``, the services it was told
    changed; None: any)."""
    updated: list[tuple[str, set[ServiceKey] | None]] = []
    for where, module in (("ahead", ahead_module), ("sync", syncer_module)):
        real_update = module.plan_update

        def plan_update(
            last: Any, snap: Any, config: Any, changed: Any, where: str = where,
            real: Any = real_update, **kw: Any,
        ) -> Any:  # fmt: skip
            updated.append((where, None if changed is None else set(changed)))
            return real(last, snap, config, changed, **kw)

        monkeypatch.setattr(module, "plan_update", plan_update)
    return updated


def test_a_plan_made_ahead_and_updated_programs_what_a_plan_after_the_lists_programs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    updated = updates_recorded(monkeypatch)
    services = [svc(i) for i in range(9)]
    early = [eps(i) for i in range(6)]
    late = [eps(i, ip=f"10.2.0.{i + 1}") for i in range(4, 9)]  # s4, s5 moved; s6-s8 new
    late = [c for c in late if c.ref.name not in {"s4-a", "s5-a"}] + [
        eps(4, ip="10.2.0.5"),
        eps(5, ip="10.2.0.6"),
    ]
    ours, theirs, syncer, result = both_synced(services, early, late)
    assert ours == theirs
    # The pages after the plan ahead, as they came (s4 and s5, planned with endpoints before,
    # taken out and planned again from nothing); the first sync: nothing left.
    assert updated == [
        ("ahead", {key(6), key(7), key(8)}),
        ("ahead", {key(4), key(5)}),
        ("ahead", {key(4), key(5)}),
        ("sync", set()),
    ]
    assert result.narrowed is None  # every service is new to the kernel: none left unreported
    assert syncer.ahead.take() is None  # taken once, by the first sync


def test_the_plan_ahead_updates_without_deltas(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan ahead's updates ask the planner for no deltas and get none (only a commit
    reads them, and noting them cost a third of following the pages); the first sync's own
    update is made with them."""
    asked: list[tuple[str, object, bool]] = []

    def spying(where: str, module: Any) -> None:
        real_update = module.plan_update

        def plan_update(last: Any, snapshot: Any, config: Any, changed: Any, **kw: Any) -> Any:
            out = real_update(last, snapshot, config, changed, **kw)
            asked.append((where, kw.get("deltas", "default"), out[1] is not None))
            return out

        monkeypatch.setattr(module, "plan_update", plan_update)

    spying("ahead", ahead_module)
    spying("sync", syncer_module)
    services = [svc(i) for i in range(6)]
    early = [eps(i) for i in range(3)]
    late = [eps(i) for i in range(3, 6)]
    ours, theirs, _, _ = both_synced(services, early, late)
    assert ours == theirs
    ahead = [(deltas, got) for where, deltas, got in asked if where == "ahead"]
    assert ahead  # the late pages were followed
    assert set(ahead) == {(False, False)}
    assert [got for where, _, got in asked if where == "sync"] == [True]


@pytest.mark.parametrize(
    "quota", [None, SYNC_QUOTA, 2], ids=["no-quota", "daemon-quota", "tables-deferred"]
)
def test_services_the_budget_puts_on_random_choice_are_planned_as_the_sync_has_them(
    monkeypatch: pytest.MonkeyPatch, quota: int | None
) -> None:
    rr = {"metadata.annotations": {"nlproxy.io/load-balancing": "round-robin"}}
    services = [svc(i, **rr) for i in range(6)]
    slices = [eps(i) for i in range(6)]
    unlimited = both_synced_without_budget(services, slices)
    monkeypatch.setattr("nlproxy.proxy.budget.NODE_BUDGET", 3)  # three of six fall back
    ours, theirs, _, _ = both_synced(services, slices, [], quota=quota)
    assert ours == theirs
    assert ours[0] != unlimited


def both_synced_without_budget(services: list[Listed], slices: list[Listed]) -> str:
    alone = ClusterState(NODE)
    nft = FakeNftables(n.TABLE)
    syncer = syncer_on(nft)
    changed = alone.apply(lists(services, slices))
    syncer.sync(alone.snapshot(), changed=changed)
    return render(nft.dump(Family.IP))


def make_ahead(syncer: Syncer, snapshot: ClusterSnapshot) -> bool:
    syncer.ahead.starting()
    syncer.ahead.end()
    return syncer.ahead.run(
        snapshot, syncer.config, syncer.kernel.readback, syncer.log, fresh=syncer.fresh
    )


def test_no_plan_ahead_on_a_restart_or_without_records() -> None:
    services, slices = [svc(i) for i in range(3)], [eps(i) for i in range(3)]
    state = ClusterState(NODE)
    state.apply(lists(services, slices))
    nft = FakeNftables(n.TABLE)
    first = syncer_on(nft)
    first.sync(state.snapshot(), changed=None)  # a first process programmed them
    assert not first.fresh
    restarted = syncer_on(nft)
    assert restarted.fresh
    assert not make_ahead(restarted, state.snapshot())  # the tables hold a record
    o = FakeNftables(n.TABLE)
    owner = Syncer(CONFIG, SyncKernel(tables=o.open, readback=o, flows=FakeConntrack()), owner=True)
    assert not owner.fresh  # no records: a table without one may be its own
    assert not make_ahead(owner, state.snapshot())
    assert restarted.ahead.take() is None
    assert owner.ahead.take() is None


def test_the_first_sync_waits_for_a_plan_ahead_in_progress() -> None:
    services, slices = [svc(i) for i in range(3)], [eps(i) for i in range(3)]
    state = ClusterState(NODE)
    changed = state.apply(lists(services, slices))
    nft = FakeNftables(n.TABLE)
    syncer = syncer_on(nft)
    syncer.ahead.starting()
    done: list[object] = []
    sync = threading.Thread(
        target=lambda: done.append(syncer.sync(state.snapshot(), changed=changed))
    )
    sync.start()
    sync.join(0.2)
    assert sync.is_alive()
    assert not done  # held until the plan ahead ends
    syncer.ahead.end()
    assert syncer.ahead.run(
        state.snapshot(), syncer.config, syncer.kernel.readback, syncer.log, fresh=True
    )
    sync.join(60)
    assert done
    assert render(nft.dump(Family.IP)) == both_synced_without_budget(services, slices)


def test_slices_listed_before_the_services_end_the_plan_ahead_once_it_is_made() -> None:
    services, slices = [svc(i) for i in range(4)], [eps(i) for i in range(4)]
    state = ClusterState(NODE)
    syncer = syncer_on(FakeNftables(n.TABLE))
    pre = Preload(state, syncer)
    for page in [[the_node()], *pages(slices, 2), *pages(services, 2)]:
        pre.page(page)
    pre.listed("EndpointSlice")  # the slices' list ended first
    pre.listed("Service")
    assert pre.thread is not None
    pre.thread.join(60)
    assert not pre.thread.is_alive()  # planned, and nothing more to follow
    planned = syncer.ahead.take()
    assert planned is not None
    assert set(planned.fragments[Family.IP]) == {key(i) for i in range(4)}


def test_pages_after_a_plan_ahead_that_did_not_plan_are_not_kept() -> None:
    services, slices = [svc(i) for i in range(3)], [eps(i) for i in range(3)]
    first = ClusterState(NODE)
    first.apply(lists(services, slices))
    nft = FakeNftables(n.TABLE)
    syncer_on(nft).sync(first.snapshot(), changed=None)  # a restart: the tables hold records
    state = ClusterState(NODE)
    syncer = syncer_on(nft)
    pre = Preload(state, syncer)
    pre.page([the_node(), *services])
    pre.listed("Service")
    assert pre.thread is not None
    pre.thread.join(60)
    assert not pre.thread.is_alive()
    pre.page(slices)
    pre.listed("EndpointSlice")
    assert syncer.ahead._updates.empty()
    assert syncer.ahead.take() is None


def test_a_plan_ahead_that_fails_leaves_no_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    services, slices = [svc(i) for i in range(3)], [eps(i) for i in range(3)]
    state = ClusterState(NODE)
    state.preload([the_node(), *services, *slices[:2]])
    syncer = syncer_on(FakeNftables(n.TABLE))

    def broken(*args: object, **kw: object) -> object:
        raise ValueError("a bug in the update")

    monkeypatch.setattr(ahead_module, "plan_update", broken)
    syncer.ahead.starting()
    syncer.ahead.update(state.snapshot(), {key(2)})
    syncer.ahead.end()
    with pytest.raises(ValueError, match="a bug"):
        syncer.ahead.run(
            state.snapshot(), syncer.config, syncer.kernel.readback, syncer.log, fresh=True
        )
    assert syncer.ahead.take() is None  # the first sync plans afresh


def _slice(i: int, suffix: str, ip: str) -> Listed:
    return eps(i, ip=ip, **{"metadata.name": f"s{i}-{suffix}"})


@pytest.mark.parametrize("first_early", [True, False], ids=["across-the-start", "both-later"])
def test_a_service_whose_slices_come_on_two_pages_is_planned_as_after_the_lists(
    first_early: bool,
) -> None:
    """A Service of two slices (more than 100 endpoints), the one with the higher address first:
    updated in place, the plan ahead would keep the slots the first slice took, which no commit
    gave it, and program the endpoints out of their order, with a record no cold start writes
    (the next restart would not trust it)."""
    services = [svc(i) for i in range(5)]
    a, b = _slice(0, "a", "10.1.0.5"), _slice(0, "b", "10.1.0.1")
    early = [eps(1), eps(2)] + ([a] if first_early else [])
    # Pages of three: b comes on a page after a's.
    late = ([eps(3), eps(4)] if first_early else [a, eps(3), eps(4)]) + [b]
    ours, theirs, _, _ = both_synced(services, early, late)  # asserts the digests equal
    # The same objects, each chain's rules in their order (the chains made in another order).
    for mine, cold in zip(ours, theirs, strict=True):
        assert sorted(mine.split("\n\n")) == sorted(cold.split("\n\n"))


def test_a_plan_ahead_whose_thread_cannot_start_leaves_the_first_sync_to_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No thread to be had (a pids limit): the cold start goes on without a plan ahead, and
    the first sync does not wait for one."""
    state = ClusterState(NODE)
    syncer = syncer_on(FakeNftables(n.TABLE))
    pre = Preload(state, syncer)
    pre.page([the_node(), svc(0), eps(0)])

    def refused(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refused)
    with structlog.testing.capture_logs() as logs:
        pre.listed("Service")
    monkeypatch.undo()
    assert pre.thread is None
    assert [e["event"] for e in logs] == ["sync.plan_ahead_failed"]
    pre.page([eps(0, ip="10.1.0.7")])  # not queued for a thread that is not there
    pre.listed("EndpointSlice")
    assert syncer.ahead._updates.empty()
    assert syncer.ahead.take() is None  # at once: nothing to wait for


def slices_first_synced(
    early: list[Listed], late: list[Listed], slices: list[Listed]
) -> tuple[tuple[str, str], tuple[str, str], Syncer]:
    """The tables of a Syncer whose slices' list ended first (the ``early`` Services in by
    then, the ``late`` ones after), beside those of one that did not plan ahead."""
    named = {c.obj.service for c in slices if isinstance(c, Upsert)}  # by the slices
    state = ClusterState(NODE)
    nft = FakeNftables(n.TABLE)
    syncer = syncer_on(nft)
    pre = Preload(state, syncer)
    for page in [[the_node()], *pages(early, 3), *pages(slices, 3)]:
        pre.page(page)
    pre.listed("EndpointSlice")
    # Started by the first list of the two to end, when most Services are in.
    assert (pre.thread is not None) == (len(early) >= preload_module.EARLY_SHARE * len(named))
    for page in pages(late, 3):  # followed by the plan ahead
        pre.page(page)
    pre.listed("Service")
    assert pre.thread is not None
    pre.thread.join(60)
    assert not pre.thread.is_alive()
    changed = state.apply(lists(early + late, slices))
    syncer.sync(state.snapshot(), changed=changed)

    alone = ClusterState(NODE)
    cold_nft = FakeNftables(n.TABLE)
    cold = syncer_on(cold_nft)
    changed = alone.apply(lists(early + late, slices))
    cold.sync(alone.snapshot(), changed=changed)
    assert syncer.records.digest == cold.records.digest
    ours = (render(nft.dump(Family.IP)), render(nft.dump(Family.IP6)))
    theirs = (render(cold_nft.dump(Family.IP)), render(cold_nft.dump(Family.IP6)))
    return ours, theirs, syncer


def test_when_the_slices_are_listed_first_the_services_after_are_each_added_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plan ahead starts when the slices' list ends with most Services in (4 of the 7 the
    slices name; not 2), and adds each Service that comes after (its slices all in): one update
    per page, none taking a service out to plan it again, and nothing left for the first sync;
    the tables are a cold sync's."""
    updated = updates_recorded(monkeypatch)
    services = [svc(i) for i in range(8)]
    slices = [eps(i) for i in range(8) if i != 6] + [_slice(7, "b", "10.1.0.99")]  # s6: none
    ours, theirs, syncer = slices_first_synced(services[:2], services[2:], slices)
    assert ours == theirs  # s0 and s1 alone when the slices were in: planned after the lists
    assert updated == [("sync", set())]
    updated.clear()
    ours, theirs, syncer = slices_first_synced(services[:4], services[4:], slices)
    assert ours == theirs
    assert updated == [("ahead", {key(4), key(5), key(6)}), ("ahead", {key(7)}), ("sync", set())]
    assert syncer.ahead.take() is None


@pytest.mark.parametrize("early", [0, 1, 4, 6], ids=["none", "one", "most", "all"])
def test_a_plan_ahead_started_by_the_slices_programs_what_a_cold_sync_programs(
    early: int,
) -> None:
    services = [svc(i) for i in range(6)]
    slices = [eps(i) for i in range(5)] + [_slice(2, "b", "10.1.0.50")]  # s5: no slice
    ours, theirs, _ = slices_first_synced(services[:early], services[early:], slices)
    for mine, cold in zip(ours, theirs, strict=True):
        assert sorted(mine.split("\n\n")) == sorted(cold.split("\n\n"))


@pytest.mark.parametrize("size", [1, 3, 50])
def test_a_digest_warmed_page_by_page_looks_at_what_it_did_not_hash_whatever_it_is_told(
    size: int,
) -> None:
    """A first sync after a plan ahead is told only what the plan did not have (nothing, here):
    a service without a slice (s0) and a slice without its Service (s20) were never hashed by
    the pages, and the digest still covers them."""
    cold, state, warm, listed = cold_and_warmed(size)
    state.apply(listed)
    warm.take_digest(state.snapshot(), set(), exact=True)
    assert warm.digest == cold.digest


def test_a_cold_start_with_a_headless_service_writes_a_record_a_restart_trusts() -> None:
    """A headless Service's slice has no Service in the snapshot, and a Service may have no
    slice: the record of a cold start that planned ahead is the digest a restart takes, so the
    restart trusts the tables (no read-back, nothing sent)."""
    headless = to_change(
        service(**{"metadata.name": "s9", "spec.clusterIP": "None", "spec.clusterIPs": ["None"]})
    )
    assert isinstance(headless, Skip)
    services = [svc(i) for i in range(6)] + [headless]
    early, late = [eps(i) for i in range(3)], [eps(3), eps(4), eps(9)]  # s5: no slice
    ours, theirs, syncer, _ = both_synced(services, early, late)  # asserts the digests equal
    assert ours == theirs
    state = ClusterState(NODE)
    changed = state.apply(lists(services, early + late))
    nft = syncer.kernel.readback
    assert isinstance(nft, FakeNftables)
    restarted = syncer_on(nft)
    result = restarted.sync(state.snapshot(), changed=changed)
    assert result.restarted
    assert result.total_ops == 0
