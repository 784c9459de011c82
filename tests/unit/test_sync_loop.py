"""The sync loop's schedule on trio's mock clock: the min sync period, coalescing, retries after a
failure, the verify timer and drift reports. The Syncer is a recorder (no kernel); each sync runs
on the event loop so the clock only moves when the loop waits, and the verifier's read-backs and
comparisons take the (mock) time the test gives them."""

from __future__ import annotations

import errno
import gc
import itertools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from ipaddress import ip_network
from typing import Any

import pytest
import structlog.testing
import trio
import trio.testing
from prometheus_client import CollectorRegistry

from nlproxy.cluster.model import Change, ClusterSnapshot, Delete, ObjectRef, ServiceKey
from nlproxy.cluster.state import ClusterState
from nlproxy.errors import KernelError
from nlproxy.nft.ir import Family
from nlproxy.nft.monitor import Drift
from nlproxy.proxy.config import ProxyConfig
from nlproxy.serve.health import HealthState
from nlproxy.serve.metrics import Metrics
from nlproxy.sync.loop import (
    RACES_BEFORE_WAITING,
    RELEASE_INTERVAL,
    RESTART_VERIFY_DELAY,
    SyncLoop,
)
from nlproxy.sync.syncer import SyncResult
from nlproxy.sync.verify import Repair
from tests.unit.builders import NODE, endpoint, eps_slice, service, upsert

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
class Chores:
    """The Syncer's flow cleanup as the loop sees it: whether it owes the next sync work
    (filters waiting for a resource, a start-up sweep not done)."""

    owed: bool = False


@dataclass
class RecordingSyncer:
    """What the loop needs of a Syncer; records when and with what it was asked.

    Its kernel holds the number of the last plan committed; ``tamper()`` is another writer. A
    read-back returns what the kernel held when it began; a comparison looks at the plan when it
    ends, as the real ones may.
    """

    config: ProxyConfig = CONFIG
    failed_family: None = None
    fail_next: int = 0
    defer: list[set[ServiceKey]] = field(default_factory=list)
    """What each of the next syncs reports as deferred (past the load-balancing quota)."""
    restarted: bool = False  # the first sync is a restart the records vouched for
    own: bool = True  # what own_commits() answers
    failure: Exception = field(
        default_factory=lambda: KernelError("chain services", "refused", errno=22)
    )
    cleanup: Chores = field(default_factory=Chores)
    calls: list[Call] = field(default_factory=list)
    read_backs: list[float] = field(default_factory=list)
    taken: list[float] = field(default_factory=list)
    prepared: list[float] = field(default_factory=list)  # when repairs were prepared
    version: int = 0
    planned: int = 0
    kernel: int = 0
    settled: int = 0  # how often the programmed state was given its own maps
    _verified: bool = False

    def settle(self) -> None:
        self.settled += 1

    def verify(self) -> None:
        self._verified = True
        self.read_backs.append(trio.current_time())

    def sync(self, snapshot: ClusterSnapshot, *, changed: set[ServiceKey] | None) -> SyncResult:
        self.version += 2  # the loop never sees one in progress: it runs on the loop
        call = Call(trio.current_time(), changed, self._verified)
        self._verified = False
        self.calls.append(call)
        if self.fail_next:
            self.fail_next -= 1
            raise self.failure
        self.planned += 1
        self.kernel = self.planned
        result = SyncResult(
            incremental=changed is not None, restarted=self.restarted and len(self.calls) == 1
        )
        if self.defer:
            result.deferred = self.defer.pop(0)
        return result

    def tamper(self) -> None:
        self.kernel = -1

    def read_back(self, family: Family) -> int:
        if family is Family.IP:
            self.read_backs.append(trio.current_time())
        return self.kernel

    def repair_ops(self, family: Family, have: int, version: int) -> list[str] | None:
        if version != self.version:
            return None
        return ["repair"] if have != self.planned else []

    def prepare_repair(
        self, tables: dict[Family, int], repairs: dict[Family, list[str]], version: int
    ) -> Repair | None:
        if version != self.version:
            return None
        self.prepared.append(trio.current_time())
        return Repair(tables, repairs, version, None)  # type: ignore[arg-type]

    def repair(
        self,
        tables: dict[Family, int],
        repairs: dict[Family, list[str]],
        version: int,
        snapshot: ClusterSnapshot,
        prepared: Repair | None = None,
    ) -> int | None:
        assert prepared is not None, "the loop prepares it"
        assert prepared.version == version
        if version != self.version:
            return None
        self.taken.append(trio.current_time())
        self._verified = True  # the next sync call is the one after a repair
        self.kernel = self.planned
        return sum(len(ops) for ops in repairs.values())

    def retry_left_out(self) -> None:
        pass

    def own_commits(self, after: int, upto: int) -> bool:
        return self.own


COSTS = {"read_back": 0.0, "repair_ops": 0.0, "prepare_repair": 0.0}


async def runner(fn: Callable[..., object], *args: object) -> object:
    """The verifier's blocking calls, taking ``COSTS`` seconds of mock time each: a read-back
    sees the kernel when it begins, a comparison the plan when it ends."""
    cost = COSTS.get(getattr(fn, "__name__", ""), 0.0)
    if getattr(fn, "__name__", "") in ("repair_ops", "prepare_repair"):
        await trio.sleep(cost)
        return fn(*args)
    out = fn(*args)
    await trio.sleep(cost)
    return out


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


def loop_for(syncer: RecordingSyncer, metrics: Metrics | None = None, **kw: Any) -> SyncLoop:
    """A loop on the mock clock's terms (syncs on the loop itself) around ``syncer``."""
    return SyncLoop(
        ClusterState(NODE),
        syncer,  # type: ignore[arg-type]
        health=HealthState(grace_seconds=120),
        metrics=metrics or Metrics(CollectorRegistry()),
        min_interval=MIN,
        sync_period=PERIOD,
        retry_interval=RETRY,
        in_thread=False,
        **kw,
    )


Send = trio.MemorySendChannel[Sequence[Change]]
Receive = trio.MemoryReceiveChannel[Sequence[Change]]


def asking(answers: Callable[[], bool] = lambda: True) -> tuple[Callable[[], bool], list[float]]:
    """A ``quiet`` that notes when it is asked (the list) and answers ``answers()``."""
    asked: list[float] = []

    def quiet() -> bool:
        asked.append(trio.current_time())
        return answers()

    return quiet, asked


async def ready(
    syncer: RecordingSyncer, **kw: Any
) -> tuple[
    SyncLoop, trio.MemorySendChannel[Sequence[Change]], trio.MemoryReceiveChannel[Sequence[Change]]
]:
    """``loop_for(syncer, runner=runner, **kw)``, the source's initial list sent (the first
    sync runs at once)."""
    loop = loop_for(syncer, runner=runner, **kw)
    send, recv = trio.open_memory_channel[Sequence[Change]](100)
    await send.send([svc("first")])
    return loop, send, recv


async def started(
    nursery: trio.Nursery,
    *,
    quiet: bool | None = None,
    syncer: RecordingSyncer | None = None,
    run: Callable[..., Awaitable[object]] = runner,
) -> Harness:
    syncer = syncer or RecordingSyncer()
    metrics = Metrics(CollectorRegistry())
    loop = loop_for(syncer, metrics, quiet=None if quiet is None else (lambda: quiet), runner=run)
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


async def test_running_out_of_descriptors_is_a_failed_sync_tried_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """EMFILE opening a netlink socket (an OSError, not an nlproxy error) does not end the
    loop (and the daemon, with its table perhaps deleted): retried, read back, then synced."""
    async with trio.open_nursery() as nursery:
        h = await started(nursery)
        h.syncer.fail_next = 1
        h.syncer.failure = OSError(errno.EMFILE, "Too many open files")
        await h.send.send([svc("a")])
        await trio.sleep(3 * RETRY)
        nursery.cancel_scope.cancel()
    assert [c.verified for c in h.syncer.calls[1:]] == [False, True]
    assert h.metrics.registry.get_sample_value("nlproxy_sync_failures_total") == 1


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
    assert [round(t - h.start) for t in h.syncer.read_backs] == [60, 120, 180]
    assert not any(c.verified for c in timed)  # the kernel held the plan: nothing to repair
    assert h.syncer.taken == []
    assert verifies(h.metrics, "true") == 3


async def test_a_quiet_verify_skips_the_read_back_but_a_drift_report_does_not(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        h = await started(nursery, quiet=True)
        await trio.sleep(PERIOD + 1)
        h.syncer.tamper()
        reported = trio.current_time()
        h.loop.request_verify(Drift(pid=4242, comm="nft", objects=1))
        await trio.sleep(MIN)
        nursery.cancel_scope.cancel()
    # The quiet verify at PERIOD neither read back nor planned: nothing had changed.
    (repair,) = h.syncer.calls[1:]
    assert verifies(h.metrics, "false") == 1
    assert h.syncer.read_backs == [reported]
    assert repair.verified  # it started from the read-back, which differed
    assert repair.at == pytest.approx(reported)  # at once: no sync within the min period
    assert verifies(h.metrics, "true") == 1


async def test_a_quiet_verify_of_an_unchanged_state_plans_nothing_a_change_or_chore_does(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Nothing changed since the last sync and no one else committed: nothing can differ from
    the plan, so the periodic verify plans nothing. A change since the last sync, or flows a
    cleanup left for want of a resource, make it a sync as before."""
    async with trio.open_nursery() as nursery:
        h = await started(nursery, quiet=True)
        h.syncer.cleanup.owed = True  # the first sync's cleanup ran out of descriptors
        await trio.sleep(PERIOD + 1)
        assert [round(c.at - h.start) for c in h.syncer.calls[1:]] == [60]  # a sync
        h.syncer.cleanup.owed = False
        await trio.sleep(PERIOD)  # at 120: idle
        assert len(h.syncer.calls) == 2
        assert verifies(h.metrics, "false") == 2  # the sync's and the idle one's
        await h.send.send([svc("a")])
        await trio.sleep(PERIOD)
        assert [round(c.at - h.start) for c in h.syncer.calls[2:]] == [121]
        nursery.cancel_scope.cancel()
    assert h.syncer.read_backs == []


async def test_an_idle_loop_rests_until_something_happens(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """After one periodic verify of an idle, quiet node the loop waits with no timer: no more
    verifies (nor questions to the watch) however long nothing happens. A change is synced at
    once, and the periods run again from there."""
    syncer = RecordingSyncer()
    quiet, asked = asking()
    loop, send, recv = await ready(syncer, quiet=quiet)
    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run, recv)
        start = trio.current_time()
        await trio.sleep(10 * PERIOD)
        assert [round(t - start) for t in asked] == [PERIOD]
        assert verifies(loop.report.metrics, "false") == 1
        await send.send([svc("a")])
        await trio.sleep(2 * PERIOD + 1)
        nursery.cancel_scope.cancel()
    assert [round(c.at - start) for c in syncer.calls[1:]] == [10 * PERIOD]
    # The rest vouched for the periods until the change; the next verify is a period after
    # it, and rests again.
    assert [round(t - start) for t in asked] == [PERIOD, 11 * PERIOD]
    assert syncer.read_backs == []


async def test_a_change_taken_by_a_failed_sync_brings_no_second_early_try(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """While syncs fail, a change brings a try at the min sync period; one that came while
    the loop waited out that period is in that try, so when it fails too the next comes
    after the retry interval (before, the change's leftover wake-up made one more at once)."""
    async with trio.open_nursery() as nursery:
        h = await started(nursery, quiet=True)
        await trio.sleep(10.0)
        h.syncer.fail_next = 1000
        await h.send.send([svc("a")])  # tried at 10, fails
        await trio.sleep(0.5)
        await h.send.send([svc("b")])  # brings a try at 11 (the min sync period after 10)
        await trio.sleep(0.2)
        await h.send.send([svc("c")])  # while the loop waits for 11: in that try
        await trio.sleep(2 * RETRY + 1)
        nursery.cancel_scope.cancel()
    tries = [round(c.at - h.start, 1) for c in h.syncer.calls[1:]]
    assert tries == [10.0, 11.0, 11.0 + RETRY, 11.0 + 2 * RETRY], tries


async def test_a_resting_loop_whose_read_back_keeps_failing_verifies_each_period_again(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drift's read-back that fails (``ENOBUFS``, say) is tried again every retry interval;
    the loop, resting when it came, goes back to a verify every period meanwhile rather than
    resting on with nothing to vouch for it."""
    syncer = RecordingSyncer()
    quiet, asked = asking()
    loop, _send, recv = await ready(syncer, quiet=quiet)

    def failing(family: Family) -> int:
        raise OSError(errno.ENOBUFS, "No buffer space available")

    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run, recv)
        start = trio.current_time()
        await trio.sleep(2 * PERIOD)  # resting since the verify at 60
        monkeypatch.setattr(syncer, "read_back", failing)
        loop.request_verify(Drift(pid=4242, comm="nft", objects=1))
        await trio.sleep(3 * PERIOD + 1)
        nursery.cancel_scope.cancel()
    assert [round(t - start) for t in asked] == [PERIOD, 3 * PERIOD, 4 * PERIOD, 5 * PERIOD]


async def test_a_service_deleted_after_a_rest_is_not_taken_for_orphaning_its_slice(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A Service deleted on a node that rested, its slice removed a moment later (the garbage
    collector's): the slice is an orphan only if a verify a period later still finds it, as
    on a node that never rested."""
    syncer = RecordingSyncer()
    loop = loop_for(syncer, quiet=lambda: True, runner=runner)
    send, recv = trio.open_memory_channel[Sequence[Change]](100)
    await send.send([svc("web"), upsert(eps_slice("ns", "web", [endpoint("10.1.0.5")]))])
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(loop.run, recv)
            await trio.sleep(3.3 * PERIOD)  # rests after the verify at 60
            await send.send([delete("Service", "web")])
            await trio.sleep(0.5)
            await send.send([delete("EndpointSlice", "web-v4")])
            await trio.sleep(2 * PERIOD)
            nursery.cancel_scope.cancel()
    assert [e for e in logs if e["event"] == "object.invalid"] == []
    invalid = loop.report.metrics.registry.get_sample_value("nlproxy_invalid_objects")
    assert invalid == 0


def delete(kind: str, name: str) -> Change:
    return Delete(ref=ObjectRef(kind=kind, namespace="ns", name=name))


async def test_a_resting_loop_does_not_vouch_for_a_change_waiting_or_a_read_back_under_way(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``vouch()`` between a change's arrival and the loop taking it (both on the event loop)
    keeps the change waiting for ``/healthz``; nor does it vouch while a drift's read-back is
    under way. A read-back that finds nothing wakes the loop all the same: the services left
    out are tried at the next periodic verify."""
    monkeypatch.setitem(COSTS, "read_back", 5.0)
    syncer = RecordingSyncer()
    loop, _send, recv = await ready(syncer, quiet=lambda: True)
    health = loop.report.health
    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run, recv)
        start = trio.current_time()
        await trio.sleep(2 * PERIOD)  # resting since the verify at 60
        loop.apply_changes([svc("a")])  # as the source's task hands a change over
        loop.vouch()  # a probe answered before the loop runs
        assert health.oldest_pending is not None
        await trio.sleep(MIN)
        assert health.oldest_pending is None  # synced
        await trio.sleep(2 * PERIOD)  # rests again after the verify at 180
        rested = health.last_updated
        loop.request_verify(Drift(pid=4242, comm="nft", objects=1))  # nothing differs
        await trio.sleep(1.0)
        loop.vouch()  # the read-back takes 5 s per family
        assert health.last_updated == rested
        await trio.sleep(PERIOD + 11)
        nursery.cancel_scope.cancel()
    assert [round(t - start) for t in syncer.read_backs] == [4 * PERIOD + 1]
    # Woken by the read-back's end (10 s later), the loop's next verify is a sync that lets
    # the services left out back in, a period after that wake.
    assert [round(c.at - start) for c in syncer.calls[1:]] == [2 * PERIOD, 5 * PERIOD + 11]


async def test_a_quiet_verify_keeps_health_and_the_last_sync_metric_current(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An idle verify that plans nothing still says the rules are current: ``/healthz``'s
    last update and the last-sync timestamp move as a sync's would."""
    async with trio.open_nursery() as nursery:
        h = await started(nursery, quiet=True)
        health = h.loop.report.health
        first = health.last_updated
        await trio.sleep(PERIOD + 1)
        nursery.cancel_scope.cancel()
    assert len(h.syncer.calls) == 1
    assert first is not None
    assert health.last_updated is not None
    assert round(health.last_updated - first) == PERIOD


async def test_a_resting_loop_vouches_when_asked_or_reads_back_if_someone_committed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The idle node rests after its first verify. Asked (``/healthz``, ``/metrics``), it
    vouches: the last update moves to now (and the last-sync metric, as at a verify),
    nothing is planned. Once
    the generation moved by another's commit that the watch has not reported yet (no longer
    quiet), the next ask reads the tables back and the loop repairs what it finds."""
    quiet = [True]
    syncer = RecordingSyncer()
    loop, _send, recv = await ready(syncer, quiet=lambda: quiet[0])
    health = loop.report.health
    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run, recv)
        start = trio.current_time()
        await trio.sleep(3 * PERIOD)
        assert health.last_updated is not None
        assert round(health.last_updated - start) == PERIOD  # the verify before the rest
        loop.vouch()
        assert round(health.last_updated - start) == 3 * PERIOD
        assert syncer.read_backs == []
        syncer.tamper()
        quiet[0] = False
        await trio.sleep(PERIOD / 2)
        loop.vouch()
        assert round(health.last_updated - start) == 3 * PERIOD  # not vouched for
        await trio.sleep(MIN)
        nursery.cancel_scope.cancel()
    assert [round(t - start) for t in syncer.read_backs] == [3.5 * PERIOD]
    assert verifies(loop.report.metrics, "false") == 1
    assert verifies(loop.report.metrics, "true") == 1
    # Nothing changed to plan: the read-back, then only the repair of what it found.
    (repair,) = syncer.calls[1:]
    assert repair.verified
    assert [round(t - start) for t in syncer.taken] == [3.5 * PERIOD]
    assert syncer.kernel == syncer.planned


async def test_a_verify_asks_whether_it_is_quiet_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``quiet()`` takes the moves it saw from the drift watch (which would report them
    again): each verify asks once, changed state or not, and reads back when it was not."""
    answers = iter([False, False])
    syncer = RecordingSyncer()
    quiet, asked = asking(lambda: next(answers))
    loop, send, recv = await ready(syncer, quiet=quiet)
    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run, recv)
        start = trio.current_time()
        await trio.sleep(PERIOD + 1)  # an unchanged state's verify
        await send.send([svc("a")])
        await trio.sleep(PERIOD)  # a verify with a change made since
        nursery.cancel_scope.cancel()
    assert [round(t - start) for t in asked] == [PERIOD, 2 * PERIOD]
    assert [round(t - start) for t in syncer.read_backs] == [PERIOD, 2 * PERIOD]


async def test_a_change_during_a_read_back_is_synced_within_the_min_period(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verify reads back for 4 s; the change does not wait for it, and the comparison the
    change's commit overlapped is done again rather than taken for a drift."""
    monkeypatch.setitem(COSTS, "read_back", 4.0)
    monkeypatch.setitem(COSTS, "repair_ops", 1.0)
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            h = await started(nursery)
            await trio.sleep(10 * MIN)
            began = trio.current_time()
            h.loop.request_verify(Drift(pid=4242, comm="nft", objects=1))
            await trio.sleep(1.0)
            sent = trio.current_time()
            await h.send.send([svc("a")])
            await trio.sleep(30.0)
            nursery.cancel_scope.cancel()
    change, *rest = h.syncer.calls[1:]
    assert change.changed == {key("a")}
    assert change.at == pytest.approx(sent)  # no sync for MIN before: at once
    assert rest == []  # no repair: the kernel held the plan
    assert h.syncer.taken == []
    events = [e["event"] for e in logs if e["event"].startswith("verify.")]
    assert events == ["verify.raced", "verify.read_back"]
    assert [round(t - began) for t in h.syncer.read_backs] == [0, 5]  # again after 4 + 1 s


async def test_a_repair_is_prepared_off_the_loop_and_a_change_meanwhile_voids_it(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Preparing a drift's repair takes 2 s (passes over whole tables): a change written
    meanwhile is synced at once, and the repair prepared before it is read back again."""
    monkeypatch.setitem(COSTS, "read_back", 1.0)
    monkeypatch.setitem(COSTS, "prepare_repair", 2.0)
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            h = await started(nursery)
            await trio.sleep(10 * MIN)
            h.syncer.tamper()
            began = trio.current_time()
            h.loop.request_verify(Drift(pid=4242, comm="nft", objects=1))
            await trio.sleep(2.5)  # read back (1 s a family), compared, preparing (2 s)
            sent = trio.current_time()
            await h.send.send([svc("a")])
            await trio.sleep(MIN)
            h.syncer.tamper()  # the fake's commit put its kernel right: drift again
            await trio.sleep(30.0)
            nursery.cancel_scope.cancel()
    change, repair = h.syncer.calls[1:]
    assert change.changed == {key("a")}
    assert change.at == pytest.approx(sent)  # not held up by the preparation
    assert [round(t - began) for t in h.syncer.read_backs] == [0, 4]
    assert [round(t - began) for t in h.syncer.prepared] == [8]  # the second one only
    assert repair.verified
    assert [round(t - began) for t in h.syncer.taken] == [8]
    stages = [e.get("stage") for e in logs if e["event"] == "verify.raced"]
    assert stages == ["prepare"]


async def test_a_drift_found_while_a_sync_ran_is_read_back_again_before_any_repair(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(COSTS, "read_back", 4.0)
    async with trio.open_nursery() as nursery:
        h = await started(nursery)
        await trio.sleep(10 * MIN)
        h.syncer.tamper()  # another writer ...
        h.loop.request_verify(Drift(pid=4242, comm="nft", objects=1))
        await trio.sleep(1.0)
        await h.send.send([svc("a")])  # ... whose change our next commit overwrites
        await trio.sleep(30.0)
        nursery.cancel_scope.cancel()
    assert len(h.syncer.calls) == 2  # the change; no repair of what it already put right
    assert len(h.syncer.read_backs) == 2


async def test_lost_notifications_of_own_commits_read_nothing_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        h = await started(nursery)
        h.loop.request_verify(Drift(0, "(notifications lost)", 0, lost=(10, 12)))
        await trio.sleep(MIN)
        assert h.syncer.read_backs == []
        h.syncer.own = False  # someone else's commit may be among them
        h.loop.request_verify(Drift(0, "(notifications lost)", 0, lost=(12, 14)))
        await trio.sleep(MIN)
        nursery.cancel_scope.cancel()
    assert len(h.syncer.read_backs) == 1
    assert len(h.syncer.calls) == 1  # and no sync: the read-back found nothing to repair


async def test_a_restart_the_records_vouched_for_is_verified_later(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        h = await started(nursery, syncer=RecordingSyncer(restarted=True))
        await trio.sleep(PERIOD / 2)
        nursery.cancel_scope.cancel()
    assert [round(t - h.start) for t in h.syncer.read_backs] == [RESTART_VERIFY_DELAY]


async def test_a_restart_trusted_before_planning_is_planned_by_the_next_sync_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The first sync of a restart the records vouch for has no plan (``plan_after_restart``):
    a sync follows within the min period to make it, and the GC paused for the start-up's
    objects stays paused until that sync has planned them."""
    syncer = RecordingSyncer(restarted=True)
    async with trio.open_nursery() as nursery:
        h = await started(nursery, syncer=syncer)
        h.loop.hold_collection()  # as the daemon does for its cold start
        try:
            await trio.sleep(MIN / 2)
            assert not gc.isenabled()  # the plan is still to be made
            await trio.sleep(PERIOD / 4)
            assert gc.isenabled()
        finally:
            gc.enable()
        nursery.cancel_scope.cancel()
    first, plans = syncer.calls[0], syncer.calls[1:]
    assert [round(c.at - first.at, 3) for c in plans] == [MIN]
    assert plans[0].changed == set()


@pytest.mark.parametrize("first_fails", [False, True])
async def test_the_gc_paused_for_a_cold_start_runs_again_after_the_first_sync(
    autojump_clock: trio.testing.MockClock, first_fails: bool
) -> None:
    syncer = RecordingSyncer(fail_next=int(first_fails))
    loop = loop_for(syncer)
    send, recv = trio.open_memory_channel[Sequence[Change]](100)
    assert gc.isenabled()
    loop.hold_collection()
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


async def test_the_sync_line_splits_the_time_and_the_verify_line_the_read_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``sync.applied`` says where a sync's time went; ``verify.read_back`` how long the
    read-back and the comparison took, and whether they found a drift."""
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            h = await started(nursery)
            h.syncer.tamper()
            h.loop.request_verify(Drift(pid=4242, comm="nft", objects=1))
            await trio.sleep(MIN * 2)
            nursery.cancel_scope.cancel()
    first, repair = [e for e in logs if e["event"] == "sync.applied"]
    for line in (first, repair):
        assert {"plan_ms", "diff_ms", "commit_ms", "incremental", "duration_ms"} <= line.keys()
        assert "readback_ms" not in line
    assert repair["verify"] is True
    [verify] = [e for e in logs if e["event"] == "verify.read_back"]
    assert verify["drift"] is True
    assert verify["readback_ms"] >= 0
    assert verify["compare_ms"] >= 0


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


async def test_a_stream_of_changes_cannot_put_a_drift_repair_off_for_ever(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every read-back is overlapped by a sync; after ``RACES_BEFORE_WAITING`` of them in a
    row a sync reads back itself, and repairs."""
    monkeypatch.setitem(COSTS, "read_back", 4.0)
    async with trio.open_nursery() as nursery:
        h = await started(nursery)
        await trio.sleep(10 * MIN)
        h.syncer.tamper()
        h.loop.request_verify(Drift(pid=4242, comm="nft", objects=1))
        for n in range(30):
            await h.send.send([svc(f"s{n}")])
            await trio.sleep(MIN)
        nursery.cancel_scope.cancel()
    repairs = [c for c in h.syncer.calls if c.verified]
    assert len(repairs) == 1
    assert len(h.syncer.read_backs) == RACES_BEFORE_WAITING + 1  # the last by the sync itself


def releasing(
    syncer: RecordingSyncer, **kw: Any
) -> tuple[
    SyncLoop,
    list[float],
    trio.MemoryReceiveChannel[Sequence[Change]],
    trio.MemorySendChannel[Sequence[Change]],
]:
    """A loop whose memory releases are noted (their times), and the channel to feed it."""
    releases: list[float] = []
    loop = loop_for(syncer, release_memory=lambda: releases.append(trio.current_time()), **kw)
    send, recv = trio.open_memory_channel[Sequence[Change]](100)
    return loop, releases, recv, send


@pytest.mark.parametrize("full", [False, True], ids=["incremental", "full"])
async def test_the_memory_release_handed_in_runs_after_full_syncs_and_after_work(
    autojump_clock: trio.testing.MockClock, full: bool
) -> None:
    """The daemon hands the loop its ``release`` (sync/ does not import daemon/): after a full
    sync (a snapshot filter makes every sync one), not after an incremental one, and
    ``RELEASE_INTERVAL`` after changes and syncs; an idle loop releases nothing (it is not
    woken for it)."""
    syncer = RecordingSyncer()
    loop, releases, recv, send = releasing(
        syncer, snapshot_filter=(lambda snapshot: snapshot) if full else None
    )
    await send.send([svc("first")])
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run, recv)
        assert [c.changed for c in syncer.calls] == [None if full else {key("first")}]
        await trio.sleep(RELEASE_INTERVAL * 3)
        await send.send([svc("second")])
        await trio.sleep(RELEASE_INTERVAL * 3)
        nursery.cancel_scope.cancel()
    # Each change's sync follows it at once: one release RELEASE_INTERVAL later covers both;
    # a full sync releases as it ends too. Nothing between 10 and 30 s: the loop was idle.
    after_work = [RELEASE_INTERVAL, RELEASE_INTERVAL * 4]
    at_full = [0.0, RELEASE_INTERVAL * 3] if full else []
    assert [round(t - start, 1) for t in releases] == sorted(after_work + at_full)
    # A full sync's programmed state is settled once it is reported, off the next sync's path.
    assert syncer.settled == (2 if full else 0)  # one per full sync


async def test_what_a_read_back_frees_goes_back_after_it_ends(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-back that is still running when the release after the work before it comes: what
    it frees goes back ``RELEASE_INTERVAL`` after it ends, not at the next work (an idle node's
    may be minutes away)."""
    monkeypatch.setitem(COSTS, "read_back", 5.0)
    syncer = RecordingSyncer(own=False)
    loop, releases, recv, send = releasing(syncer, quiet=lambda: True, runner=runner)
    await send.send([svc("first")])
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run, recv)
        await trio.sleep(8.0)
        loop.request_verify(Drift(0, "(generation moved)", 0, lost=(1, 2)))
        await trio.sleep(RELEASE_INTERVAL * 6)
        nursery.cancel_scope.cancel()
    [read_back] = [round(t - start, 1) for t in syncer.read_backs]
    assert read_back == 8.0
    released = [round(t - start, 1) for t in releases]
    assert released[0] == RELEASE_INTERVAL  # the first sync's
    # The read-back of both families ran from 8 to 18 s: the release at 10 s came during it,
    # the next one RELEASE_INTERVAL after it ended.
    ended = read_back + 2 * 5.0
    assert released[1:] == [ended + RELEASE_INTERVAL]


async def test_syncs_failing_past_the_period_keep_the_retry_pace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A sync that keeps failing is tried again every ``retry_interval``, also once the
    period's verify is long due (before, each try then came at the min sync period, a
    read-back each)."""
    async with trio.open_nursery() as nursery:
        h = await started(nursery, quiet=True)
        await trio.sleep(PERIOD / 2)
        h.syncer.fail_next = 1000
        await h.send.send([svc("changed")])
        await trio.sleep(2 * PERIOD)
        nursery.cancel_scope.cancel()
    tries = [round(c.at - h.start) for c in h.syncer.calls[1:]]
    assert tries[0] == PERIOD / 2
    assert all(b - a == RETRY for a, b in itertools.pairwise(tries)), str(tries)
    assert tries[-1] >= 2 * PERIOD  # still trying
