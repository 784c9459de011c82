"""The sync loop's schedule on trio's mock clock: the min sync period, coalescing, retries after a
failure, the verify timer and drift reports. The Syncer is a recorder (no kernel); each sync runs
on the event loop so the clock only moves when the loop waits."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import dataclass, field
from ipaddress import ip_network

import pytest
import structlog.testing
import trio
import trio.testing
from prometheus_client import CollectorRegistry

from nlproxy.cluster.model import Change, ClusterSnapshot, ServiceKey
from nlproxy.cluster.state import ClusterState
from nlproxy.daemon.memory import pause_gc
from nlproxy.errors import KernelError
from nlproxy.nft.monitor import Drift
from nlproxy.proxy.config import ProxyConfig
from nlproxy.serve.health import HealthState
from nlproxy.serve.metrics import Metrics
from nlproxy.sync.loop import SyncLoop
from nlproxy.sync.syncer import SyncResult
from tests.unit.builders import NODE, service, upsert

MIN = 1.0
PERIOD = 60.0
RETRY = 5.0
CONFIG = ProxyConfig(
    node_name=NODE,
    cluster_cidrs=(ip_network("10.0.0.0/8"),),
    service_cidrs=(ip_network("172.30.0.0/16"),),
)


@dataclass
class Call:
    at: float
    changed: set[ServiceKey] | None
    verified: bool  # the tables were read back before this sync


@dataclass
class RecordingSyncer:
    """What the loop needs of a Syncer; records when and with what it was asked."""

    config: ProxyConfig = CONFIG
    failed_family: None = None
    fail_next: int = 0
    defer: list[set[ServiceKey]] = field(default_factory=list)
    """What each of the next syncs reports as deferred (past the load-balancing quota)."""
    calls: list[Call] = field(default_factory=list)
    _verified: bool = False

    def verify(self) -> None:
        self._verified = True

    def sync(self, snapshot: ClusterSnapshot, *, changed: set[ServiceKey] | None) -> SyncResult:
        call = Call(trio.current_time(), changed, self._verified)
        self._verified = False
        self.calls.append(call)
        if self.fail_next:
            self.fail_next -= 1
            raise KernelError("chain services", "refused", errno=22)
        result = SyncResult(incremental=changed is not None)
        if self.defer:
            result.deferred = self.defer.pop(0)
        return result


@dataclass
class Harness:
    loop: SyncLoop
    syncer: RecordingSyncer
    send: trio.MemorySendChannel[Sequence[Change]]
    metrics: Metrics
    start: float


def svc(name: str) -> Change:
    """A Service of its own ClusterIP (two sharing one would change each other's claims)."""
    return upsert(service("ns", name, f"172.30.0.{1 + sum(map(ord, name)) % 250}"))


def key(name: str) -> ServiceKey:
    return ServiceKey(namespace="ns", name=name)


async def started(nursery: trio.Nursery, *, quiet: bool | None = None) -> Harness:
    syncer = RecordingSyncer()
    metrics = Metrics(CollectorRegistry())
    loop = SyncLoop(
        ClusterState(NODE),
        syncer,  # type: ignore[arg-type]
        health=HealthState(grace_seconds=120),
        metrics=metrics,
        min_interval=MIN,
        sync_period=PERIOD,
        retry_interval=RETRY,
        quiet=None if quiet is None else (lambda: quiet),
        in_thread=False,
    )
    send, recv = trio.open_memory_channel[Sequence[Change]](100)
    await send.send([svc("first")])  # as a source's initial list: the first sync runs at once
    start = trio.current_time()
    await nursery.start(loop.run, recv)
    assert [c.at for c in syncer.calls] == [start]
    return Harness(loop, syncer, send, metrics, start)


def verifies(metrics: Metrics, read_back: str) -> float:
    value = metrics.registry.get_sample_value("nlproxy_verifies_total", {"read_back": read_back})
    return value or 0.0


async def test_changes_within_the_min_period_are_coalesced_into_one_sync(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        h = await started(nursery)
        (first,) = h.syncer.calls  # the first sync: everything
        for name in ("a", "b", "c"):
            await h.send.send([svc(name)])
            await trio.sleep(0.1)
        await trio.sleep(5 * MIN)
        nursery.cancel_scope.cancel()
    later = h.syncer.calls[1:]
    assert len(later) == 1, later
    assert later[0].changed == {key("a"), key("b"), key("c")}
    assert later[0].at == pytest.approx(first.at + MIN)


async def test_a_change_after_a_quiet_spell_is_synced_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        h = await started(nursery)
        await trio.sleep(10 * MIN)
        sent = trio.current_time()
        await h.send.send([svc("a")])
        await trio.sleep(MIN / 2)
        nursery.cancel_scope.cancel()
    assert [c.at for c in h.syncer.calls[1:]] == [pytest.approx(sent)]


async def test_a_failed_sync_is_retried_after_the_retry_interval_and_reads_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        h = await started(nursery)
        await trio.sleep(10 * MIN)
        h.syncer.fail_next = 2
        failed_at = trio.current_time()
        await h.send.send([svc("a")])
        await trio.sleep(3 * RETRY)
        nursery.cancel_scope.cancel()
    retries = h.syncer.calls[1:]
    assert [c.at - failed_at for c in retries] == pytest.approx([0, RETRY, 2 * RETRY])
    # The changed service stays pending until a sync succeeds; a failure makes the next
    # sync read the kernel back first.
    assert all(c.changed == {key("a")} for c in retries)
    assert [c.verified for c in retries] == [False, True, True]
    assert h.metrics.registry.get_sample_value("nlproxy_sync_failures_total") == 2


async def test_the_verify_timer_reads_back_once_a_period_unless_quiet(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        h = await started(nursery)
        await trio.sleep(PERIOD / 2)
        await h.send.send([svc("a")])  # a change does not put the next verify off
        await trio.sleep(2.5 * PERIOD + 1)
        nursery.cancel_scope.cancel()
    change, *timed = h.syncer.calls[1:]
    assert (round(change.at - h.start), change.verified) == (30, False)
    assert [round(c.at - h.start) for c in timed] == [60, 120, 180]
    assert all(c.verified for c in timed)
    assert verifies(h.metrics, "true") == 3


async def test_a_quiet_verify_skips_the_read_back_but_a_drift_report_does_not(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        h = await started(nursery, quiet=True)
        await trio.sleep(PERIOD + 1)
        h.loop.request_verify(Drift(pid=4242, comm="nft", objects=1))
        await trio.sleep(MIN)
        nursery.cancel_scope.cancel()
    timed, drift = h.syncer.calls[1:]
    assert not timed.verified
    assert verifies(h.metrics, "false") == 1
    assert drift.verified
    assert drift.at == pytest.approx(timed.at + MIN)  # at once, within the min sync period
    assert verifies(h.metrics, "true") == 1


@pytest.mark.parametrize("first_fails", [False, True])
async def test_the_gc_paused_for_a_cold_start_runs_again_after_the_first_sync(
    autojump_clock: trio.testing.MockClock, first_fails: bool
) -> None:
    syncer = RecordingSyncer(fail_next=int(first_fails))
    loop = SyncLoop(
        ClusterState(NODE),
        syncer,  # type: ignore[arg-type]
        health=HealthState(grace_seconds=120),
        metrics=Metrics(CollectorRegistry()),
        min_interval=MIN,
        sync_period=PERIOD,
        retry_interval=RETRY,
        in_thread=False,
    )
    send, recv = trio.open_memory_channel[Sequence[Change]](100)
    assert gc.isenabled()
    loop.resume_gc = pause_gc()
    try:
        assert not gc.isenabled()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(loop.run, recv)
            await trio.sleep(MIN / 2)
            assert not gc.isenabled()  # no sync yet: still paused
            await send.send([svc("first")])
            await trio.sleep(MIN / 2)
            assert len(syncer.calls) == 1
            assert gc.isenabled()
            nursery.cancel_scope.cancel()
    finally:
        gc.enable()


async def test_the_sync_line_splits_the_time_and_names_a_read_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``sync.applied`` says where a sync's time went, and how long a read-back verify took."""
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            h = await started(nursery)
            h.loop.request_verify(Drift(pid=4242, comm="nft", objects=1))
            await trio.sleep(MIN * 2)
            nursery.cancel_scope.cancel()
    first, verified = [e for e in logs if e["event"] == "sync.applied"]
    for line in (first, verified):
        assert {"plan_ms", "diff_ms", "commit_ms", "incremental", "duration_ms"} <= line.keys()
    assert "readback_ms" not in first
    assert verified["verify"] is True
    assert verified["readback_ms"] >= 0


async def test_deferred_tables_get_the_next_sync_with_other_changes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A sync that left tables for later is followed by another after the min period, with no
    new event: the deferred Services are in its changed set, beside changes that came since."""
    async with trio.open_nursery() as nursery:
        h = await started(nursery)
        h.syncer.defer = [{key("big1"), key("big2")}, {key("big2")}]
        await h.send.send([svc("a")])
        await trio.sleep(1.5 * MIN)
        await h.send.send([svc("b")])  # arrives while the deferred work waits its turn
        await trio.sleep(10 * MIN)
        nursery.cancel_scope.cancel()
    later = h.syncer.calls[1:]
    assert [c.changed for c in later] == [
        {key("a")},
        {key("big1"), key("big2"), key("b")},
        {key("big2")},
    ]
    assert [c.at - h.start for c in later] == pytest.approx([MIN, 2 * MIN, 3 * MIN])
