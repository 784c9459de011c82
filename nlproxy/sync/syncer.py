"""One sync: planner → reconciler → kernel → effects (conntrack cleanup).

Used by ``nlproxy run --once`` and by the daemon's sync loop; holds no scheduling of its own.
What is programmed is read back from the kernel the first time (so a restarted process sends only
the difference) and cached afterwards; ``verify()`` reads it back again to catch drift.
Effects run only after the kernel accepted the transaction.

Two paths. The full one plans every service (replaying unchanged ones) and diffs the whole
table: at start-up, after a verify or a failure, and whenever the incremental one cannot be
sure. The incremental one, once the cache is known to equal the last plan, updates that plan in
place for the changed services only (``proxy/incremental.py``), turns the resulting delta into
operations (``reconcile.ops_for_delta``), advances the cache by them, and computes conntrack
cleanup from the touched frontends only: its cost follows the change, not the table.

When the kernel rejects a batch that passed validation, the service behind it is left out
(``isolation.py``: planned as last accepted, or absent) and the sync runs again, so one bad
service cannot stall the others; the result names every service left out.

Two parts are objects of their own that the Syncer owns and calls, as it does
:class:`~nlproxy.sync.isolation.Isolation`: the :class:`~nlproxy.sync.verify.Verifier` (the
verify off the sync loop: read-back, comparison, a drift's repair prepared off the loop, and the
version that voids a comparison a sync overlapped) and the
:class:`~nlproxy.sync.restart.RestartRecords` (each commit's record in the tables, and the
start-up check that trusts it), with the :class:`~nlproxy.sync.health.HealthRecord` beside them
(``health.py``: the health-check node ports a restart keeps answering). They read the kernel but
change neither it nor the Syncer: the Syncer sends the operations they return, through its
:class:`~nlproxy.sync.batches.Batches` (``batches.py``: a backend per family, the batch refused
last, the tables this process owns), and applies a repair itself. The conntrack effect of a
commit is the :class:`~nlproxy.sync.cleanup.FlowCleanup`'s (``cleanup.py``), which the Syncer
hands what was and is programmed. ``result.py`` holds what a sync returns.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence, Set

from nlproxy.cluster.model import ClusterSnapshot, ServiceKey
from nlproxy.errors import KernelError
from nlproxy.log import get_logger
from nlproxy.nft.ir import FAMILIES, Family, Operation, Ruleset
from nlproxy.nft.reconcile import Delta, advance, count_ops, diff, ops_for_delta
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.incremental import attach, plan_update
from nlproxy.proxy.layout import flow_frontends, udp_only
from nlproxy.proxy.planner import Plan, plan, plan_slot_token
from nlproxy.runtime.hotpath import collection_paused
from nlproxy.sync.ahead import PlanAhead
from nlproxy.sync.balancing import BalancingGuard
from nlproxy.sync.batches import Batches
from nlproxy.sync.cleanup import FlowCleanup, udp_part
from nlproxy.sync.fingerprint import Record, take_record
from nlproxy.sync.health import HealthRecord
from nlproxy.sync.isolation import Isolation, owners
from nlproxy.sync.keep import Keeper
from nlproxy.sync.kernel import SyncKernel
from nlproxy.sync.relist import for_planning, narrowed
from nlproxy.sync.restart import RestartRecords
from nlproxy.sync.result import SyncResult, as_programmed, unshare
from nlproxy.sync.verify import STAGE_REPAIR_AT, Repair, Verifier, staged

__all__ = ["FAMILIES", "SyncResult", "Syncer", "as_programmed", "udp_only"]


class Syncer:
    """Keeps the ``ip``/``ip6`` nlproxy tables equal to the plan for a snapshot.

    Args:
        config: the planner's configuration.
        kernel: the tables, their read-back and the conntrack flows to sync (``kernel.py``:
            the real ones of a namespace, or fakes).
        owner: create the tables with NFT_TABLE_F_OWNER (+ PERSIST); see ``nft/backend.py``.
        flush_tcp: also delete TCP flows of removed endpoints (UDP/SCTP always are).
        incremental: update the last plan in place when it can (False: always the full path).
        record: keep a record of each commit's inputs in the tables, and trust a matching one
            at start-up instead of reading the tables back (``fingerprint.py``).
        plan_after_restart: a restart the records vouch for ends its first sync before
            planning (the tables hold that plan already; the result has no plan): the next
            sync plans it, then applies what changed since. The daemon's first sync after a
            restart is then its lists, a digest and the records.
        quota: most elements of round-robin and consistent-hash tables one sync may (re)build
            (``balancing.py``); None: no limit (``run --once``).
    """

    def __init__(
        self,
        config: ProxyConfig,
        kernel: SyncKernel,
        *,
        owner: bool = False,
        flush_tcp: bool = False,
        incremental: bool = True,
        record: bool = True,
        plan_after_restart: bool = False,
        quota: int | None = None,
    ) -> None:
        self.config = config
        self.incremental = incremental
        self.kernel = kernel
        self.log = get_logger("sync")
        self._programmed: dict[Family, Ruleset | None] = {}
        # The plan whose element maps the programmed state holds as they are (no copy after a
        # commit, ``result.as_programmed``); :meth:`settle` copies them before either changes.
        self._shared: Plan | None = None
        self._seeded = False
        self._last_plan: Plan | None = None
        # True while the cache equals the last plan as programmed: only then may a delta of
        # that plan stand for the whole difference.
        self._in_step = False
        self.cleanup = FlowCleanup(kernel.flows, config, self.log, flush_tcp=flush_tcp)
        self.isolation = Isolation(self.log)
        self.balancing = BalancingGuard(config.load_balancing, self.log, quota=quota)
        self.records = RestartRecords(
            config, kernel.readback, self.log, enabled=record and not owner
        )
        # With ``--owned-table`` too: a kept Service's health-check port has no other place.
        self.health = HealthRecord(enabled=record)
        self.verifier = Verifier(kernel.readback)
        self.batches = Batches(kernel, self.log, owner=owner, committed=self.verifier.committed)
        # A repair adding this many elements no packet needs sends them in a batch of their
        # own, after the rest (``verify.staged``).
        self.repair_stage_at = STAGE_REPAIR_AT
        self.plan_after_restart = plan_after_restart
        self._unplanned: ClusterSnapshot | None = None  # trusted as programmed, not planned
        # While a source cannot read where some Services are, the tables keep their objects
        # as found at start (``keep.py``); ``_merged`` is then what is programmed per family.
        self.keeper = Keeper()
        self._merged: Mapping[Family, Ruleset] | None = None
        self._kept_logged: list[str] = []
        self._replan = False  # the configuration changed: the next sync looks at everything
        self.ahead = PlanAhead()  # a cold start's plan made ahead of its first sync

    def reconfigure(self, config: ProxyConfig) -> bool:
        """Plan with ``config`` from the next sync on (a changed ``--config`` file applied in
        place); whether it differs from the current one.

        The next sync plans every Service afresh (the settings are part of the plan's context:
        no fragment planned with the old ones is replayed, the endpoints keep their slots) and
        sends only what differs from what is programmed, one batch per family as every sync:
        the kernel switches from the old settings to the new ones atomically. The load-balancing
        budget counts every Service again. Not to be called while a sync runs (the loop calls
        it in the sync's own thread).
        """
        if config == self.config:
            return False
        if self._unplanned is not None:
            # A trusted restart not planned yet: the tables hold that snapshot's plan with the
            # old settings, which is what the new plan is compared with.
            self._plan_trusted(self._unplanned)
        self.settle()
        self.config = config
        self.cleanup.reconfigure(config)
        self.balancing.reconfigure(config.load_balancing)
        self.records.reconfigure(config)
        self._replan = True
        return True

    @property
    def files_digest(self) -> str | None:
        """``run --once``'s digest of its manifest files and settings, recorded beside the
        snapshot's when set (``fingerprint.files_digest``)."""
        return self.records.files_digest

    @files_digest.setter
    def files_digest(self, files: str | None) -> None:
        self.records.use_files(files)

    def unchanged_since_last_run(self, snapshot: ClusterSnapshot) -> bool:
        """Whether the tables' records show they hold the plan of ``snapshot`` and nobody
        committed since: then there is nothing to do (``run --once`` skips even planning)."""
        return self.records.unchanged_since_last_run(for_planning(snapshot))

    def files_unchanged(self, files: str) -> bool:
        """Whether the tables' records show they hold what ``run --once`` programmed from the
        same manifest files and settings, and nobody committed since (``RestartRecords``)."""
        return self.records.files_unchanged(files)

    @property
    def recorded_files(self) -> str | None:
        """The files digest of the records a restart check found matching (None: none)."""
        return self.records.recorded_files

    def rewrite_records(self) -> None:
        """Write both records again now (a batch each), e.g. without ``files_digest`` once
        a run turned out to have something to report."""
        self._send(self.records.rewrite())

    def _send(self, batches: Sequence[tuple[Family, list[Operation]]]) -> None:
        """Commit the records' own batches (of families that had nothing else to send)."""
        for family, ops in batches:
            self.batches.apply(family, ops)
        self.records.written()

    @property
    def version(self) -> int:
        """Moves at the start and the end of every sync; odd while one runs."""
        return self.verifier.version

    def own_commits(self, after: int, upto: int) -> bool:
        """Whether every generation in ``(after, upto]`` is one of this process's commits."""
        return self.verifier.own_commits(after, upto)

    def read_back(self, family: Family) -> Ruleset | None:
        """``family``'s table as the kernel holds it (without its record). Blocking; only reads,
        so it may run in a thread while a sync runs in another."""
        return self.verifier.read_back(family)

    def repair_ops(
        self, family: Family, have: Ruleset | None, version: int
    ) -> list[Operation] | None:
        """What makes ``have`` (a read-back of ``family``) equal to the last plan: empty when
        nothing differs; None when a sync ran since ``version`` (the plan may have changed
        under the comparison). May run in a thread while a sync runs in another."""
        planned = self._last_plan
        if planned is None and self._seeded:  # a trusted restart, planned by the next sync
            return None
        return self.verifier.repair_ops(family, have, version, self._programs(planned))

    def prepare_repair(
        self,
        tables: dict[Family, Ruleset | None],
        repairs: dict[Family, list[Operation]],
        version: int,
    ) -> Repair | None:
        """What :meth:`repair` needs of ``tables`` (read back at ``version``) besides its
        operations, prepared off the loop (``Verifier.prepare_repair``); None when a sync ran
        since ``version`` or nothing is planned."""
        planned = self._last_plan
        if planned is None:
            return None
        wanted = self._programs(planned)
        assert wanted is not None, "a plan is given"
        return self.verifier.prepare_repair(tables, repairs, version, wanted)

    def _programs(self, planned: Plan | None) -> Mapping[Family, Ruleset] | None:
        """What the tables are to hold per family: ``planned``'s rulesets, with what is kept
        (``keep.py``) while anything is."""
        if self._merged is not None:
            return self._merged
        return None if planned is None else planned.rulesets

    @property
    def fresh(self) -> bool:
        """Nothing synced, read back or planned yet, and records kept (``ahead.py``)."""
        return (
            not self._seeded
            and self._last_plan is None
            and self.incremental
            and (self.records.enabled)
        )

    @property
    def failed_family(self) -> Family | None:
        """The family whose batch the kernel rejected last (None: the last commit passed)."""
        failed = self.batches.failed
        return failed[0] if failed is not None else None

    def settle(self) -> None:
        """Give the programmed state its own copy of the element maps it shares with the last
        plan since a full commit, a trusted restart or a repair: the next sync updates the plan
        in place and advances the programmed state, each on its own. Every sync and repair
        does it first; the daemon's loop does it once a sync is reported, off a change's path
        (``run --once`` never: nothing changes after its commit)."""
        planned, self._shared = self._shared, None
        if planned is None:
            return
        for family in FAMILIES:
            rs = self._programmed.get(family)
            if rs is not None:
                unshare(rs, planned.rulesets[family])

    def _share(self, planned: Plan) -> None:
        """The programmed state is ``planned`` as committed (with what is kept, while anything
        is), its element maps shared."""
        wanted = self._programs(planned)
        assert wanted is not None, "a plan is given"
        for family in FAMILIES:
            self._programmed[family] = as_programmed(wanted[family], share=True)
        self._shared = planned

    def verify(self) -> None:
        """Forget the cache: the next sync compares against what the kernel really holds."""
        self._shared = None  # the read-back replaces the programmed state
        records: dict[Family, Record | None] = {}
        gen = self.batches.generation()
        tables = {family: self.kernel.readback.dump(family) for family in FAMILIES}
        health = self.health.read(tables)
        for family, rs in tables.items():
            records[family] = take_record(rs)  # the plan has no record chain: not a drift
            self._programmed[family] = rs
        self.records.read(records, gen, self.batches.generation())
        self.batches.forget()  # their view of chains and sets is as stale as the cache
        if not self._seeded:  # the tables as this process found them
            self.keeper.found(self._programmed, health)
        self._seeded = True
        self._in_step = False
        self._unplanned = None  # the next sync plans afresh and compares with the read-back
        self.isolation.retry_all()

    def sync(
        self, snapshot: ClusterSnapshot, *, changed: Set[ServiceKey] | None = None
    ) -> SyncResult:
        """Plan ``snapshot`` and apply the difference, then clean up conntrack.

        Args:
            snapshot: the cluster objects to program.
            changed: the services changed since the last call (``ClusterState.apply``'s
                results, accumulated); None: found by comparing objects by identity. Only
                used on the incremental path.

        Services the kernel rejects are left out and named in the result's ``excluded``;
        Services past the load-balancing budget are planned with random choice
        (:attr:`balancing`).

        Raises:
            KernelError: the kernel rejected the transaction and no service could be blamed
                (nothing of that family's batch was applied).
        """
        ahead = self.ahead.take()  # a plan made ahead of this first sync (waits for it)
        if ahead is not None:
            self._last_plan = ahead
        # A relist reports every Service changed when this Node changed at all: planned are the
        # Node as planning reads it, and only the services whose objects are not the last
        # plan's (``relist.py``).
        snapshot = for_planning(snapshot)
        if self._replan:  # new settings: every Service may differ
            self._replan = False
            changed = None
        if self.keeper.sees(snapshot, changed):
            # Every place is read now: what was kept and is not planned is really gone.
            self.log.info("sync.keep_ended")
            self._merged = None
            self._in_step = False
            self.records.look_at_all()
        told = changed
        last = self._last_plan if self.incremental and ahead is None else None
        changed = found = narrowed(changed, last, snapshot, self.config)
        with collection_paused():  # a collection would walk the whole cached plan
            vouched = False
            if not self._seeded and self.balancing.quota is not None:
                vouched = self.balancing.seed(snapshot, self.records, self._read_back_all)
            snapshot, changed = self.balancing.apply(snapshot, changed)
            if ahead is not None:  # narrowed as the budget leaves it; none reported unchanged
                changed = narrowed(changed, ahead, snapshot, self.config)
            with self.verifier.changing():
                result = self._sync_isolating(snapshot, changed, vouched=vouched)
                if found is not told and found is not None:
                    result.narrowed = set(found)
                result.deferred = set(self.balancing.deferred)
                if self.cleanup.pending:
                    programmed = [rs for rs in self._programmed.values() if rs is not None]
                    result.conntrack_deleted += self.cleanup.finish(programmed, snapshot)
                if self._last_plan is not None:  # what an earlier process left: clients first
                    self.batches.forget_left_clients(self._last_plan)
                    result.conntrack_deleted += self.cleanup.sweep(self._programmed, snapshot)
                return result

    def _read_back_all(self) -> list[Ruleset | None]:
        """The tables as the kernel holds them now (``verify``)."""
        self.verify()
        return list(self._programmed.values())

    def _sync_isolating(
        self, snapshot: ClusterSnapshot, changed: Set[ServiceKey] | None, *, vouched: bool
    ) -> SyncResult:
        iso = self.isolation
        iso.start(snapshot)
        changing = changed  # whose affinity clients are forgotten, whichever path runs
        while True:
            effective = iso.effective(snapshot)
            try:
                result = self._sync(effective, changed, changing, vouched=vouched)
            except KernelError as exc:
                keys = iso.culprits(exc, effective, self._holders(exc), self._check)
                if not keys:
                    raise
                iso.exclude(snapshot, keys, str(exc))
                changed = None  # the full path runs next: the cache is no longer in step
                vouched = False
                continue
            result.excluded = iso.accepted(effective)
            return result

    def _holders(self, exc: KernelError) -> list[ServiceKey]:
        """The services whose part of the last plan adds the operation ``exc`` names (of the
        batch the kernel refused), if it names one."""
        failed, planned = self.batches.failed, self._last_plan
        if failed is None or planned is None or not 0 <= exc.index < len(failed[1]):
            return []
        family, ops = failed
        return owners(planned, family, ops[exc.index].obj, exc.element)

    def _check(self, snapshot: ClusterSnapshot) -> bool:
        """Whether the kernel would accept the plan of ``snapshot`` (nothing is applied)."""
        self.settle()  # planning with the last plan as ``previous`` must not reach the cache
        planned = plan(snapshot, self.config, previous=self._last_plan)
        for family in FAMILIES:
            ops = diff(
                self.keeper.wanted(family, planned.rulesets[family]), self._programmed.get(family)
            )
            try:
                self.batches.check(family, ops)
            except KernelError:
                return False
        return True

    def _sync(
        self,
        snapshot: ClusterSnapshot,
        changed: Set[ServiceKey] | None,
        changing: Set[ServiceKey] | None,
        *,
        vouched: bool = False,
    ) -> SyncResult:
        """One try of :meth:`sync`; ``changing``: the Services whose affinity clients a commit
        may orphan (None: any); ``vouched``: a first sync whose snapshot's digest the records
        carry (``BalancingGuard.seed``): not taken or checked again."""
        self.settle()  # the plan is updated in place below, the cache by its own operations
        # Services left out (or let back in by retry_all) differ from the input without
        # being among its changes: then every service is looked at.
        if not vouched:
            self.records.take_digest(snapshot, changed, exact=not self.isolation.excluded)
        restarted = False
        if not self._seeded:
            restarted = vouched or self.records.matches()
            if not restarted:
                self.verify()
            elif self.plan_after_restart:
                return self._trust(snapshot)
        result = SyncResult()
        t0 = time.perf_counter()
        deltas: dict[Family, Delta] | None = None
        finishing = self._unplanned is not None  # a trusted restart's plan, made now
        if self._unplanned is not None:
            self._plan_trusted(self._unplanned)
            self.settle()  # that plan is updated in place next
        last, in_step, self._in_step = self._last_plan, self._in_step, False
        if last is not None and self.incremental and last.live is not None:
            planned, deltas = plan_update(last, snapshot, self.config, changed)
            if not in_step or (self.keeper.active and self.keeper.affects(deltas, changed)):
                # The plan is updated in place all the same (no full replan, no second plan
                # alive beside the read-back), but the cache is the kernel's read-back or
                # behind a failed commit, or what is kept may change: compare everything.
                deltas = None
        else:
            # The previous plan lets the planner replay the fragments of unchanged services;
            # without one, the endpoints keep the backends slots the kernel holds.
            slots = None if last is not None else self._programmed
            planned = plan(snapshot, self.config, previous=last, slots=slots)
            if self.incremental:
                attach(planned, snapshot)
        # Set before committing: an in-place update consumed the previous plan.
        self._last_plan = result.plan = planned
        self.records.with_slots(plan_slot_token(planned))
        t1 = time.perf_counter()
        result.plan_ms = (t1 - t0) * 1000
        if restarted:
            self._adopt(planned, result)
        elif deltas is not None:
            result.conntrack_deleted = self._sync_delta(planned, deltas, snapshot, result, changing)
            result.incremental = not finishing  # for the caller, a full plan was made
        else:
            result.conntrack_deleted = self._sync_full(planned, snapshot, result, changing)
        self._in_step = True
        result.apply_ms = (time.perf_counter() - t1) * 1000
        return result

    def _sync_full(
        self,
        planned: Plan,
        snapshot: ClusterSnapshot,
        result: SyncResult,
        changing: Set[ServiceKey] | None,
    ) -> int:
        before = {f: self._programmed.get(f) for f in FAMILIES}
        wanted = self._keep(planned, snapshot)

        def ops_of(family: Family) -> tuple[list[Operation], int]:
            desired = wanted[family]
            ops, claim = self.batches.claiming(
                family, before[family], desired, diff(desired, before[family])
            )
            if family in self.batches.recreating:
                self.health.forget()  # the table is made anew, without the record
            return ops, claim

        def committed(family: Family, ops: list[Operation]) -> None:
            # What was sent is the plan's own maps: kept as they are (``settle`` copies them).
            self._programmed[family] = as_programmed(wanted[family], share=True)
            self._shared = planned
            self.batches.claimed(family)

        def partial() -> tuple[list[Ruleset], list[Ruleset]]:
            done = [f for f in FAMILIES if result.ops.get(f)]
            olds = [rs for f in done if (rs := before[f]) is not None]
            news = [rs for f in done if (rs := self._programmed.get(f)) is not None]
            return (olds, news) if olds and news else ([], [])

        self._commit(result, snapshot, ops_of, committed, partial)
        if not result.total_ops:
            # Nothing changed in the kernel, so no flow lost its backend: skip reading the
            # frontends of both whole tables (seconds at 100k endpoints, at every restart).
            return 0
        olds = [rs for rs in before.values() if rs is not None]
        news = [rs for rs in self._programmed.values() if rs is not None]
        if not olds:
            # Nothing was programmed: the only stale flows are those of UDP frontends that now
            # have backends, so only those frontends are read (not 100k TCP backends).
            news = [udp_part(rs) for rs in news]
        self.batches.forget_clients(planned, changing)
        return self.cleanup.stale(olds, news, snapshot, result.conntrack)

    def _keep(self, planned: Plan, snapshot: ClusterSnapshot) -> Mapping[Family, Ruleset]:
        """What a full sync of ``planned`` programs per family: the plan, with the objects the
        keeper keeps (``keep.py``) while a source cannot read everything. While anything is
        kept the tables are not the plan of ``snapshot``: no restart record says they are."""
        if not self.keeper.active:
            self._merged = None
            return planned.rulesets
        wanted = self.keeper.keep(planned.rulesets)
        kept = sorted(self.keeper.kept)
        self._merged = wanted if kept else None
        if kept:
            self.records.withhold()
            if kept != self._kept_logged:
                self.log.warning(
                    "sync.kept", services=kept, count=len(kept), unread=list(snapshot.unread)
                )
        self._kept_logged = kept
        return wanted

    def _sync_delta(
        self,
        planned: Plan,
        deltas: dict[Family, Delta],
        snapshot: ClusterSnapshot,
        result: SyncResult,
        changing: Set[ServiceKey] | None,
    ) -> int:
        result.incremental = True
        old_rs, new_rs = flow_frontends(deltas, planned.rulesets, flush_tcp=self.cleanup.flush_tcp)

        def ops_of(family: Family) -> tuple[list[Operation], int]:
            programmed = self._programmed.get(family)
            assert programmed is not None, "in step with a plan means something is programmed"
            ops = ops_for_delta(deltas[family], programmed)
            # No delta alone: the whole table, with what is kept (else the diff deletes it).
            whole = planned.rulesets[family] if self._merged is None else self._merged[family]
            return (diff(whole, programmed) if ops is None else ops), 0

        def committed(family: Family, ops: list[Operation]) -> None:
            programmed = self._programmed.get(family)
            assert programmed is not None, "in step with a plan means something is programmed"
            advance(programmed, ops)

        if self._merged is not None:  # what is kept, as the last full sync kept it, stays
            self.records.withhold()
            self._merged = {f: self.keeper.remerged(f, planned.rulesets[f]) for f in FAMILIES}
        # A family that fails after another committed: the flows of the delta's removed
        # endpoints go all the same (this family's too: deleting a flow only re-balances it).
        self._commit(result, snapshot, ops_of, committed, lambda: (old_rs, new_rs))
        self.batches.forget_clients(planned, changing)
        return self.cleanup.stale(old_rs, new_rs, snapshot, result.conntrack)

    def _commit(
        self,
        result: SyncResult,
        snapshot: ClusterSnapshot,
        ops_of: Callable[[Family], tuple[list[Operation], int]],
        committed: Callable[[Family, list[Operation]], None],
        partial: Callable[[], tuple[list[Ruleset], list[Ruleset]]],
    ) -> None:
        """Send each family's operations as one batch, in ``FAMILIES`` order, timed into
        ``result``.

        Args:
            result: gets the time spent diffing and committing, and the operations per family.
            snapshot: what is being synced (for conntrack cleanup after a rejection).
            ops_of: a family's operations (timed as diffing) and how many of them only make
                the table this process's (not counted).
            committed: called once the kernel accepted a family's operations (or there were
                none), so the cache follows.
            partial: the rulesets whose frontends were (0) and are (1) programmed in the
                families committed so far; read when a later family's batch is rejected, as
                those lost endpoints all the same and their flows are deleted first.

        Raises:
            KernelError: the kernel rejected a family's batch (``batches.failed`` names it).
        """
        self.records.begin()
        health = result.health_checks = self.keeper.health(result.plan)
        for family in FAMILIES:
            t = time.perf_counter()
            ops, claim = self.health.joined(family, health, *ops_of(family))
            ops, claim = self.records.recording(family, ops, claim)
            result.diff_ms += (time.perf_counter() - t) * 1000
            if ops:
                t = time.perf_counter()
                try:
                    self.batches.apply(family, ops)
                except KernelError:
                    if result.total_ops:
                        self.cleanup.stale(*partial(), snapshot, result.conntrack)
                    raise
                result.commit_ms += (time.perf_counter() - t) * 1000
            committed(family, ops)
            self.health.committed(self._programmed.get(family))
            result.ops[family] = count_ops(ops) - claim
        self._send(self.records.outstanding())

    def _adopt(self, planned: Plan, result: SyncResult) -> None:
        """A restart the records vouch for: the plan is what is programmed (no diff)."""
        self._share(planned)
        for family in FAMILIES:
            result.ops[family] = 0
        result.health_checks = self.health.adopt(self.keeper.health(planned))
        self._seeded = True
        result.restarted = True
        self.log.info("sync.restart_trusted", digest=self.records.digest)

    def _trust(self, snapshot: ClusterSnapshot) -> SyncResult:
        """A restart the records vouch for, not planned yet (``plan_after_restart``): the
        tables hold the plan of ``snapshot``, which the next sync plans."""
        result = SyncResult(restarted=True, ops=dict.fromkeys(FAMILIES, 0))
        self._unplanned = snapshot
        self._seeded = True
        self.log.info("sync.restart_trusted", digest=self.records.digest, planned=False)
        return result

    def _plan_trusted(self, snapshot: ClusterSnapshot) -> None:
        """Plan what a trusted restart left unplanned (``_trust``): that plan is what is
        programmed, and the cache is in step with it."""
        self._unplanned = None
        planned = plan(snapshot, self.config)
        if self.incremental:
            attach(planned, snapshot)
        self._last_plan = planned
        self._adopt(planned, SyncResult())
        self._in_step = True

    def repair(
        self,
        tables: dict[Family, Ruleset | None],
        repairs: dict[Family, list[Operation]],
        version: int,
        snapshot: ClusterSnapshot,
        prepared: Repair | None = None,
    ) -> int | None:
        """Commit ``repairs`` (``repair_ops`` of the tables read back at ``version``), so the
        kernel holds the last plan again; flows the drift's endpoints had are cleaned up as a
        full sync would. Returns the operations sent, or None when a sync ran since (read back
        again). The next sync goes on from the plan, in place.

        ``prepared`` (``prepare_repair`` of the same read-back) saves the passes over whole
        tables; without it they are made here.

        Raises:
            KernelError: the kernel refused a repair (someone changed the table again): the
                caller reads back before its next sync.
        """
        planned = self._last_plan
        if self.verifier.version != version or planned is None:
            return None
        if prepared is None or prepared.version != version:
            wanted = self._programs(planned)
            assert wanted is not None, "a plan is given"
            prepared = self.verifier.prepare_repair(tables, repairs, version, wanted)
            assert prepared is not None, "the version was checked above"
        with self.verifier.changing():  # a repair changes the cache as a sync does
            self.settle()
            self.batches.forget()  # their view of chains and sets is as stale as the cache
            self._in_step = False
            # A large repair (a table deleted) carries traffic again after its first batches;
            # the elements no packet needs to reach an endpoint follow (``verify.staged``).
            firsts, laters = staged(
                {f: repairs.get(f) or [] for f in FAMILIES}, self.repair_stage_at
            )
            # After each first batch, the next sync writes the records again.
            self.health.forget()
            sent = self.batches.apply_staged(firsts, laters, self.records.forget)
            self._share(planned)  # a family without repairs was read back equal to it
            if prepared.frontends is not None:
                old, new = prepared.frontends
                self.cleanup.between(old, new, snapshot, {})
            self._in_step = True
            self.retry_left_out()
            return sent

    def retry_left_out(self) -> None:
        """After a full verify: services the kernel refused are tried again (what it refused
        may have been a conflict that is gone now); the next sync compares everything."""
        if self.isolation.excluded:
            self.isolation.retry_all()
            self._in_step = False
            self.records.look_at_all()

    def close(self) -> None:
        self.batches.close()
        self.kernel.readback.close()
