"""The inspector inside the daemon: re-check endpoint reachability on rtnetlink events.

After each sync and whenever links, routes or neighbours change (no polling), the endpoints of
the current plan are classified (``inspect.classify``). Each transition gets one log line, and
the gauge ``nlproxy_endpoint_unreachable{service,endpoint,reason}`` follows the current verdicts
(up to ``SERIES_LIMIT`` series; ``nlproxy_unreachable_endpoints`` counts the addresses).
With ``exclude`` on, the daemon leaves unreachable endpoints out of load balancing
(:func:`without_unreachable`), but never a service's last endpoints: the inspector alone never
leaves a service with none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import replace
from operator import attrgetter

import msgspec
import trio
from prometheus_client import CollectorRegistry, Gauge

from nlproxy.cluster.model import (
    ClusterSnapshot,
    Endpoint,
    EndpointSlice,
    IPAddress,
    ServiceKey,
    ServicePortRef,
)
from nlproxy.errors import NlproxyError
from nlproxy.inspect.classify import Reachability, address_order, classify, transitions
from nlproxy.inspect.rtnl import NodeRoutes, RtnlNode
from nlproxy.inspect.watch import RouteWatcher
from nlproxy.log import get_logger
from nlproxy.proxy.endpoints import addresses
from nlproxy.proxy.planner import PortPlan

LOG_LIMIT = 20
"""At most this many per-endpoint lines per evaluation; the rest is summarised."""
SERIES_LIMIT = 1000
"""At most this many ``nlproxy_endpoint_unreachable`` series: when a node loses its routes, every
endpoint of the cluster is unreachable, and 100k series would cost ~85 MB and slow each scrape.
``nlproxy_unreachable_endpoints`` always counts them all."""
RETRY_AFTER = 5.0
"""Seconds before classifying again after a failed pass."""
PLAN_SETTLE = 1.0
"""Seconds to coalesce plan changes before re-classifying (route events are handled at once)."""


def without_unreachable(snapshot: ClusterSnapshot, bad: frozenset[IPAddress]) -> ClusterSnapshot:
    """``snapshot`` with unreachable endpoints removed, except a service's last ready ones.
    Only endpoints that could serve (ready or serving) are removed: the others are in no plan
    anyway, and the inspector would otherwise hold them (:func:`left_out`) for nothing."""
    if not bad:
        return snapshot
    slices: dict[ServiceKey, tuple[EndpointSlice, ...]] = {}
    for key, group in snapshot.slices.items():
        ready = [e for s in group for e in s.endpoints if e.ready]
        if not any(_out(e, bad) for s in group for e in s.endpoints) or all(
            e.ip in bad for e in ready
        ):
            slices[key] = group
            continue
        slices[key] = tuple(
            msgspec.structs.replace(s, endpoints=tuple(e for e in s.endpoints if not _out(e, bad)))
            for s in group
        )
    return replace(snapshot, slices=slices)


def _out(e: Endpoint, bad: frozenset[IPAddress]) -> bool:
    """Whether :func:`without_unreachable` leaves ``e`` out (where it leaves any out)."""
    return (e.ready or e.serving) and e.ip in bad


def left_out(
    snapshot: ClusterSnapshot, filtered: ClusterSnapshot, bad: frozenset[IPAddress]
) -> frozenset[IPAddress]:
    """The addresses :func:`without_unreachable` took out of ``snapshot`` (giving
    ``filtered``): the inspector keeps classifying them (:meth:`ReachabilityMonitor.hold`)."""
    if not bad:
        return frozenset()
    return frozenset(
        e.ip
        for key, group in snapshot.slices.items()
        if filtered.slices.get(key) is not group
        for s in group
        for e in s.endpoints
        if _out(e, bad)
    )


Ports = PortPlan | tuple[PortPlan, ...]
"""A service's ports that have cluster endpoints: the plan's own objects, not a copy of their
addresses (the plan replaces a port's object when it changes, never edits it). A service of one
port (most) is that port alone, not a tuple of it (10k tuples at 10k Services, ~0.7 MB)."""
Entry = Ports | frozenset[IPAddress]
"""What the index holds per key: a service's :data:`Ports`, or under :data:`HELD` the addresses
the exclusion took out of the plan (:meth:`ReachabilityMonitor.hold`)."""
HELD = ServiceKey(namespace="", name="")
"""The index's key for the held addresses (no Service has an empty name)."""


class ReachabilityMonitor:
    """Classifies the plan's endpoints now and on every route change.

    Endpoints are tracked per service, so a sync that changed a few services costs work for
    those only: their endpoints new to the node are classified, gone ones dropped. Verdicts are
    interned (most endpoints share one, e.g. "remote via node X"), so 100k endpoints cost little.

    What is kept between passes is small beside the plan: the verdicts (one entry per address,
    the only per-address table), each service's port plans (shared with the plan, no addresses
    copied), and a count only for the addresses more than one service uses. At 10k Services x
    10 endpoints a count per address and a copy of every port's addresses were ~8 MB more.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        netns: str | None = None,
        node: NodeRoutes | None = None,
        on_change: Callable[[frozenset[IPAddress]], None] | None = None,
    ) -> None:
        self.netns = netns
        self.node = node or RtnlNode(netns)
        self.on_change = on_change
        self.log = get_logger("inspector")
        self.gauge = Gauge(
            "nlproxy_endpoint_unreachable",
            "Endpoints this node cannot reach through its routes (1 per endpoint and service)",
            ["service", "endpoint", "reason"],
            registry=registry,
        )
        self.total = Gauge(
            "nlproxy_unreachable_endpoints",
            "Endpoint addresses this node cannot reach through its routes",
            registry=registry,
        )
        self.verdicts: dict[IPAddress, Reachability] = {}
        self._by_service: dict[ServiceKey, Entry] = {}
        # The index beside the verdicts (the worker's alone, see ``_take``): an address is in
        # use while it has a verdict not ``_dropped`` or is ``_pending`` (no verdict yet: new,
        # or a failed pass's); ``_shared`` counts the services of those more than one uses.
        self._shared: dict[IPAddress, int] = {}
        self._pending: set[IPAddress] = set()
        self._dropped: dict[IPAddress, None] = {}
        self._updates: dict[ServiceKey, Entry] = {}
        self._rebuild: dict[ServiceKey, Entry] | None = None
        self._held: frozenset[IPAddress] = frozenset()
        self._wake = trio.Event()
        self._failing: str | None = None  # the failure of the pass before (retries: debug)
        self._ran = False  # whether :meth:`run` ran before
        self.unreachable: frozenset[IPAddress] = frozenset()

    def plan_changed(
        self, ports: Mapping[ServicePortRef, PortPlan], changed: Set[ServiceKey] | None
    ) -> None:
        """Note a new plan: ``changed`` services only, or everything when None.

        The Syncer updates its plan in place on the next sync (a changed port gets a new
        object), so the port plans are taken now, not the mapping.
        """
        if changed is None:
            rebuild: dict[ServiceKey, Entry] = {**_group(ports.values())}
            if self._held:
                rebuild[HELD] = self._held
            self._rebuild = rebuild
            self._updates.clear()
        elif changed:
            fresh = _group(p for ref, p in ports.items() if ref.service in changed)
            for key in changed:
                self._updates[key] = fresh.get(key, ())
        else:
            return
        self._wake.set()

    def hold(self, left_out: frozenset[IPAddress]) -> None:
        """The addresses the exclusion took out of the plan it is given now (:func:`left_out`):
        they stay classified, at every route change too, as if a service used them. Else an
        excluded address would leave the index with the plan, out of the unreachable set, and
        be back in the plan at the next sync, excluded again a pass later: every second."""
        if left_out == self._held:
            return
        self._held = left_out
        if self._rebuild is not None:
            if left_out:
                self._rebuild[HELD] = left_out
            else:
                self._rebuild.pop(HELD, None)
        else:
            self._updates[HELD] = left_out
        self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Re-classify on plan changes and rtnetlink events until cancelled.

        A route, link or neighbour event re-classifies every endpoint; a plan change only the
        endpoints that are new to the node (the routes did not change).

        Cancellation: returns at the next wait; the rtnetlink socket is closed.
        """
        with RouteWatcher(self.netns) as watcher:
            task_status.started()
            # A run after another (the daemon restarts a failed inspector) classifies every
            # endpoint at once: the route events since the last one's watcher closed are lost.
            failed, self._ran = self._ran, True
            while True:
                if failed:  # again at once (after the pause), and every endpoint
                    failed = not await self._evaluate_guarded(full=True)
                    continue
                routes_changed = False
                async with trio.open_nursery() as nursery:

                    async def route_event(cancel: trio.CancelScope = nursery.cancel_scope) -> None:
                        nonlocal routes_changed
                        await watcher.changed()
                        watcher.drain()
                        routes_changed = True
                        cancel.cancel()

                    async def plan_event(cancel: trio.CancelScope = nursery.cancel_scope) -> None:
                        await self._wake.wait()
                        await trio.sleep(PLAN_SETTLE)  # a burst of syncs: classify once
                        cancel.cancel()

                    nursery.start_soon(route_event)
                    nursery.start_soon(plan_event)
                self._wake = trio.Event()
                failed = not await self._evaluate_guarded(full=routes_changed)

    async def _evaluate_guarded(self, *, full: bool) -> bool:
        """:meth:`_evaluate`, but a failure (a netlink dump refused, say) is logged and retried
        after ``RETRY_AFTER`` seconds: the inspector only reports, it must never stop the proxy.

        A failure is said once while it lasts (pyroute2 unimportable lasts until a reinstall):
        a retry failing the same way as the pass before it is a debug line, any other failure
        (named or not, whatever came between) is said again, and the first pass that works
        after any failure says so."""
        try:
            await self._evaluate(full=full)
        except Exception as exc:  # said and retried: the inspector only reports
            named = isinstance(exc, NlproxyError)  # a dump refused, pyroute2 unimportable
            error = str(exc) if named else f"{type(exc).__name__}: {exc}"
            if error == self._failing:
                self.log.debug("inspector.failed", error=error, retry_in=RETRY_AFTER)
            elif named:
                self.log.warning("inspector.failed", error=error, retry_in=RETRY_AFTER)
            else:  # not foreseen: logged in full, once
                self.log.exception("inspector.failed", error=error, retry_in=RETRY_AFTER)
            self._failing = error
            await trio.sleep(RETRY_AFTER)
            return False
        if self._failing is not None:
            self.log.info("inspector.recovered", after=self._failing)
            self._failing = None
        return True

    def _take(
        self, rebuild: dict[ServiceKey, Entry] | None, updates: dict[ServiceKey, Entry]
    ) -> list[IPAddress]:
        """Apply noted plan changes to the index: a whole new one (``rebuild``), then
        ``updates`` per service; returns the addresses to classify (new to the node, or used
        again after being dropped), and marks those no service uses any more ``_dropped``.

        Runs in the classification's worker thread: at 10k Services x 10 endpoints a rebuild
        is ~0.4 s of Python (more on a loaded node), which on the event loop held every other
        task back after each full sync, a stop's cancellation included. The index is this
        method's alone (the loop only notes changes, and reads it in ``_export`` after).
        """
        if rebuild is not None:
            return self._take_all(rebuild, updates)
        known, pending, dropped, shared = self.verdicts, self._pending, self._dropped, self._shared
        added: dict[IPAddress, None] = {}
        for key, new in updates.items():
            old = self._by_service.pop(key, ())
            if new:
                self._by_service[key] = new
            new_ips, old_ips = _addresses(new), _addresses(old)
            for ip in new_ips:
                if ip in old_ips:
                    continue
                if ip in shared:
                    shared[ip] += 1
                elif (ip in known and ip not in dropped) or ip in pending or ip in added:
                    shared[ip] = 2
                else:  # new to the node, or dropped meanwhile: classified (again)
                    dropped.pop(ip, None)
                    added[ip] = None
            for ip in old_ips:
                if ip in new_ips:
                    continue
                n = shared.pop(ip, 1)
                if n > 2:
                    shared[ip] = n - 1
                elif n == 1:  # its last user
                    pending.discard(ip)
                    added.pop(ip, None)
                    dropped[ip] = None
        return list(added)

    def _take_all(
        self, rebuild: dict[ServiceKey, Entry], updates: dict[ServiceKey, Entry]
    ) -> list[IPAddress]:
        """:meth:`_take` with a whole new index: each address's services counted afresh (each
        service's addresses once, ``updates`` applied to the counts) and compared with the
        verdicts; the counts are kept only for the addresses that more than one service uses."""
        users: dict[IPAddress, int] = {}
        for ports in rebuild.values():
            for ip in _addresses(ports):
                users[ip] = users.get(ip, 0) + 1
        for key, new in updates.items():
            old = rebuild.pop(key, ())
            if new:
                rebuild[key] = new
            for ip in _addresses(new):
                users[ip] = users.get(ip, 0) + 1
            for ip in _addresses(old):
                if (n := users[ip]) > 1:
                    users[ip] = n - 1
                else:
                    del users[ip]
        known, pending, dropped = self.verdicts, self._pending, self._dropped
        if pending or dropped:
            added = [ip for ip in users if ip not in known or ip in dropped or ip in pending]
        else:
            added = [ip for ip in users if ip not in known]
        dropped.clear()
        dropped.update(dict.fromkeys(ip for ip in known if ip not in users))
        self._pending = set()  # in ``added`` if still used
        self._shared = {ip: n for ip, n in users.items() if n > 1}
        self._by_service = rebuild
        return added

    async def _evaluate(self, *, full: bool) -> None:
        rebuild, self._rebuild = self._rebuild, None
        updates, self._updates = self._updates, {}
        known = self.verdicts

        def work() -> tuple[dict[IPAddress, Reachability], dict[IPAddress, Reachability]]:
            added = self._take(rebuild, updates)
            dropped, pending = self._dropped, self._pending
            if full:  # none is in two of these: ``added`` is neither dropped nor pending
                todo = [ip for ip in known if ip not in dropped] if dropped else list(known)
                todo += (ip for ip in added if ip not in known)
                todo += (ip for ip in pending if ip not in known)
            else:
                todo = added
            try:
                fresh = classify(todo, node=self.node) if todo else {}
            except BaseException:  # the next pass (a full one) classifies them
                pending.update(added)
                raise
            # Only once classified: a failed pass leaves them for the next.
            gone = {ip: known.pop(ip) for ip in dropped if ip in known}
            self._dropped = {}
            if pending:  # a new set: a set keeps its table's size when emptied
                self._pending = set() if full else {ip for ip in pending if ip not in fresh}
            return gone, fresh

        gone, fresh = await trio.to_thread.run_sync(work, abandon_on_cancel=True)
        before = {ip: known[ip] for ip in fresh if ip in known}
        before.update(gone)
        known.update(fresh)
        if before:
            self._log_transitions(transitions(before, {ip: known[ip] for ip in fresh}))
        elif fresh:
            self._log_first(fresh)
        if full:
            bad = frozenset(ip for ip, v in known.items() if not v.reachable)
        elif fresh or gone:  # the set before, with what this pass changed (not 100k looked at)
            fine = (ip for ip, v in fresh.items() if v.reachable)
            bad = self.unreachable.difference(gone, fine)
            bad |= {ip for ip, v in fresh.items() if not v.reachable}
        else:
            bad = self.unreachable
        self._export(bad)
        if bad != self.unreachable:
            self.unreachable = bad
            if self.on_change is not None:
                self.on_change(bad)

    def _log_first(self, fresh: Mapping[IPAddress, Reachability]) -> None:
        """What :meth:`_log_transitions` logs when none of ``fresh`` had a verdict before (a
        start: every endpoint is new), without a transition per endpoint: the unreachable ones
        (usually few) in address order, and the summary counts the rest by kind."""
        bad = sorted((ip for ip, v in fresh.items() if not v.reachable), key=address_order)
        kinds: dict[str, int] = {}
        for v in fresh.values():
            kinds[v.kind] = kinds.get(v.kind, 0) + 1
        self._log_transitions([(ip, None, fresh[ip]) for ip in bad], len(fresh), kinds)

    def _log_transitions(
        self,
        changes: list[tuple[IPAddress, Reachability | None, Reachability | None]],
        total: int | None = None,
        kinds: dict[str, int] | None = None,
    ) -> None:
        """One line per transition to or from unreachable; new and vanished endpoints that are
        fine, and any flood beyond ``LOG_LIMIT`` lines, go into one summary line. ``total`` and
        ``kinds``, when given, count transitions that ``changes`` leaves out (the fine ones)."""
        interesting = [
            c
            for c in changes
            if (c[1] is not None and not c[1].reachable)
            or (c[2] is not None and not c[2].reachable)
        ]
        for ip, old, new in interesting[:LOG_LIMIT]:
            self.log.info(
                "endpoint.reachability",
                endpoint=str(ip),
                was=old.kind if old else None,
                now=new.kind if new else None,
                reachable=new.reachable if new else None,
                reason=new.reason if new else "no longer an endpoint",
            )
        total = len(changes) if total is None else total
        if total > min(len(interesting), LOG_LIMIT):
            if kinds is None:
                kinds = {}
                for _, _, new in changes:
                    key = new.kind if new else "gone"
                    kinds[key] = kinds.get(key, 0) + 1
            self.log.info(
                "endpoint.reachability_summary",
                transitions=total,
                logged=min(len(interesting), LOG_LIMIT),
                now=kinds,
            )

    def _export(self, bad: frozenset[IPAddress]) -> None:
        """The gauges: the count, and one series per unreachable endpoint and service port using
        it, up to ``SERIES_LIMIT`` (the first services in key order)."""
        self.gauge.clear()
        self.total.set(len(bad))
        if not bad:
            return
        left = SERIES_LIMIT
        # A first look by number, hashed in C (an address hashes in Python): most ports use
        # none of ``bad``. IPv4 and IPv6 numbers can be equal: the addresses decide after.
        numbers = frozenset(map(_number, bad))
        for key in sorted(self._by_service):
            entry = self._by_service[key]
            if isinstance(entry, frozenset):  # held: in no plan port to name
                continue
            for port in _each(entry):
                if numbers.isdisjoint(map(_number, addresses(port.cluster_endpoints))):
                    continue
                ref = ""
                for ip in bad.intersection(addresses(port.cluster_endpoints)):
                    if left == 0:
                        return
                    left -= 1
                    ref = ref or str(port.ref)
                    reason = self.verdicts[ip].reason
                    self.gauge.labels(service=ref, endpoint=str(ip), reason=reason).set(1)


_number = attrgetter("_ip")
"""An address's number (``int(ip)`` without a call in Python)."""


def _each(ports: Ports) -> tuple[PortPlan, ...]:
    return (ports,) if isinstance(ports, PortPlan) else ports


def _addresses(ports: Entry) -> Mapping[IPAddress, None]:
    """A service's addresses over all its ports, each once (or the held ones)."""
    if isinstance(ports, frozenset):
        return dict.fromkeys(ports)
    if isinstance(ports, PortPlan):
        return dict.fromkeys(addresses(ports.cluster_endpoints))
    return dict.fromkeys(ip for p in ports for ip in addresses(p.cluster_endpoints))


def _group(plans: Iterable[PortPlan]) -> dict[ServiceKey, Ports]:
    """Service → its ports that have cluster endpoints, in the plan's order."""
    out: dict[ServiceKey, Ports] = {}
    for plan in plans:
        if plan.cluster_endpoints:
            key = plan.ref.service
            had = out.get(key)
            out[key] = plan if had is None else (*_each(had), plan)
    return out
