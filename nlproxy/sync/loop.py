"""The sync loop: coalesce changes, sync at a bounded rate, verify periodically, repair drift.

Like kube-proxy's bounded-frequency runner: a change is synced as soon as ``min_interval`` has
passed since the last sync (changes arriving meanwhile are coalesced into one sync), a failed sync
is retried after ``retry_interval``, and every ``sync_period`` the programmed state is read back
from the kernel and compared with the plan (full verify). The blocking part of a sync (planning
and netlink I/O) runs in a worker thread.

A verify never holds a sync up: a task of its own reads the tables back and compares them with
the plan in worker threads, one family at a time, while syncs go on. The Syncer's version moves
with every sync, so a comparison a sync overlapped is void and done again, never taken for a
drift. Only a read-back that differs is handed to the next sync, which repairs the difference;
what the repair needs from whole tables (the frontends whose flows it cleans up) is prepared
there too, so that sync holds no change up for long.
A drift report starts such a verify at once; lost notifications do only when the generations
they may belong to are not all nlproxy's own commits (a large cold start overflows the
monitor's socket with its own). After a failed sync the next one reads back first, itself.

An idle node's loop rests: once a periodic verify finds nothing changed since the last sync and
no one else committed (``quiet``), the next ones could only find the same, so the loop waits
with no timer until something happens (a change, the watch's report of another writer's
commit, a read-back, new settings), and the event loop does not wake on its account. What those
verifies told the outside (``/healthz``'s last update, the last-sync metric) is told when it is
asked for (:meth:`SyncLoop.vouch`).

The loop schedules and hands work to threads; what it tells the outside (metrics, health, the
log lines about objects) is its :class:`~nlproxy.sync.report.SyncReporter`'s. A sync's worker
returns one :class:`Outcome`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

import trio

from nlproxy.cluster.model import Change, ClusterSnapshot, IPAddress, ServiceKey
from nlproxy.cluster.state import ClusterState
from nlproxy.errors import NlproxyError
from nlproxy.log import get_logger
from nlproxy.nft.ir import FAMILIES, Family, Operation, Ruleset
from nlproxy.nft.monitor import Drift
from nlproxy.proxy.config import ProxyConfig
from nlproxy.runtime import hotpath
from nlproxy.serve.health import HealthState
from nlproxy.serve.metrics import Metrics
from nlproxy.sync.report import SyncReporter
from nlproxy.sync.syncer import Syncer, SyncResult
from nlproxy.sync.verify import Repair

T = TypeVar("T")

RESTART_VERIFY_DELAY = 10.0
"""Seconds after a restart the tables' records vouched for before their first full verify (at
most the sync period): the start-up's own work comes first."""

RACES_BEFORE_WAITING = 3
"""Read-backs in a row that syncs overlapped before the next sync reads back itself: a steady
stream of changes must not put a drift's repair off for ever."""

RELEASE_INTERVAL = 10.0
"""Seconds from a change, sync or read-back to handing free heap memory back (about a
millisecond each time, more with the wake-up): what the inspector's passes and bursts of changes
freed goes back; full syncs release at once. An idle node's loop is not woken for it: with
nothing done since the last release there is nothing new to hand back."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the worker of one sync returns to the loop."""

    result: SyncResult | None = None
    """What the sync did; None: it failed (``error``)."""
    error: NlproxyError | OSError | None = None
    """Why it failed: tried again, never fatal (``EMFILE``, ``ENOMEM``, a refused batch...)."""
    readback_ms: float | None = None
    """How long it took to read the tables back first (None: it did not)."""
    repaired: int | None = None
    """Operations a drift's repair sent before the sync (None: no repair was made)."""
    repair_raced: bool = False
    """A repair was due but void: a sync ran after its read-back (read back again)."""


class SyncLoop:
    """Runs syncs for ``state`` through ``syncer``; see the module docstring for the schedule.

    ``release_memory`` hands free heap memory back to the system; it is called after full
    syncs and ``RELEASE_INTERVAL`` after a change, sync or read-back (the daemon passes
    ``daemon/memory.py``'s ``release`` and tunes malloc for it at start-up).

    ``quiet`` answers whether nothing can have changed the tables unseen since the last sync
    (the drift watch saw every transaction): the periodic verify then skips reading the
    tables back, and when no object changed since the last sync either it plans nothing
    (``_trusted_verify``). A drift report or a failed sync always reads them back.

    ``in_thread=False`` runs each sync on the event loop itself (a Syncer that does no I/O, as in
    the loop's own tests, where a worker thread would race trio's mock clock); ``runner`` then
    runs the verifier's blocking calls (read-back, comparison) instead of a worker thread, so
    such tests can give them a duration on the mock clock.
    """

    def __init__(
        self,
        state: ClusterState,
        syncer: Syncer,
        *,
        health: HealthState,
        metrics: Metrics,
        min_interval: float,
        sync_period: float,
        retry_interval: float = 1.0,
        on_synced: Callable[[SyncResult, set[ServiceKey] | None], None] | None = None,
        snapshot_filter: Callable[[ClusterSnapshot], ClusterSnapshot] | None = None,
        release_memory: Callable[[], object] | None = None,
        quiet: Callable[[], bool] | None = None,
        in_thread: bool = True,
        runner: Callable[..., Awaitable[object]] | None = None,
    ) -> None:
        self._runner = runner
        self._release_memory = release_memory
        self._in_thread = in_thread
        self._resume_gc = False  # the collector paused for a cold start (hold_collection)
        self.quiet = quiet
        self.source_errors: Callable[[], Sequence[str]] | None = None
        """The source's own problems (files that do not parse): reported and counted with the
        invalid objects."""
        self.state = state
        self.syncer = syncer
        self.min_interval = min_interval
        self.sync_period = sync_period
        self.retry_interval = retry_interval
        self.on_synced = on_synced
        self.snapshot_filter = snapshot_filter
        self.log = get_logger("sync")
        self.report = SyncReporter(state, health=health, metrics=metrics, log=self.log)
        self._wake = trio.Event()
        self._since_release = trio.Event()  # a change, sync or read-back since the last release
        self._pending: set[ServiceKey] = set()
        self._dirty = True
        self._verify = False
        self._read_back = False  # the next sync reads the tables back first (after a failure)
        self._want_read_back = trio.Event()  # the verifier task's: read back and compare
        self._read_back_due = False
        self._lost: list[tuple[int, int]] = []  # generations of lost notifications
        self._adopt: Repair | None = None  # a read-back that differed, its repair prepared
        self._retry_left_out = False  # a verify completed: services left out are tried again
        self._syncing: trio.Event | None = None  # set when the sync in progress ends
        self._planned = False  # a sync planned (or failed): the start-up's objects exist
        self._nursery: trio.Nursery | None = None
        self._config: ProxyConfig | None = None  # the planner's new settings, for the next sync
        self.synced_once = trio.Event()
        self._resting = False
        """An idle node's loop: a periodic verify found the state unchanged since the last
        sync and every transaction since nlproxy's own, so the next would find the same, and
        the loop waits for something to happen instead (a change, the watch's report of
        another writer's commit, a read-back's drift, new settings), with no timer: an idle
        node's event loop does not wake. What those verifies told the outside is told when
        asked (:meth:`vouch`)."""

    def reconfigure(self, config: ProxyConfig) -> None:
        """Plan with ``config`` from the next sync on, which comes at once (within the minimum
        interval): the Syncer takes it in that sync's thread, never while one runs, and the
        sync sends what differs as one batch per family (``Syncer.reconfigure``). The state
        learns the new ``cluster_cidrs`` (no ClusterIP may be in them) at once."""
        changed = self.state.set_cluster_cidrs(config.cluster_cidrs)
        if changed:
            self.report.changed(changed)
            self._pending |= changed
        self._config = config
        self._dirty = True
        self._wake.set()

    def set_periods(self, *, min_interval: float, sync_period: float) -> None:
        """New ``minSyncPeriod`` and ``syncPeriod``: the next sync and the next verify are
        scheduled by them (the verify ``sync_period`` after the last one)."""
        self.min_interval = min_interval
        self.sync_period = sync_period
        self._wake.set()

    def hold_collection(self) -> None:
        """Pause the cyclic collector for a cold start until the first sync that plans has run:
        the lists, the state and the first plan are objects kept for good
        (``runtime/hotpath.py``)."""
        self._resume_gc = hotpath.pause_collection() or self._resume_gc

    def set_source_errors(self, errors: Callable[[], Sequence[str]]) -> None:
        """Where the source's own problems are read from (files that do not parse), once the
        source exists (it is made after the loop)."""
        self.source_errors = errors

    def request_verify(self, drift: Drift | None = None) -> None:
        """Read back the kernel and repair it at the next opportunity (drift, or a timer)."""
        if drift is not None and drift.pid == 0 and drift.lost is not None:
            # The monitor's socket overflowed: the generations are checked against nlproxy's
            # own commits once no sync is in progress (the last one's is then known).
            self._lost.append(drift.lost)
            self._wake.set()
            return
        if drift is not None:
            self.report.drift(drift)
        if drift is None:  # a full verify now, as at the timer
            self._verify = True
            self._wake.set()
        else:  # the verifier reads back; only a difference it finds makes a sync
            self._start_read_back()

    def _check_lost(self) -> None:
        """Lost notifications whose generations were not all nlproxy's commits: read back."""
        lost, self._lost = self._lost, []
        for after, upto in lost:
            own = self.syncer.own_commits(after, upto)
            self.report.lost(after, upto, own=own)
            if not own:
                self._start_read_back()

    def _start_read_back(self) -> None:
        self._read_back_due = True
        self._want_read_back.set()

    def request_sync(self) -> None:
        """Sync again although no object changed (e.g. an endpoint became unreachable)."""
        self._dirty = True
        self._wake.set()

    def set_local_addresses(self, addresses: Iterable[IPAddress]) -> None:
        """This node's interface addresses changed (``nodePortAddresses`` CIDRs select them)."""
        changed = self.state.set_local_addresses(addresses)
        if changed:
            self.report.changed(changed)
            self._pending |= changed
            self._dirty = True
            self._wake.set()

    def apply_changes(self, changes: Sequence[Change]) -> None:
        changed = self.state.apply(changes)
        self.report.changed(changed)
        self._pending |= changed
        self._dirty = True
        self.report.queued(changes)
        self._wake.set()
        self._since_release.set()

    async def _receive(self, recv: trio.MemoryReceiveChannel[Sequence[Change]]) -> None:
        async with recv:
            async for changes in recv:
                self.apply_changes(changes)
                # Not kept until the next batch: an initial list holds every object's change.
                del changes

    async def run(
        self,
        recv: trio.MemoryReceiveChannel[Sequence[Change]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Sync until cancelled; ``task_status.started()`` after the first successful sync.

        Cancellation: a sync in progress finishes in its thread (a netlink batch is atomic);
        the loop stops waiting for it.
        """
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._receive, recv)
            nursery.start_soon(self._verifier)
            if self._release_memory is not None:
                nursery.start_soon(self._release_periodically, self._release_memory)
            started = False
            last = -float("inf")
            verified = trio.current_time()
            retry_at: float | None = None  # a failed sync's next try: waited for, not the period
            while True:
                due = verified + self.sync_period  # the period may change meanwhile
                deadline = due if retry_at is None else retry_at
                with trio.move_on_at(math.inf if self._resting else deadline):  # see vouch
                    await self._wake.wait()
                self._wake = trio.Event()
                if self._resting:  # the rest vouched for every period until now
                    self._resting = False
                    verified = trio.current_time()
                    due = verified + self.sync_period
                if self._lost:
                    self._check_lost()
                if trio.current_time() >= due:
                    self._verify = True
                if not (self._dirty or self._verify):
                    continue
                if self._verify and not self._dirty and self._trusted_verify():
                    self._verify = False
                    verified = trio.current_time()
                    continue
                await trio.sleep_until(last + self.min_interval)
                if not self._lost:  # what woke it meanwhile is in this sync (lost: see above)
                    self._wake = trio.Event()
                self._syncing = trio.Event()
                try:
                    ok, full = await self._sync_once()
                finally:
                    self._sync_ended()
                last = trio.current_time()
                if ok and full:
                    verified = last
                retry_at = None if ok else last + self.retry_interval
                if not ok:
                    self._dirty = True
                elif not started:
                    started = True
                    self.synced_once.set()
                    task_status.started()

    def _sync_ended(self) -> None:
        assert self._syncing is not None
        self._syncing.set()
        self._syncing = None
        self._since_release.set()  # what it freed, to go back at the next release
        if self._resume_gc and self._planned:  # pausing was for the first plan
            self._resume_gc = False
            hotpath.resume_collection()

    def _trusted_verify(self) -> bool:
        """A periodic verify when no object changed since the last sync, which succeeded,
        and nothing of the verifier's or a failure's waits, nor a chore of the Syncer's (flows
        a cleanup could not delete yet, a start-up sweep that could not list): the kernel held
        the plan of the state as it is, so planning again could only find what it found, and
        nothing is planned. ``quiet()``
        (asked once: it takes what it saw from the drift watch) tells whether anyone else
        committed since: if not, what a verify tells the outside (orphan slices, the last
        sync's time) is told; if so, the verifier reads back, and a difference it finds is
        repaired by a sync then. Returns whether the verify was so (False: it is a sync).
        """
        if (
            self.quiet is None
            or self._read_back
            or self._adopt is not None
            or self._config is not None
            or self._retry_left_out
            or self._lost
            or not self._planned
            or self.syncer.cleanup.owed
        ):
            return False
        if not self._quiet_now():
            if not self._read_back_due:
                self._start_read_back()
            return True
        # The state's own snapshot, unfiltered: what is reported of it does not depend on the
        # endpoints a snapshot filter leaves out, and filtering would walk every slice.
        snapshot = self.state.snapshot()
        self.report.node(snapshot.node)
        source_errors = self.source_errors() if self.source_errors is not None else ()
        self.report.objects(snapshot, self.syncer.config, source_errors, verify=True)
        self.report.verified(read_back=False)
        self.report.trusted()
        self._resting = not self._read_back_due
        return True

    def vouch(self) -> None:
        """Tell what a periodic verify of a resting loop would tell, now: asked before
        ``/healthz`` and ``/metrics`` are answered, so that the last update and the last-sync
        metric are as current there as when the loop woke every period. Still quiet: the
        rules are as current as a sync would make them. Someone else committed (its move not
        yet reported by the watch): the verifier reads back, and the loop wakes.
        """
        if (
            not self._resting
            or self._wake.is_set()  # about to wake: a change waits, say
            or self._read_back_due  # what the read-back under way finds is not known yet
        ):
            return
        if self._quiet_now():
            self.report.trusted()
            return
        self._resting = False
        if not self._read_back_due:
            self._start_read_back()
        self._wake.set()

    def _quiet_now(self) -> bool:
        """``quiet()``: one GETGEN, answered at once (called on the loop)."""
        return self.quiet is not None and self.quiet()

    async def _read_back_after(self, delay: float) -> None:
        await trio.sleep(delay)
        self._start_read_back()

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` off the loop: in a worker thread, or through ``runner``."""
        if self._runner is not None:
            return cast("T", await self._runner(fn, *args))
        if self._in_thread:
            return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)
        return fn(*args)

    async def _verifier(self) -> None:
        """Read back and compare whenever asked, off the loop (see the module docstring).

        Cancellation: a read-back in its thread is abandoned (it only reads).
        """
        races = 0
        while True:
            await self._want_read_back.wait()
            self._want_read_back = trio.Event()
            while self._syncing is not None:  # its commit would void the comparison
                await self._syncing.wait()
            try:
                done = await self._verify_once()
            except (NlproxyError, OSError) as exc:  # tried again after the retry interval
                self.log.warning("verify.failed", error=str(exc))
                done = False
                if self._resting:  # back to the periodic verifies until one reads back
                    self._wake.set()
                await trio.sleep(self.retry_interval)
            else:
                races = 0 if done else races + 1
            self._since_release.set()  # what the read-back freed, as after a sync
            if races >= RACES_BEFORE_WAITING:
                races = 0
                self._read_back_due = False
                self._read_back = True  # the next sync reads back before planning, itself
                self._verify = True
                self._wake.set()
            elif not done:
                self._read_back_due = True  # read back again: not vouched for meanwhile
                self._want_read_back.set()

    async def _verify_once(self) -> bool:
        """One read-back and comparison; False when a sync overlapped it (do it again)."""
        version = self.syncer.version
        tables: dict[Family, Ruleset | None] = {}
        repairs: dict[Family, list[Operation]] = {}
        read_s = compare_s = 0.0
        for family in FAMILIES:
            t = time.perf_counter()
            rs = await self._run(self.syncer.read_back, family)
            read_s += time.perf_counter() - t
            t = time.perf_counter()
            ops = await self._run(self.syncer.repair_ops, family, rs, version)
            compare_s += time.perf_counter() - t
            if ops is None:
                self.log.info("verify.raced", stage="compare")
                return False
            tables[family] = rs
            repairs[family] = ops
        drifted = any(repairs.values())
        self._read_back_due = False
        self._retry_left_out = True
        if self._resting:  # the services left out are tried at the next periodic verify
            self._wake.set()
        self.report.compared(drift=drifted, read_s=read_s, compare_s=compare_s)
        if drifted:
            # The repair's passes over whole tables are made here, off the loop: the sync that
            # commits it then holds no change up for long.
            prepared = await self._run(self.syncer.prepare_repair, tables, repairs, version)
            if prepared is None:
                self.log.info("verify.raced", stage="prepare")
                return False
            self._adopt = prepared
            self._verify = True
            self._wake.set()
        return True

    async def _sync_once(self) -> tuple[bool, bool]:
        """One sync; returns (succeeded, was a full verify)."""
        verify, self._verify = self._verify, False
        read_back, self._read_back = self._read_back, False
        self._dirty = False
        pending, self._pending = self._pending, set()
        snapshot = self.state.snapshot()
        self.report.node(snapshot.node)
        if self.snapshot_filter is not None:
            snapshot = self.snapshot_filter(snapshot)
        source_errors = self.source_errors() if self.source_errors is not None else ()
        self.report.objects(snapshot, self.syncer.config, source_errors, verify=verify)

        # The changed services let the Syncer update its plan in place; a snapshot filter may
        # change services the state did not report, so then the Syncer finds them itself.
        changed = None if self.snapshot_filter is not None else set(pending)
        adopt, self._adopt = self._adopt, None
        retry, self._retry_left_out = self._retry_left_out, False
        config, self._config = self._config, None
        if verify and not read_back and adopt is None:
            if self._quiet_now():  # every transaction was seen, and none touched our tables
                self.report.verified(read_back=False)
            elif not self._read_back_due:
                self._start_read_back()

        def work() -> Outcome:
            if config is not None:
                self.syncer.reconfigure(config)
            return self._work(snapshot, changed, read_back=read_back, adopt=adopt, retry=retry)

        if self._in_thread:
            outcome = await trio.to_thread.run_sync(work, abandon_on_cancel=True)
        else:
            outcome = work()
        if outcome.readback_ms is not None:
            self.report.verified(read_back=True)
        if outcome.result is None:
            assert outcome.error is not None, "a sync without a result failed"
            self._planned = True  # whether or not the first sync worked (for hold_collection)
            self.report.failed(outcome.error, self.syncer.failed_family)
            self._pending |= pending
            self._verify = True  # the kernel's state is uncertain after a failure: read it back
            self._read_back = True
            return False, verify
        self._after(outcome, pending, snapshot, verify=verify)
        return True, verify

    def _work(
        self,
        snapshot: ClusterSnapshot,
        changed: set[ServiceKey] | None,
        *,
        read_back: bool,
        adopt: Repair | None,
        retry: bool,
    ) -> Outcome:
        """A sync's blocking part (in a worker thread): a read-back first after a failure, or
        a drift's repair, or the left-out services let back in; then the sync."""
        readback_ms: float | None = None
        repaired: int | None = None
        try:
            if read_back:  # after a failure: the cache may be wrong, read back before planning
                started = time.perf_counter()
                self.syncer.verify()
                readback_ms = (time.perf_counter() - started) * 1000
            elif adopt is not None:  # None: a sync ran after that read-back, it is stale
                repaired = self.syncer.repair(
                    adopt.tables, adopt.ops, adopt.version, snapshot, adopt
                )
            elif retry:
                self.syncer.retry_left_out()
            result = self.syncer.sync(snapshot, changed=changed)
        except (NlproxyError, OSError) as exc:  # EMFILE, ENOMEM...: tried again, never fatal
            return Outcome(error=exc, readback_ms=readback_ms)
        raced = adopt is not None and repaired is None
        return Outcome(result, readback_ms=readback_ms, repaired=repaired, repair_raced=raced)

    def _after(
        self,
        outcome: Outcome,
        pending: set[ServiceKey],
        snapshot: ClusterSnapshot,
        *,
        verify: bool,
    ) -> None:
        """What a successful sync of ``snapshot`` leads to: a repair's outcome logged, the verify
        a trusted restart owes, the plan it did not make yet, deferred tables, the memory it
        freed."""
        result = outcome.result
        assert result is not None, "only a sync that succeeded is followed up"
        if result.narrowed is not None:  # a relist named more than changed (``relist.py``)
            self.report.unchanged(pending - result.narrowed)
            pending = result.narrowed
        if outcome.repair_raced:
            self.log.info("verify.raced", stage="repair")
            self._start_read_back()
        elif outcome.repaired is not None:
            self.log.info("drift.repaired", ops=outcome.repaired)
        if result.restarted and self._nursery is not None:
            self._nursery.start_soon(
                self._read_back_after, min(RESTART_VERIFY_DELAY, self.sync_period)
            )
        if result.restarted and result.plan is None:  # not planned yet: the next sync plans
            self._dirty = True
            self._wake.set()
        else:
            self._planned = True
        # Which services this sync changed, when that is known exactly (else None: any).
        exact = result.incremental and self.snapshot_filter is None
        self.report.synced(
            result,
            pending,
            snapshot,
            verify=verify,
            exact=exact,
            readback_ms=outcome.readback_ms,
            repaired=outcome.repaired is not None,
        )
        if self.on_synced is not None:
            self.on_synced(result, pending if exact else None)
        if result.deferred:  # tables left for the next sync, which other changes may join
            self._pending |= result.deferred
            self._dirty = True
            self._wake.set()
        if not result.incremental:
            # The programmed state's own copy of the maps the commit sent, made now that the
            # sync is reported rather than on its path (else the next sync makes it).
            self.syncer.settle()
            # The plan and programmed state of a large cluster are millions of long-lived
            # objects; without this every full GC pass walks them all (seconds at 10k
            # services, stalling event-to-commit). Incremental syncs allocate little.
            hotpath.freeze_long_lived()
            if self._release_memory is not None:
                self._release_memory()  # what planning and diffing the whole table freed

    async def _release_periodically(self, release: Callable[[], object]) -> None:
        while True:
            await self._since_release.wait()
            await trio.sleep(RELEASE_INTERVAL)
            self._since_release = trio.Event()  # what comes after this release: the next one
            release()
