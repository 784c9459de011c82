"""A relist that finds nothing changed plans nothing and sends nothing; one that finds a change
replans only the Services it changed (``sync/relist.py``), on the fakes (``nft/fake.py``).

A relist delivers every object anew as a ``Replace`` per kind; the copies here are built afresh
(equal by value, other objects), as the API source decodes them. A Node changed meanwhile in a
field planning does not read (a taint) marks no Service changed in the cluster state, and the
planner is given the Node without it.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio
import trio.testing

from nlproxy.cluster.model import (
    Change,
    ClusterSnapshot,
    Node,
    ObjectRef,
    Replace,
    ServiceKey,
    Upsert,
)
from nlproxy.cluster.state import ClusterState
from nlproxy.nft.fake import FakeNftables
from nlproxy.nft.ir import Family
from nlproxy.proxy import naming as n
from nlproxy.proxy.planner import Plan
from nlproxy.sync.relist import for_planning
from nlproxy.sync.syncer import Syncer, SyncResult
from tests.unit.builders import endpoint, eps_slice, node, port, service, upsert
from tests.unit.sync_fakes import fake_loop, make, text, to

SERVICES = 6
CHANGED = ServiceKey(namespace="a", name="svc-3")


def lists(
    *, moved: bool = False, taints: tuple[str, ...] = (), addresses: Sequence[str] = ()
) -> list[Change]:
    """A Replace per kind of freshly built objects: ``moved``: svc-3's endpoint is another;
    ``taints``: this Node's taint keys; ``addresses``: this Node's (else the default ones)."""
    base = node(addresses) if addresses else node()
    this = Node(name=base.name, addresses=base.addresses, taint_keys=taints)
    svcs, slices = [], []
    for i in range(SERVICES):
        name = f"svc-{i}"
        ip = f"10.1.0.{100 if moved and i == 3 else i + 1}"
        svcs.append(
            upsert(service("a", name, f"172.30.0.{i + 1}", [port("a", name, node_port=30000 + i)]))
        )
        slices.append(upsert(eps_slice("a", name, [endpoint(ip)])))
    ref = ObjectRef(kind="Node", namespace="", name=this.name)
    return [
        Replace(kind="Node", changes=(Upsert(ref=ref, obj=this),)),
        Replace(kind="Service", changes=tuple(svcs)),
        Replace(kind="EndpointSlice", changes=tuple(slices)),
    ]


def fragments(plan: Plan | None) -> dict[Family, dict[ServiceKey, object]]:
    assert plan is not None
    return {f: dict(frags) for f, frags in plan.fragments.items()}


def programmed() -> tuple[FakeNftables, ClusterState, Syncer, SyncResult]:
    nft = FakeNftables(n.TABLE)
    state = ClusterState(node().name)
    syncer = make(nft)
    changed = state.apply(lists())
    first = syncer.sync(state.snapshot(), changed=changed)
    assert to(nft, "172.30.0.4", 80) == {"10.1.0.4:80"}
    return nft, state, syncer, first


def test_a_relist_of_equal_objects_with_the_node_tainted_plans_nothing_and_sends_nothing() -> None:
    nft, state, syncer, first = programmed()
    before, table = fragments(first.plan), text(nft)

    changed = state.apply(lists(taints=("node.kubernetes.io/unreachable",)))
    assert changed == set()  # a taint alone changes no Service: planning does not read it
    result = syncer.sync(state.snapshot(), changed=changed)

    assert result.incremental
    assert result.total_ops == 0  # not even the restart records: planning reads no taint
    after = fragments(result.plan)
    assert after.keys() == before.keys()
    for family, frags in after.items():  # no Service was planned again: the same fragments
        assert frags.keys() == before[family].keys()
        assert all(frags[k] is before[family][k] for k in frags), family
    assert text(nft) == table


def test_a_relist_with_one_service_changed_replans_only_that_one() -> None:
    nft, state, syncer, first = programmed()
    before = fragments(first.plan)

    changed = state.apply(lists(moved=True, taints=("node.kubernetes.io/unreachable",)))
    assert changed == {CHANGED}  # the taint marks nothing: only the Service that moved
    result = syncer.sync(state.snapshot(), changed=changed)

    assert result.incremental
    assert result.total_ops > 0
    assert to(nft, "172.30.0.4", 80) == {"10.1.0.100:80"}
    after = fragments(result.plan)
    for family, frags in after.items():
        replanned = {k for k in frags if frags[k] is not before[family].get(k)}
        assert replanned <= {CHANGED}, family
    assert after[Family.IP][CHANGED] is not before[Family.IP][CHANGED]

    changed = state.apply(lists(moved=True))
    again = syncer.sync(state.snapshot(), changed=changed)
    assert again.total_ops == 0  # the taint went: nothing to plan either
    assert to(nft, "172.30.0.4", 80) == {"10.1.0.100:80"}


def test_a_node_change_planning_reads_still_replans_every_service() -> None:
    nft, state, syncer, first = programmed()
    before = fragments(first.plan)

    changed = state.apply(lists(addresses=("192.168.0.9",)))
    result = syncer.sync(state.snapshot(), changed=changed)

    assert result.narrowed is None
    assert result.total_ops > 0  # the NodePorts' addresses
    after = fragments(result.plan)
    assert all(after[Family.IP][k] is not before[Family.IP][k] for k in after[Family.IP])
    # What the planner now holds is what a fresh Syncer plans for the same snapshot.
    fresh = FakeNftables(n.TABLE)
    make(fresh).sync(state.snapshot())
    assert text(fresh) == text(nft)


def test_planning_sees_the_node_without_what_only_health_reads() -> None:
    plain = node()
    tainted = Node(
        name=plain.name,
        addresses=plain.addresses,
        labels=(("topology.kubernetes.io/zone", "z1"),),
        taint_keys=("t",),
        deleting=True,
    )
    snap = ClusterSnapshot(services={}, slices={}, node=tainted)
    reduced = for_planning(snap).node
    assert reduced == plain
    untouched = ClusterSnapshot(services={}, slices={}, node=plain)
    assert for_planning(untouched) is untouched


async def test_the_loop_reports_only_the_services_a_relist_changed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nft = FakeNftables(n.TABLE)
    reported: list[set[ServiceKey] | None] = []
    synced = trio.Event()

    def on_synced(result: SyncResult, pending: set[ServiceKey] | None) -> None:
        reported.append(pending)
        synced.set()

    loop = fake_loop(ClusterState(node().name), make(nft), on_synced)
    send, recv = trio.open_memory_channel[Sequence[Change]](10)
    await send.send(lists())
    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run, recv)
        synced = trio.Event()
        await send.send(lists(moved=True, taints=("node.kubernetes.io/unreachable",)))
        with trio.fail_after(600):
            await synced.wait()
        assert reported[-1] == {CHANGED}
        assert to(nft, "172.30.0.4", 80) == {"10.1.0.100:80"}
        nursery.cancel_scope.cancel()
