"""What the sync loop tells the outside: metrics, health, and the log lines about objects.

Sits beside the loop (``loop.py``), which schedules syncs and calls a :class:`SyncReporter` at
each step: a change queued, a drift reported, a read-back done, a sync's objects taken, a sync
failed or applied. The reporter owns what reporting needs across syncs: the change events
pending (kube-proxy's ``*_changes_pending`` gauges count events, not services), the invalid
objects and refused frontends already logged, the orphan slices a full verify found, the
families whose NodePorts no address accepts, the EndpointSlice trigger times already observed
(the programming latency) and the per-service counts of ``no_local_endpoints``. It decides
nothing about when to sync.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import trio

from nlproxy.cluster.model import Change, ClusterSnapshot, Node, ObjectRef, Replace, ServiceKey
from nlproxy.cluster.state import ClusterState
from nlproxy.nft.ir import Family
from nlproxy.nft.monitor import Drift
from nlproxy.proxy.addresses import nodeport_gaps
from nlproxy.proxy.config import ProxyConfig
from nlproxy.serve.health import HealthState
from nlproxy.serve.metrics import IP_FAMILIES, Metrics, NoLocalEndpoints
from nlproxy.sync.latency import ProgrammingLatency
from nlproxy.sync.result import SyncResult

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger


class SyncReporter:
    """The loop's metrics, health and object reports (see the module docstring).

    Args:
        state: the cluster state the loop syncs (its invalid objects, refused frontends,
            orphan slices, and the slices' trigger times).
        health: what ``/healthz`` answers from.
        metrics: the registry's metrics.
        log: the loop's logger.
    """

    def __init__(
        self,
        state: ClusterState,
        *,
        health: HealthState,
        metrics: Metrics,
        log: FilteringBoundLogger,
    ) -> None:
        self.state = state
        self.health = health
        self.metrics = metrics
        self.log = log
        # Service and EndpointSlice change events since the last successful sync.
        self._pending_events = {"Service": 0, "EndpointSlice": 0}
        self._refused: set[str] = set()
        self._reported: set[str] = set()
        self._orphans: dict[ObjectRef, str] = {}
        # Whole seconds: the annotation has RFC 3339 second precision, and a change written in
        # the second the process started is still one to observe.
        self.latency = ProgrammingLatency(datetime.now(UTC).replace(microsecond=0))
        self._exported: set[tuple[str, str]] = set()  # the opt-in per-Service series
        self._gaps: dict[Family, str] = {}
        self._gaps_of: tuple[ClusterSnapshot, ProxyConfig] | None = None  # what they are of
        self._no_local = NoLocalEndpoints(metrics.no_local_endpoints)
        # Services changed since the last look for orphans: only their slices can have become
        # orphans (a slice's own change names its Service; a Service's removal, skip or
        # invalidation names itself: ``queued``). A Service list (a relist) names none of the
        # Services it drops, so the look after it takes every slice's Service.
        self._orphan_keys: set[ServiceKey] = set()
        self._orphans_anywhere = False
        self._candidates: dict[ObjectRef, str] = {}  # orphans found since the last verify

    def queued(self, changes: Sequence[Change]) -> None:
        """``changes`` were applied to the state and wait for a sync."""
        counts = _count_by_kind(changes)
        for kind in self._pending_events:
            self._pending_events[kind] += counts.get(kind, 0)
        self.metrics.service_changes_total.inc(counts.get("Service", 0))
        self.metrics.endpoint_changes_total.inc(counts.get("EndpointSlice", 0))
        self._export_pending()
        for label in IP_FAMILIES.values():  # one sync programs both families
            self.metrics.last_queued.labels(ip_family=label).set_to_current_time()
        self.health.queued(trio.current_time())
        self._note_services(changes)

    def _note_services(self, changes: Sequence[Change]) -> None:
        """The Services ``changes`` name, for the next look for orphans: the state reports
        only those that were proxied, not a skipped or invalid one that is deleted."""
        for change in changes:
            if isinstance(change, Replace):
                self._orphans_anywhere |= change.kind == "Service"
            elif change.ref.kind == "Service":
                ref = change.ref
                self._orphan_keys.add(ServiceKey(namespace=ref.namespace, name=ref.name))

    def changed(self, keys: Iterable[ServiceKey]) -> None:
        """The state reports ``keys`` changed: their programming latency runs from now, unless
        their slices carry a new trigger time."""
        if keys:
            self._orphan_keys.update(keys)
            self.latency.seen(keys, datetime.now(UTC))

    def unchanged(self, keys: Iterable[ServiceKey]) -> None:
        """``keys`` were reported changed but a sync found them as planned (``relist.py``):
        no change of theirs waits."""
        self.latency.forget(keys)

    def drift(self, drift: Drift) -> None:
        """Someone else changed the tables (``pid`` 0: notifications were lost, and the
        generations they span are not all nlproxy's commits)."""
        if drift.pid == 0:
            self.log.info("drift.notifications_lost", own=False)
        else:
            self.log.warning(
                "drift.detected", writer_pid=drift.pid, writer=drift.comm, objects=drift.objects
            )
        self.metrics.drift_repairs.labels(writer=drift.comm or "unknown").inc()

    def lost(self, after: int, upto: int, *, own: bool) -> None:
        """Notifications of the generations ``(after, upto]`` were lost; ``own``: all of them
        were this process's commits."""
        self.log.info("drift.notifications_lost", own=own, generations=[after + 1, upto])
        if not own:
            self.metrics.drift_repairs.labels(writer="(notifications lost)").inc()

    def verified(self, *, read_back: bool) -> None:
        """A full verify ran, reading the tables back or (``read_back=False``) trusting that
        no transaction touched them."""
        self.metrics.verifies.labels(read_back="true" if read_back else "false").inc()

    def compared(self, *, drift: bool, read_s: float, compare_s: float) -> None:
        """The verifier read both tables back and compared them with the plan."""
        self.verified(read_back=True)
        self.log.info(
            "verify.read_back",
            drift=drift,
            readback_ms=round(read_s * 1000, 3),
            compare_ms=round(compare_s * 1000, 3),
        )

    def node(self, node: Node | None) -> None:
        """The Node object as a sync takes it: whether load balancers may send traffic here."""
        self.health.node_seen(node)

    def objects(
        self,
        snapshot: ClusterSnapshot,
        config: ProxyConfig,
        source_errors: Sequence[str],
        *,
        verify: bool,
    ) -> None:
        """What a sync of ``snapshot`` leaves out or cannot serve: invalid objects, the
        source's own problems, refused frontends, orphan slices, NodePorts without an address.

        A slice may precede its Service from the API: an orphan is reported only when a full
        verify (``verify``) still finds it, and forgotten as soon as its Service comes.

        Only the slices of the Services that changed since the last call are looked at (at the
        sync that follows the change, not at a verify of an idle node): what the state holds
        decides alone which slices are orphans, and a slice can become one only by a change
        that names its Service. A verify looks again at those it found meanwhile.
        """
        if self._orphans_anywhere:
            self._orphan_keys.update(self.state.snapshot().slices)
            self._orphans_anywhere = False
        if self._orphan_keys:
            self._candidates.update(self._orphans_among(self._orphan_keys))
            self._orphan_keys = set()
        if verify and self._candidates:
            self._orphans.update(self._candidates)
            self._candidates = {}
        if self._orphans:
            self._orphans = self.state.orphans(self._orphans)
        self.metrics.invalid_objects.set(
            len(self.state.invalid) + len(self._orphans) + len(source_errors)
        )
        self._report_invalid(source_errors)
        # nodeport_gaps walks every Service on a node without IPv6 addresses; the state keeps
        # one snapshot object until something changes, so an idle node's verify skips it.
        last = self._gaps_of
        if last is None or last[0] is not snapshot or last[1] is not config:
            self._report_nodeport_gaps(nodeport_gaps(snapshot, config))
            self._gaps_of = (snapshot, config)

    def _orphans_among(self, keys: set[ServiceKey]) -> dict[ObjectRef, str]:
        """The orphan slices of ``keys``: the state's own check, of the slices of those that
        are not among its valid Services (the state's snapshot, the same object until it
        changes, holds every Service's slices whether or not the Service exists)."""
        snapshot = self.state.snapshot()
        services, groups = snapshot.services, snapshot.slices
        among = [
            ObjectRef(kind="EndpointSlice", namespace=eps.namespace, name=eps.name)
            for key in keys
            if key not in services
            for eps in groups.get(key, ())
        ]
        return self.state.orphans(among) if among else {}

    def trusted(self) -> None:
        """A periodic verify found that nothing could differ from the last sync (``loop.py``):
        for ``/healthz`` and the last-sync metric, the rules are as current as a sync would
        have made them."""
        self.health.synced(trio.current_time())
        for label in IP_FAMILIES.values():
            self.metrics.last_sync.labels(ip_family=label).set_to_current_time()
        self.log.debug("verify.trusted")

    def failed(self, exc: Exception, family: Family | None) -> None:
        """A sync failed; ``family``: the one whose batch the kernel refused (None: any)."""
        self.metrics.sync_failures.inc()
        for fam, label in IP_FAMILIES.items():
            if family is None or family is fam:
                self.metrics.nft_sync_failures.labels(ip_family=label).inc()
        self.log.error("sync.failed", error=str(exc))

    def synced(
        self,
        result: SyncResult,
        pending: set[ServiceKey],
        snapshot: ClusterSnapshot,
        *,
        verify: bool,
        exact: bool,
        readback_ms: float | None = None,
        repaired: bool = False,
    ) -> None:
        """A sync of the ``pending`` services succeeded (``exact``: they are exactly the
        services it changed; else any may have); ``readback_ms``: it read the tables back
        first, for that long; ``repaired``: a drift's repair went before it.

        ``sync.applied`` is an info line when the sync did something (operations, changes,
        flows, a repair or a read-back); the periodic verify of an idle node that found
        nothing to do is a debug line, not one info line every sync period."""
        now = trio.current_time()
        seconds = (result.plan_ms + result.apply_ms) / 1000
        self.health.synced(now)
        m = self.metrics
        kind = m.partial_sync_duration if result.incremental else m.full_sync_duration
        for label in IP_FAMILIES.values():  # one sync programs both families
            m.sync_duration.labels(ip_family=label).observe(seconds)
            kind.labels(ip_family=label).observe(seconds)
            m.last_sync.labels(ip_family=label).set_to_current_time()
        for family, (deleted, took) in result.conntrack.items():
            m.conntrack_deleted.labels(ip_family=IP_FAMILIES[family]).inc(deleted)
            m.conntrack_duration.labels(ip_family=IP_FAMILIES[family]).observe(took)
        self._pending_events = dict.fromkeys(self._pending_events, 0)
        self._export_pending()
        for family, n in result.ops.items():
            m.ops.labels(family=family.value).inc(n)
        # What the kernel refused or the budget left for later is not programmed yet.
        self._observe_programming(pending - result.excluded.keys() - result.deferred, snapshot)
        if result.plan is not None:
            self._no_local.update(result.plan, pending if exact else None)
        busy = bool(
            result.total_ops
            or pending
            or result.conntrack_deleted
            or repaired
            or readback_ms is not None
        )
        if busy or verify:
            log = self.log.info if busy else self.log.debug
            log(
                "sync.applied",
                ops=result.total_ops,
                duration_ms=round(seconds * 1000, 3),
                plan_ms=round(result.plan_ms, 3),
                diff_ms=round(result.diff_ms, 3),
                commit_ms=round(result.commit_ms, 3),
                incremental=result.incremental,
                services_changed=len(pending),
                verify=verify,
                conntrack_deleted=result.conntrack_deleted,
                **({} if readback_ms is None else {"readback_ms": round(readback_ms, 3)}),
            )

    def _export_pending(self) -> None:
        self.metrics.service_changes_pending.set(self._pending_events["Service"])
        self.metrics.endpoint_changes_pending.set(self._pending_events["EndpointSlice"])

    def _observe_programming(self, pending: set[ServiceKey], snapshot: ClusterSnapshot) -> None:
        """kubeproxy_network_programming_duration_seconds: one observation per trigger time, when
        the slice change that carries it is first programmed, as upstream. A Service-only edit,
        a relist after ``410 Gone`` or a verify programs no new trigger time; one older than this
        process (the initial list's) measures a wait it did not cause, and is left out too.
        Each programmed Service's own latency is kept (``latency.py``), and the slowest are
        exported when asked for (``Metrics.service_programming``)."""
        if not pending:
            return
        # ``snapshot`` is what was synced: a change received meanwhile is not programmed yet.
        observed = self.latency.programmed(pending, snapshot, datetime.now(UTC))
        for family, seconds in observed:
            # The slice's family, as upstream's proxier of that family records it.
            self.metrics.programming.labels(ip_family=family.value).observe(seconds)
        gauge = self.metrics.service_programming
        if gauge is None:
            return
        slowest = self.latency.slowest(self.metrics.slowest_services)
        series = {(str(key), lat.since): lat.seconds for key, lat in slowest}
        for labels in self._exported - series.keys():
            gauge.remove(*labels)
        for (service, since), seconds in series.items():
            gauge.labels(service=service, since=since).set(seconds)
        self._exported = set(series)

    def _report_nodeport_gaps(self, gaps: Mapping[Family, str]) -> None:
        """One warning per family whose NodePorts no address accepts (again if it changes)."""
        for family in (Family.IP, Family.IP6):
            gap = gaps.get(family)
            label = "IPv4" if family is Family.IP else "IPv6"
            self.metrics.nodeport_addresses_missing.labels(ip_family=label).set(gap is not None)
            if gap is not None and gap != self._gaps.get(family):
                self.log.warning("nodeport.no_address", ip_family=label, error=gap)
        self._gaps = dict(gaps)

    def _report_invalid(self, source: Sequence[str]) -> None:
        """One log line per newly invalid object or refused frontend, not one per sync."""
        current = {str(e) for e in (*self.state.invalid.values(), *self._orphans.values(), *source)}
        for err in sorted(current - self._reported):
            self.log.warning("object.invalid", error=err)
        self._reported = current
        refused = set(self.state.refused)
        for err in sorted(refused - self._refused):
            self.log.warning("service.refused", error=err)
        self._refused = refused
        self.metrics.refused_frontends.set(len(refused))


def _count_by_kind(changes: Sequence[Change]) -> dict[str, int]:
    """Change events per object kind (a Replace counts each object it lists)."""
    counts: dict[str, int] = {}
    for change in changes:
        refs = [c.ref for c in change.changes] if isinstance(change, Replace) else [change.ref]
        for ref in refs:
            counts[ref.kind] = counts.get(ref.kind, 0) + 1
    return counts
