"""The whole sync on the fakes, as kube-proxy's proxier tests run on its fake nftables and
conntrack: plan → diff → commit → conntrack cleanup, asserted with the packet tracer and the
rendered table, no kernel and no root (``nft/fake.py``, ``conntrack/fake.py``).

The fakes are kept honest by ``tests/kernel/test_nft_fake.py``, which sends the kernel and the
fake the same batches.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio
import trio.testing

from nlproxy.cluster.model import (
    Change,
    ClusterSnapshot,
    EndpointSlice,
    LoadBalancing,
    Service,
    ServiceKey,
)
from nlproxy.conntrack.fake import FakeConntrack
from nlproxy.conntrack.kernel import ConntrackError
from nlproxy.nft.fake import FakeNftables
from nlproxy.nft.ir import Element, Family, Operation, Table, Verb
from nlproxy.nft.monitor import Drift
from nlproxy.proxy import naming as n
from nlproxy.sync.fingerprint import Fingerprint
from tests.unit.builders import endpoint, eps_slice, node, port, service, snapshot, upsert
from tests.unit.incremental import state_with_node
from tests.unit.sync_fakes import (
    TCP,
    UDP,
    dns,
    dns_slice,
    fake_loop,
    flow,
    make,
    synced_once,
    text,
    to,
    web_changes,
    web_state,
    webs,
)


def test_a_removed_udp_endpoint_flushes_exactly_its_flows() -> None:
    nft, flows = FakeNftables(n.TABLE), FakeConntrack()
    state = state_with_node()
    state.apply(
        [
            upsert(dns("kube-system", "dns", "172.30.0.10")),
            upsert(dns_slice("kube-system", "dns", ["10.1.0.1", "10.1.0.2"])),
            upsert(dns("a", "other", "172.30.0.11")),  # the same pod serves another Service
            upsert(dns_slice("a", "other", ["10.1.0.1"])),
        ]
    )
    syncer = make(nft, flows)
    syncer.sync(state.snapshot())
    assert to(nft, "172.30.0.10", 53, UDP) == {"10.1.0.1:53", "10.1.0.2:53"}
    stale = flow("172.30.0.10", "10.1.0.1")
    kept = [
        flow("172.30.0.10", "10.1.0.2"),
        flow("172.30.0.11", "10.1.0.1"),  # the other Service still has the endpoint
        flow("172.30.0.10", "10.1.0.1", dport=54),  # not the Service's port
    ]
    flows.flows = [stale, *kept]

    changed = state.apply([upsert(dns_slice("kube-system", "dns", ["10.1.0.2"]))])
    result = syncer.sync(state.snapshot(), changed=changed)

    assert result.incremental
    assert to(nft, "172.30.0.10", 53, UDP) == {"10.1.0.2:53"}
    assert flows.deleted == [stale]
    assert flows.flows == kept
    assert result.conntrack_deleted == 1


@pytest.mark.parametrize("comes_back", [False, True])
def test_a_cleanup_that_ran_out_of_descriptors_is_finished_by_the_next_sync(
    comes_back: bool,
) -> None:
    """The flows of a removed UDP endpoint go at the next sync when the cleanup after the
    commit ran out of file descriptors, unless the endpoint serves the Service again by then
    (its new flows stay)."""
    nft, flows = FakeNftables(n.TABLE), FakeConntrack()
    state = state_with_node()
    state.apply(
        [
            upsert(dns("kube-system", "dns", "172.30.0.10")),
            upsert(dns_slice("kube-system", "dns", ["10.1.0.1", "10.1.0.2"])),
        ]
    )
    syncer = make(nft, flows)
    syncer.sync(state.snapshot())
    stale, kept = flow("172.30.0.10", "10.1.0.1"), flow("172.30.0.10", "10.1.0.2")
    flows.flows = [stale, kept]

    flows.fail_next = True
    changed = state.apply([upsert(dns_slice("kube-system", "dns", ["10.1.0.2"]))])
    with pytest.raises(ConntrackError, match="kept for the next cleanup"):
        syncer.sync(state.snapshot(), changed=changed)
    assert to(nft, "172.30.0.10", 53, UDP) == {"10.1.0.2:53"}  # committed
    assert flows.flows == [stale, kept]
    assert flows.pending

    ips = ["10.1.0.1", "10.1.0.2"] if comes_back else ["10.1.0.2"]
    changed = state.apply([upsert(dns_slice("kube-system", "dns", ips))])
    result = syncer.sync(state.snapshot(), changed=changed)

    assert not flows.pending
    assert flows.flows == ([stale, kept] if comes_back else [kept])
    assert result.conntrack_deleted == (0 if comes_back else 1)


LB = "192.0.2.50"


def lb(name: str, cip: str, ranges: Sequence[str], ep: str) -> tuple[Service, EndpointSlice]:
    svc = service(
        "default",
        name,
        cip,
        ports=[port("default", name)],
        load_balancer_ips=[LB],
        load_balancer_source_ranges=list(ranges),
    )
    return svc, eps_slice("default", name, [endpoint(ep)])


def world(*pairs: tuple[Service, EndpointSlice]) -> ClusterSnapshot:
    return snapshot([s for s, _ in pairs], [sl for _, sl in pairs], node=node())


def test_a_service_the_kernel_refuses_is_bisected_out_and_the_rest_programmed() -> None:
    nft = FakeNftables(n.TABLE)
    web = (
        service("default", "web", "172.30.0.20"),
        eps_slice("default", "web", [endpoint("10.1.0.3")]),
    )
    # Overlapping source ranges on one address and port: elements of the firewall's
    # concatenated interval set the kernel refuses (each is valid alone).
    a, b = (
        lb("lb-a", "172.30.0.10", ["10.0.0.0/8"], "10.1.0.1"),
        lb("lb-b", "172.30.0.11", ["10.1.0.0/16"], "10.1.0.2"),
    )
    syncer = make(nft)
    result = syncer.sync(world(a, b, web))

    assert set(result.excluded) == {ServiceKey(namespace="default", name="lb-b")}
    assert "firewall-allow" in result.excluded[ServiceKey(namespace="default", name="lb-b")]
    assert to(nft, "172.30.0.20", 80) == {"10.1.0.3:80"}
    assert to(nft, "172.30.0.10", 80) == {"10.1.0.1:80"}
    assert to(nft, "172.30.0.11", 80) == set()
    table = text(nft)
    assert "10.0.0.0/8" in table
    assert "10.1.0.0/16" not in table
    assert "default/lb-b" not in table


@pytest.mark.parametrize("record", [True, False], ids=["by-record", "by-read-back"])
def test_a_restart_sends_no_operations(record: bool) -> None:
    nft = FakeNftables(n.TABLE)
    first = make(nft, record=record)
    first.sync(webs())
    batches, before = len(nft.batches), text(nft)
    assert batches

    again = make(nft, record=record).sync(webs())

    assert again.total_ops == 0
    assert again.restarted is record  # the records vouch, or the read-back equals the plan
    assert len(nft.batches) == batches
    assert text(nft) == before


def test_a_trusted_restart_plans_in_the_next_sync_which_sends_only_the_change() -> None:
    """``plan_after_restart``: the first sync trusts the records and plans nothing; the next
    plans what they vouched for and sends only what changed since, as a syncer that never
    stopped would (the same table)."""
    state = web_state()
    nft, steady_nft = FakeNftables(n.TABLE), FakeNftables(n.TABLE)
    make(nft).sync(state.snapshot())
    steady = make(steady_nft)
    steady.sync(state.snapshot())
    batches = len(nft.batches)

    again = make(nft, plan_after_restart=True)
    first = again.sync(state.snapshot())
    assert first.restarted
    assert first.plan is None
    assert first.total_ops == 0
    assert len(nft.batches) == batches
    version = again.version
    assert again.repair_ops(Family.IP, again.read_back(Family.IP), version) is None  # no plan yet

    changed = state.apply([upsert(eps_slice("a", "web1", [endpoint("10.1.0.9")]))])
    second = again.sync(state.snapshot(), changed=changed)
    steady_result = steady.sync(state.snapshot(), changed=changed)
    assert second.plan is not None
    assert not second.incremental  # a full plan was made
    assert second.total_ops == steady_result.total_ops
    assert 0 < second.total_ops < 10
    assert to(nft, "172.30.0.2", 80) == {"10.1.0.9:80"}
    assert text(nft) == text(steady_nft)
    third = again.sync(state.snapshot(), changed=set())
    assert third.incremental
    assert third.total_ops == 0


def foreign(nft: FakeNftables, *ops: Operation) -> None:
    """Another process changes the table."""
    nft.open(Table(family=Family.IP, name=n.TABLE)).apply(list(ops))


def drop_web1(nft: FakeNftables) -> Element:
    rs = nft.ruleset(Family.IP)
    assert rs is not None
    el = next(e for e in rs.elements[n.SERVICE_IPS].values() if str(e.key[0]) == "172.30.0.2")
    foreign(nft, Operation(Verb.DELETE, el))
    return el


def test_drift_is_repaired_by_the_next_full_sync() -> None:
    nft, syncer = synced_once(webs())
    before = text(nft)
    drop_web1(nft)
    assert to(nft, "172.30.0.2", 80) == set()

    syncer.verify()
    result = syncer.sync(webs())

    assert result.total_ops == 1  # the element, back
    assert to(nft, "172.30.0.2", 80) == {"10.1.0.2:80"}
    assert text(nft) == before


@pytest.mark.parametrize("prepared", [False, True], ids=["in-the-sync", "prepared"])
def test_drift_found_off_the_loop_is_repaired(prepared: bool) -> None:
    snap = webs()
    nft, syncer = synced_once(snap)
    before = text(nft)
    gen = nft.generation()
    assert syncer.own_commits(gen - 2, gen)  # both families' batches were this syncer's
    drop_web1(nft)
    assert not syncer.own_commits(gen, nft.generation())

    version = syncer.version
    tables = {f: syncer.read_back(f) for f in (Family.IP, Family.IP6)}
    repairs = {f: syncer.repair_ops(f, rs, version) or [] for f, rs in tables.items()}
    assert [len(ops) for ops in repairs.values()] == [1, 0]

    ready = syncer.prepare_repair(tables, repairs, version) if prepared else None
    assert ready is not None or not prepared
    assert syncer.repair(tables, repairs, version, snap, ready) == 1
    assert to(nft, "172.30.0.2", 80) == {"10.1.0.2:80"}
    assert text(nft) == before
    after = syncer.sync(snap, changed=set())
    assert after.incremental
    assert after.total_ops == 0


async def test_the_loop_repairs_what_another_writer_changed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nft = FakeNftables(n.TABLE)
    synced = trio.Event()
    loop = fake_loop(state_with_node(), make(nft), lambda *_: synced.set())
    send, recv = trio.open_memory_channel[Sequence[Change]](10)
    await send.send(web_changes(1))
    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run, recv)
        before = text(nft)
        assert to(nft, "172.30.0.2", 80) == {"10.1.0.2:80"}
        drop_web1(nft)
        synced = trio.Event()
        loop.request_verify(Drift(pid=4242, comm="nft", objects=1))
        with trio.fail_after(600):
            await synced.wait()
        assert to(nft, "172.30.0.2", 80) == {"10.1.0.2:80"}
        assert text(nft) == before
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("path", ["incremental", "full"])
@pytest.mark.parametrize("flush_tcp", [False, True], ids=["default", "flush-tcp"])
def test_tcp_flows_of_a_removed_endpoint_go_only_with_flush_tcp(path: str, flush_tcp: bool) -> None:
    """A TCP connection to a removed endpoint is left to end on its own (its client gets a
    reset when the endpoint is gone); only ``--conntrack-flush-tcp`` deletes it. The UDP flows
    of the same removal go either way, so a cleanup did run."""
    nft, flows = FakeNftables(n.TABLE), FakeConntrack()
    state = state_with_node()
    svc = service(
        "a",
        "web",
        "172.30.0.20",
        ports=[port("a", "web", "http"), port("a", "web", "dns", 53, "UDP")],
    )
    both = (("http", 80, "TCP"), ("dns", 53, "UDP"))
    state.apply(
        [
            upsert(svc),
            upsert(eps_slice("a", "web", [endpoint("10.1.0.1"), endpoint("10.1.0.2")], ports=both)),
        ]
    )
    syncer = make(nft, flows, flush_tcp=flush_tcp)
    syncer.sync(state.snapshot())
    assert to(nft, "172.30.0.20", 80) == {"10.1.0.1:80", "10.1.0.2:80"}
    tcp_stale, udp_stale = flow("172.30.0.20", "10.1.0.1", TCP), flow("172.30.0.20", "10.1.0.1")
    kept = [flow("172.30.0.20", "10.1.0.2", TCP), flow("172.30.0.20", "10.1.0.2")]
    flows.flows = [tcp_stale, udp_stale, *kept]

    changed = state.apply([upsert(eps_slice("a", "web", [endpoint("10.1.0.2")], ports=both))])
    if path == "full":
        syncer.verify()  # the next sync compares whole tables
    result = syncer.sync(state.snapshot(), changed=changed)

    assert result.incremental is (path == "incremental")
    assert to(nft, "172.30.0.20", 80) == {"10.1.0.2:80"}
    assert flows.deleted == ([tcp_stale, udp_stale] if flush_tcp else [udp_stale])
    assert flows.flows == ([*kept] if flush_tcp else [tcp_stale, *kept])


def balanced_world() -> ClusterSnapshot:
    """Four consistent-hash and four round-robin Services of five endpoints each."""
    pairs = []
    for i in range(8):
        lb = LoadBalancing.CONSISTENT_HASH if i % 2 else LoadBalancing.ROUND_ROBIN
        svc = service("a", f"lb{i}", f"172.30.1.{i + 1}", load_balancing=lb)
        eps = [endpoint(f"10.2.{i}.{j + 1}") for j in range(5)]
        pairs.append((svc, eps_slice("a", f"lb{i}", eps)))
    return world(*pairs)


@pytest.mark.parametrize("record", [True, False], ids=["by-record", "by-read-back"])
def test_a_restart_keeps_the_balanced_tables_it_finds_programmed(record: bool) -> None:
    """With a per-sync quota of table elements (the daemon's), a first start builds one
    Service's tables a sync; a restart finds them all programmed and keeps them: no operation,
    nothing deferred, no Service planned with random choice meanwhile."""
    nft = FakeNftables(n.TABLE)
    first = make(nft, record=record, quota=1)  # one Service's tables a sync
    snap = balanced_world()
    syncs = [first.sync(snap)]
    while syncs[-1].deferred and len(syncs) < 20:
        syncs.append(first.sync(snap))
    assert len(syncs) == 8  # one Service's tables each
    before = text(nft)

    again = make(nft, record=record, quota=1)
    result = again.sync(snap)

    assert result.total_ops == 0
    assert result.deferred == set()
    assert result.restarted is record
    assert text(nft) == before
    assert again.sync(snap, changed=set()).total_ops == 0


def test_a_first_sync_under_a_quota_digests_its_snapshot_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The daemon's first sync (a quota of tables) asks the restart records before the quota
    is applied. The snapshot is digested once all the same: at a first start only for the
    record the commit writes (no record could vouch for anything), at a restart only for the
    check that then trusts the tables."""
    calls: list[object] = []
    digest = Fingerprint.digest

    def counted(self: Fingerprint, *args: object, **kw: object) -> str:
        calls.append(args)
        return digest(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Fingerprint, "digest", counted)
    nft = FakeNftables(n.TABLE)
    snap = balanced_world()
    cold = make(nft, quota=10**9).sync(snap)
    assert (cold.restarted, cold.deferred, len(calls)) == (False, set(), 1)
    assert cold.total_ops > 0

    calls.clear()
    again = make(nft, quota=10**9).sync(snap)
    assert (again.restarted, again.total_ops, len(calls)) == (True, 0, 1)

    calls.clear()
    changed = world(*[(service("a", "other", "172.30.9.9"), eps_slice("a", "other", []))])
    moved = make(nft, quota=10**9).sync(changed)
    assert not moved.restarted
    assert to(nft, "172.30.9.9", 80) == set()
    assert make(nft, quota=10**9).sync(changed).restarted, "its records were written"
