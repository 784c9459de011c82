"""Holding the load-balancing opt-ins to their element budget, and saying what was not understood.

Sits inside the Syncer, before isolation and planning: each sync, the Services past the budget
of ``proxy/budget.py`` are handed to the planner as random-choice Services (the same replaced
object each time, so the incremental planner sees them change only when their status does), and
the Services whose status changed are added to the changed set. Each Service past the budget,
or with an annotation value nlproxy does not know (``Service.annotation_warnings``), is logged
once, when it starts (and once more when it ends); :attr:`BalancingGuard.counts` feeds the
``nlproxy_load_balancing_defaulted_services`` gauge. Demands are cached per Service and slice
objects, so a sync costs a pass over the Services, not over their endpoints. No I/O but the log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import replace
from typing import TYPE_CHECKING

import msgspec

from nlproxy.cluster.model import (
    ClusterSnapshot,
    EndpointSlice,
    LoadBalancing,
    Service,
    ServiceKey,
)
from nlproxy.nft.ir import Ruleset
from nlproxy.proxy import naming as n
from nlproxy.proxy.budget import Fallback, admit, choice, demand

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

    from nlproxy.sync.restart import RestartRecords

UNKNOWN_ANNOTATION = "unknown annotation"
REASONS = (UNKNOWN_ANNOTATION, "service budget", "node budget")
"""The ``reason`` label values of the gauge."""
LOGGED = 10
"""Services one sync logs by name as past the budget or back within it."""

WHOLE = 4
"""What the pass over the changed keys costs per key (a ServiceKey's hash is Python code), in
units of what the pass over every Service costs per Service left unchanged."""
OPTED = 12
"""What the pass over every Service costs more per opted-in Service left unchanged (its demand
looked up), in the same units. :meth:`BalancingGuard.apply` takes the cheaper pass: with
random choice the node's default, the whole pass past about a fifth of the Services changed;
with every Service opted in, only when nearly all did."""


class BalancingGuard:
    """Applies the budget to each snapshot the Syncer is given (see the module docstring)."""

    def __init__(
        self, default: LoadBalancing, log: FilteringBoundLogger, *, quota: int | None = None
    ) -> None:
        self.default = default
        self.log = log
        self.fallbacks: dict[ServiceKey, Fallback] = {}
        self._demands: dict[
            ServiceKey, tuple[Service, tuple[EndpointSlice, ...], LoadBalancing, int]
        ] = {}
        self._substitutes: dict[ServiceKey, Service] = {}
        """Services planned with random choice (past the budget, or deferred and new) → the
        object handed to the planner instead; ``_originals`` holds what it replaces."""
        self._originals: dict[ServiceKey, Service] = {}
        self._warned: dict[ServiceKey, tuple[Service, tuple[str, ...]]] = {}
        self.quota = quota
        """Most elements of tables one sync may (re)build; None: no limit (``run --once``)."""
        self.deferred: set[ServiceKey] = set()
        """Services whose tables wait for the next sync (the loop syncs again at once)."""
        self._was_deferred: set[ServiceKey] = set()
        self._handed: dict[ServiceKey, tuple[Service, tuple[EndpointSlice, ...]]] = {}
        self._primed = False

    def reconfigure(self, default: LoadBalancing) -> None:
        """Plan Services that ask for no algorithm with ``default`` from the next snapshot on."""
        self.default = default

    @property
    def counts(self) -> dict[str, int]:
        """Services kept on the default now, by reason."""
        out = dict.fromkeys(REASONS, 0)
        out[UNKNOWN_ANNOTATION] = len(self._warned)
        for fb in self.fallbacks.values():
            out[fb.reason] += 1
        return out

    def apply(
        self,
        snapshot: ClusterSnapshot,
        changed: Set[ServiceKey] | None,
        *,
        unlimited: bool = False,
    ) -> tuple[ClusterSnapshot, Set[ServiceKey] | None]:
        """``snapshot`` as it is to be planned now, and ``changed`` to match (None stays None:
        everything is compared).

        Services past the budget are on random choice; with a :attr:`quota`, opted-in Services
        whose tables would be (re)built past it wait for a later sync, named in
        :attr:`deferred`: one already programmed with its tables keeps the objects it was
        planned from, a new one starts on random choice. ``unlimited``: no quota this time.
        """
        # Only the Services ``changed`` names (and those deferred) can differ from the last
        # call: at 10k Services a pass over all of them is most of an incremental sync. A pass
        # over every Service (None) is always right, and the cheaper one when ``changed`` names
        # a good share of them and few opt in (a first sync, a relist; see ``OPTED``).
        keys = (
            None
            if changed is None or not self._primed or self._whole(len(changed), snapshot)
            else set(changed) | self.deferred
        )
        self._primed = True
        self._annotations(snapshot, keys)
        flipped: set[ServiceKey] = set()
        fallbacks = self.fallbacks
        updated = self._update_demands(snapshot, keys)
        demands = self._demands
        if updated:
            fallbacks = admit(snapshot.services, {k: v[2:] for k, v in demands.items()})
            flipped = set(fallbacks.keys() ^ self.fallbacks.keys())
            flipped |= {
                k
                for k in fallbacks.keys() & self.fallbacks.keys()
                if fallbacks[k] != self.fallbacks[k]
            }
            self._report(snapshot, fallbacks, flipped)
        refallen = fallbacks is not self.fallbacks
        self.fallbacks = fallbacks
        candidates = None if keys is None else (keys | flipped) & demands.keys()
        keep_old, deferred_new = self._defer(
            snapshot,
            fallbacks,
            candidates,
            refallen=refallen,
            quota=None if unlimited else self.quota,
        )
        if changed is not None:
            changed = (set(changed) | flipped | self._was_deferred) - keep_old.keys()
        self._was_deferred = self.deferred
        return self._substituted(snapshot, keys, refallen, deferred_new, keep_old), changed

    def _whole(self, changing: int, snapshot: ClusterSnapshot) -> bool:
        """Whether the pass over every Service costs less than the one over ``changing`` keys,
        by the opted-in Services of the last pass (see ``OPTED``)."""
        total = len(snapshot.services)
        kept = max(total - changing, 0)
        return changing * WHOLE * total > kept * (total + OPTED * len(self._demands))

    def _substituted(
        self,
        snapshot: ClusterSnapshot,
        keys: set[ServiceKey] | None,
        refallen: bool,
        deferred_new: set[ServiceKey],
        keep_old: dict[ServiceKey, tuple[Service, tuple[EndpointSlice, ...]]],
    ) -> ClusterSnapshot:
        """``snapshot`` with the Services past the budget or deferred and new on random choice,
        and the deferred ones already programmed as they were planned last."""
        fallbacks = self.fallbacks
        # Substitutes change only for the Services ``keys`` names, unless the fallbacks did.
        # (Set operations over 10k ServiceKeys cost milliseconds: their hash is Python code.)
        subs, originals = self._substitutes, self._originals
        todo: Iterable[ServiceKey] = (
            keys
            if keys is not None and not refallen
            else (subs.keys() | fallbacks.keys() | deferred_new)
        )
        for key in todo:
            svc = snapshot.services.get(key)
            if svc is None or not (key in fallbacks or key in deferred_new):
                subs.pop(key, None)
                originals.pop(key, None)
            elif originals.get(key) is not svc:
                originals[key] = svc
                subs[key] = msgspec.structs.replace(svc, load_balancing=LoadBalancing.RANDOM)
        if not (subs or keep_old):
            return snapshot
        services = dict(snapshot.services)
        services.update(subs)  # dict into dict: the stored hashes, no __hash__ calls
        if not keep_old:
            return replace(snapshot, services=services)
        slices = dict(snapshot.slices)
        for key, (svc, old_slices) in keep_old.items():
            services[key] = svc
            slices[key] = old_slices
        return replace(snapshot, services=services, slices=slices)

    def _report(
        self,
        snapshot: ClusterSnapshot,
        fallbacks: Mapping[ServiceKey, Fallback],
        flipped: set[ServiceKey],
    ) -> None:
        """Log each Service that went past the budget or came back within it; past
        :data:`LOGGED`, one line with the count (a node default of consistent hashing over
        thousands of Services would otherwise log thousands of lines)."""
        ordered = sorted(flipped)
        for key in ordered[:LOGGED]:
            fb = fallbacks.get(key)
            if fb is not None:
                self.log.warning("service.over_budget", service=str(key), error=str(fb))
            elif key in snapshot.services:
                self.log.info("service.within_budget", service=str(key))
        if len(ordered) > LOGGED:
            over = sum(1 for k in ordered[LOGGED:] if k in fallbacks)
            self.log.warning(
                "service.over_budget",
                services=len(ordered) - LOGGED,
                over=over,
                error=f"{len(ordered) - LOGGED} more Services changed budget status, {over} of "
                "them past it (see explain and nlproxy_load_balancing_defaulted_services)",
            )

    def _defer(
        self,
        snapshot: ClusterSnapshot,
        fallbacks: Mapping[ServiceKey, Fallback],
        candidates: set[ServiceKey] | None,
        *,
        refallen: bool,
        quota: int | None,
    ) -> tuple[dict[ServiceKey, tuple[Service, tuple[EndpointSlice, ...]]], set[ServiceKey]]:
        """Hand the planner at most ``quota`` elements of tables to (re)build, oldest
        Services first, of the ``candidates`` (None: every opted-in Service); returns the
        deferred ones to plan as before (their old objects) and the deferred new ones (to plan
        with random choice meanwhile)."""
        demands, handed = self._demands, self._handed
        prune = (
            list(handed) if candidates is None else [*candidates, *(fallbacks if refallen else ())]
        )
        for key in prune:
            if key not in demands or key in fallbacks:
                handed.pop(key, None)
        keep_old: dict[ServiceKey, tuple[Service, tuple[EndpointSlice, ...]]] = {}
        deferred: set[ServiceKey] = set()
        deferred_new: set[ServiceKey] = set()
        pool = demands.keys() if candidates is None else candidates
        dirty = []
        for key in pool:
            if key in fallbacks:
                continue
            svc, slices, _, _ = demands[key]
            last = handed.get(key)
            if last is None or not _same_service(last[0], svc) or not _same(last[1], slices):
                dirty.append(key)  # not planned from these objects yet: tables to build
        used = 0
        for key in sorted(dirty, key=self._age(snapshot)):
            svc, slices, _, elements = demands[key]
            if quota is None or used == 0 or used + elements <= quota:
                used += elements
                handed[key] = (svc, slices)
                continue
            deferred.add(key)
            last = handed.get(key)
            if last is not None and _same_object(last[0], svc):
                keep_old[key] = last
            else:  # new, or deleted and created again since (its old rules are another's)
                deferred_new.add(key)
        self.deferred = deferred
        return keep_old, deferred_new

    def built(self, has_tables: Callable[[Service], bool]) -> None:
        """A restart found programmed the tables of the opted-in Services ``has_tables``
        answers for: they count as built from their objects of the last :meth:`apply` (their
        next plan costs a diff, not the quota), the others as still to build.

        Call it after an ``unlimited`` :meth:`apply` of the snapshot to be synced, before the
        one that plans it.
        """
        self._handed = {
            key: (svc, slices)
            for key, (svc, slices, _, _) in self._demands.items()
            if key not in self.fallbacks and has_tables(svc)
        }

    def seed(
        self,
        snapshot: ClusterSnapshot,
        records: RestartRecords,
        read_back: Callable[[], Iterable[Ruleset | None]],
    ) -> bool:
        """Before a first sync under a quota of tables: the round-robin and consistent-hash
        tables a previous process built are kept, not rebuilt a quota at a time with random
        choice meanwhile (clients would move at every restart).

        The ``records`` vouch for the plan of ``snapshot`` with every table, or the tables are
        read back (``read_back``, as the sync would) and the Services whose maps are there
        count as built (:meth:`found`).

        Returns whether the records vouch for the tables: then nothing is deferred, the
        snapshot this sync plans is ``full`` (the same objects) and the digest taken here is
        its digest. The digest is taken only when the tables carry records that could vouch
        for some inputs (not at a first start).
        """
        full, _ = self.apply(snapshot, None, unlimited=True)
        if records.matches(take=lambda: records.take_digest(full, None, exact=False)):
            return True  # every table of ``full`` is programmed, and counts as built
        self.found(read_back())
        return False

    def found(self, tables: Iterable[Ruleset | None]) -> None:
        """:meth:`built`, the Services with tables being those whose round-robin or
        consistent-hash map of some port is among ``tables``' sets (read back at a restart).
        A map is known by its name: one of another algorithm of the same port is rebuilt by
        the next sync's diff, past the quota."""
        names: set[str] = set()
        for rs in tables:
            if rs is not None:
                names.update(rs.sets)

        def has_tables(svc: Service) -> bool:
            return any(
                n.balanced_map(local, sp.ref) in names
                for sp in svc.ports
                for local in (False, True)
            )

        self.built(has_tables)

    @staticmethod
    def _age(snapshot: ClusterSnapshot) -> Callable[[ServiceKey], tuple[bool, str, ServiceKey]]:
        def age(key: ServiceKey) -> tuple[bool, str, ServiceKey]:
            created = snapshot.services[key].created
            return (not created, created, key)

        return age

    def _update_demands(self, snapshot: ClusterSnapshot, keys: set[ServiceKey] | None) -> bool:
        """Bring the opted-in Services' demands up to date for ``keys`` (None: every Service);
        whether any changed."""
        old = self._demands
        if keys is None:
            new = {}
            default = self.default
            for key, svc in snapshot.services.items():
                if svc.load_balancing is None and default is LoadBalancing.RANDOM:
                    continue  # the common case, kept cheap: 10k Services are a pass per sync
                entry = self._entry(snapshot, key, svc, old.get(key))
                if entry is not None:
                    new[key] = entry
            self._demands = new
            return new.keys() != old.keys() or any(new[k] is not old[k] for k in new)
        changed = False
        handed = self._handed
        for key in keys:
            cur = snapshot.services.get(key)
            entry = None if cur is None else self._entry(snapshot, key, cur, old.get(key))
            if entry is None:
                changed |= old.pop(key, None) is not None
                # Out of the opted-in set (deleted, or on random choice): no longer built from
                # anything. ``_defer`` prunes only demanded keys, and a Service coming back
                # deferred would otherwise be planned from the objects it was last handed.
                handed.pop(key, None)
            elif entry is not old.get(key):
                old[key] = entry
                changed = True
        return changed

    def _entry(
        self,
        snapshot: ClusterSnapshot,
        key: ServiceKey,
        svc: Service,
        hit: tuple[Service, tuple[EndpointSlice, ...], LoadBalancing, int] | None,
    ) -> tuple[Service, tuple[EndpointSlice, ...], LoadBalancing, int] | None:
        """``svc``'s demand (``hit`` when its objects are the same), None when it opts out."""
        asked = choice(svc, self.default)
        if asked is LoadBalancing.RANDOM:
            return None
        slices = tuple(snapshot.slices.get(key, ()))
        if hit is not None and hit[0] is svc and hit[2] is asked and _same(hit[1], slices):
            return hit
        return (svc, slices, asked, demand(svc, slices, asked))

    def _annotations(self, snapshot: ClusterSnapshot, keys: set[ServiceKey] | None) -> None:
        """Warn once per Service and set of problems; forget Services that lost them."""
        warned = self._warned
        items: list[tuple[ServiceKey, Service | None]]
        if keys is None:
            items = [(k, s) for k, s in snapshot.services.items() if s.annotation_warnings]
            for key in warned.keys() - {k for k, _ in items}:
                del warned[key]
        else:
            items = [(k, snapshot.services.get(k)) for k in keys]
        for key, svc in items:
            if svc is None or not svc.annotation_warnings:
                warned.pop(key, None)
                continue
            old = warned.get(key)
            if old is None or old[1] != svc.annotation_warnings:
                for text in svc.annotation_warnings:
                    self.log.warning("service.annotation_ignored", service=str(key), error=text)
            warned[key] = (svc, svc.annotation_warnings)


def _same_service(a: Service, b: Service) -> bool:
    """Whether tables built from ``a`` are ``b``'s: the same object, or an equal one (a
    snapshot filter, such as the unreachable endpoints' exclusion, makes new objects at every
    sync for what did not change)."""
    return a is b or a == b


def _same(a: tuple[EndpointSlice, ...], b: tuple[EndpointSlice, ...]) -> bool:
    """:func:`_same_service` for a Service's slices."""
    return len(a) == len(b) and all(x is y or x == y for x, y in zip(a, b, strict=True))


def _same_object(old: Service, new: Service) -> bool:
    """Whether ``new`` is ``old`` changed, not a Service deleted and created again under its
    name: planning a deferred ``new`` from ``old`` would program the deleted one's ClusterIPs,
    which the API server may since have given to another Service."""
    return old.uid == new.uid and old.created == new.created and old.cluster_ips == new.cluster_ips
