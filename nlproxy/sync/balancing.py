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

from collections.abc import Set
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
        """``snapshot`` with the Services past the budget on random choice, and ``changed``
        with every Service whose status changed (None stays None: everything is compared)."""
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
        if changed is not None and flipped:
            changed = set(changed) | flipped
        if not fallbacks:
            self._substitutes.clear()
            return snapshot, changed
        services = dict(snapshot.services)
        subs: dict[ServiceKey, tuple[Service, Service]] = {}
        for key in fallbacks:
            svc = services[key]
            old = self._substitutes.get(key)
            sub = old[1] if old is not None and old[0] is svc else None
            if sub is None:
                sub = replace(svc, load_balancing=LoadBalancing.RANDOM)
            services[key] = sub
            subs[key] = (svc, sub)
        self._substitutes = subs
        return replace(snapshot, services=services), changed

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
            if (
                hit is not None
                and hit[0] is svc
                and len(hit[1]) == len(slices)
                and all(a is b for a, b in zip(hit[1], slices, strict=True))
            ):
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
