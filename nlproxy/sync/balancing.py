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

from collections.abc import Callable, Mapping, Set
from dataclasses import replace
from typing import TYPE_CHECKING

from nlproxy.cluster.model import (
    ClusterSnapshot,
    EndpointSlice,
    LoadBalancing,
    Service,
    ServiceKey,
)
from nlproxy.proxy.budget import Fallback, admit, choice, demand

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

UNKNOWN_ANNOTATION = "unknown annotation"
REASONS = (UNKNOWN_ANNOTATION, "service budget", "node budget")
"""The ``reason`` label values of the gauge."""


class BalancingGuard:
    """Applies the budget to each snapshot the Syncer is given (see the module docstring)."""

    def __init__(self, default: LoadBalancing, log: FilteringBoundLogger) -> None:
        self.default = default
        self.log = log
        self.fallbacks: dict[ServiceKey, Fallback] = {}
        self._demands: dict[
            ServiceKey, tuple[Service, tuple[EndpointSlice, ...], LoadBalancing, int]
        ] = {}
        self._substitutes: dict[ServiceKey, tuple[Service, Service]] = {}
        self._warned: dict[ServiceKey, tuple[Service, tuple[str, ...]]] = {}
        self.quota: int | None = None
        """Most elements of tables one sync may (re)build; None: no limit (``run --once``)."""
        self.deferred: set[ServiceKey] = set()
        """Services whose tables wait for the next sync (the loop syncs again at once)."""
        self._was_deferred: set[ServiceKey] = set()
        self._handed: dict[ServiceKey, tuple[Service, tuple[EndpointSlice, ...]]] = {}

    @property
    def counts(self) -> dict[str, int]:
        """Services kept on the default now, by reason."""
        out = dict.fromkeys(REASONS, 0)
        out[UNKNOWN_ANNOTATION] = len(self._warned)
        for fb in self.fallbacks.values():
            out[fb.reason] += 1
        return out

    def apply(
        self, snapshot: ClusterSnapshot, changed: Set[ServiceKey] | None
    ) -> tuple[ClusterSnapshot, Set[ServiceKey] | None]:
        """``snapshot`` as it is to be planned now, and ``changed`` to match (None stays None:
        everything is compared).

        Services past the budget are on random choice; with a :attr:`quota`, opted-in Services
        whose tables would be (re)built past it wait for a later sync, named in
        :attr:`deferred`: one already programmed with its tables keeps the objects it was
        planned from, a new one starts on random choice.
        """
        self._annotations(snapshot)
        demands = self._demand_all(snapshot)
        fallbacks = admit(snapshot.services, {k: v[2:] for k, v in demands.items()})
        flipped = set(fallbacks.keys() ^ self.fallbacks.keys())
        flipped |= {
            k for k in fallbacks.keys() & self.fallbacks.keys() if fallbacks[k] != self.fallbacks[k]
        }
        for key in sorted(flipped):
            fb = fallbacks.get(key)
            if fb is not None:
                self.log.warning("service.over_budget", service=str(key), error=str(fb))
            elif key in snapshot.services:
                self.log.info("service.within_budget", service=str(key))
        self.fallbacks = fallbacks
        keep_old, on_random = self._defer(snapshot, demands, fallbacks)
        if changed is not None:
            changed = (set(changed) | flipped | self._was_deferred) - keep_old.keys()
        self._was_deferred = self.deferred
        if not (on_random or keep_old):
            self._substitutes.clear()
            return snapshot, changed
        services, slices = dict(snapshot.services), dict(snapshot.slices)
        subs: dict[ServiceKey, tuple[Service, Service]] = {}
        for key in on_random:
            svc = services[key]
            old = self._substitutes.get(key)
            sub = old[1] if old is not None and old[0] is svc else None
            if sub is None:
                sub = replace(svc, load_balancing=LoadBalancing.RANDOM)
            services[key] = sub
            subs[key] = (svc, sub)
        for key, (svc, old_slices) in keep_old.items():
            services[key] = svc
            slices[key] = old_slices
        self._substitutes = subs
        return replace(snapshot, services=services, slices=slices), changed

    def _defer(
        self,
        snapshot: ClusterSnapshot,
        demands: Mapping[ServiceKey, tuple[Service, tuple[EndpointSlice, ...], LoadBalancing, int]],
        fallbacks: Mapping[ServiceKey, Fallback],
    ) -> tuple[dict[ServiceKey, tuple[Service, tuple[EndpointSlice, ...]]], set[ServiceKey]]:
        """Hand the planner at most :attr:`quota` elements of tables to (re)build, oldest
        Services first; returns the deferred ones to plan as before (their old objects) and the
        Services to plan with random choice (past the budget, or deferred and new)."""
        handed = {k: v for k, v in self._handed.items() if k in demands and k not in fallbacks}
        keep_old: dict[ServiceKey, tuple[Service, tuple[EndpointSlice, ...]]] = {}
        on_random = set(fallbacks)
        deferred: set[ServiceKey] = set()
        used = 0
        for key in sorted((k for k in demands if k not in fallbacks), key=self._age(snapshot)):
            svc, slices, _, elements = demands[key]
            last = handed.get(key)
            if last is not None and last[0] is svc and _same(last[1], slices):
                continue  # planned from these objects already: nothing to build
            if self.quota is None or used == 0 or used + elements <= self.quota:
                used += elements
                handed[key] = (svc, slices)
                continue
            deferred.add(key)
            if last is not None:
                keep_old[key] = last
            else:
                on_random.add(key)
        self._handed = handed
        self.deferred = deferred
        return keep_old, on_random

    @staticmethod
    def _age(snapshot: ClusterSnapshot) -> Callable[[ServiceKey], tuple[bool, str, ServiceKey]]:
        def age(key: ServiceKey) -> tuple[bool, str, ServiceKey]:
            created = snapshot.services[key].created
            return (not created, created, key)

        return age

    def _demand_all(
        self, snapshot: ClusterSnapshot
    ) -> dict[ServiceKey, tuple[Service, tuple[EndpointSlice, ...], LoadBalancing, int]]:
        out = {}
        cache = self._demands
        for key, svc in snapshot.services.items():
            asked = choice(svc, self.default)
            if asked is LoadBalancing.RANDOM:
                continue
            slices = tuple(snapshot.slices.get(key, ()))
            hit = cache.get(key)
            if hit is not None and hit[0] is svc and _same(hit[1], slices):
                out[key] = hit
            else:
                out[key] = (svc, slices, asked, demand(svc, slices, asked))
        self._demands = out
        return out

    def _annotations(self, snapshot: ClusterSnapshot) -> None:
        """Warn once per Service and set of problems; forget Services that lost them."""
        warned = {}
        for key, svc in snapshot.services.items():
            if not svc.annotation_warnings:
                continue
            old = self._warned.get(key)
            if old is None or old[1] != svc.annotation_warnings:
                for text in svc.annotation_warnings:
                    self.log.warning("service.annotation_ignored", service=str(key), error=text)
            warned[key] = (svc, svc.annotation_warnings)
        self._warned = warned


def _same(a: tuple[EndpointSlice, ...], b: tuple[EndpointSlice, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
