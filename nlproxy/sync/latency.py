"""Per-Service programming latency: how long a Service's last change took to be committed here.

Sits beside the loop's reporter (``report.py``), which hands it each change as the state takes
it (:meth:`ProgrammingLatency.seen`) and each sync's programmed services
(:meth:`ProgrammingLatency.programmed`). A change is measured from the EndpointSlice's
``endpoints.kubernetes.io/last-change-trigger-time`` (what kube-proxy's
``network_programming_duration`` measures from) when the change carries a new one written since
this process started, else from when this process saw it; to the commit that programmed it.
The last value per Service is kept (``status`` and ``explain`` show it, through the daemon's
``/programming``), and the new trigger times are returned for upstream's histogram.

Holds no clock of its own: the caller gives the wall times (the trigger times are wall times).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from nlproxy.cluster.model import ClusterSnapshot, IPFamily, ServiceKey

TRIGGER = "trigger"
"""A latency measured from the slice's trigger time."""
SEEN = "seen"
"""A latency measured from when this process saw the change (no new trigger time)."""
ANSWERED = 50
"""How many of the slowest Services ``/programming`` names."""


@dataclass(frozen=True, slots=True)
class Latency:
    """One Service's last change: ``seconds`` from ``since`` (:data:`TRIGGER` or :data:`SEEN`)
    to its commit, at ``at``."""

    seconds: float
    since: str
    at: datetime

    def to_json(self) -> dict[str, object]:
        return {"seconds": round(self.seconds, 6), "since": self.since, "at": self.at.isoformat()}


class ProgrammingLatency:
    """The trigger times already counted and the last latency of each Service.

    Args:
        started: when this process started (whole seconds): a trigger time before it measures a
            wait this process did not cause, and is not taken (as upstream's histogram).
    """

    def __init__(self, started: datetime) -> None:
        self._started = started
        self._triggers: dict[ServiceKey, dict[str, datetime]] = {}
        self._seen: dict[ServiceKey, datetime] = {}
        self.last: dict[ServiceKey, Latency] = {}
        """Each Service's last programmed change (a deleted Service's is dropped)."""

    def seen(self, keys: Iterable[ServiceKey], now: datetime) -> None:
        """``keys`` changed at ``now`` (the first change since each was last programmed
        counts: a change waits from when it came)."""
        for key in keys:
            self._seen.setdefault(key, now)

    def forget(self, keys: Iterable[ServiceKey]) -> None:
        """``keys`` turned out unchanged: no change of theirs waits."""
        for key in keys:
            self._seen.pop(key, None)

    def programmed(
        self, keys: Iterable[ServiceKey], snapshot: ClusterSnapshot, now: datetime
    ) -> list[tuple[IPFamily, float]]:
        """The changes of ``keys`` (as ``snapshot`` holds them) were committed at ``now``.

        Returns:
            one (slice family, seconds) per new trigger time, for
            ``kubeproxy_network_programming_duration_seconds``.
        """
        observed: list[tuple[IPFamily, float]] = []
        # Keys seen together share a wait: one Latency each such moment (frozen, so shared),
        # not one per Service (a first sync programs every Service, seen at one moment).
        waits: dict[datetime, Latency] = {}
        pop_seen, pop_triggers, last = self._seen.pop, self._triggers.pop, self.last
        services, slices = snapshot.services, snapshot.slices
        for key in keys:
            seen = pop_seen(key, None)
            before = pop_triggers(key, None)
            if key not in services:
                last.pop(key, None)
                continue
            current: dict[str, datetime] = {}
            newest: datetime | None = None
            for s in slices.get(key, ()):
                trigger = s.last_change_trigger_time
                if trigger is None:
                    continue
                if trigger.tzinfo is None:
                    trigger = trigger.replace(tzinfo=UTC)
                current[s.name] = trigger
                if (before is None or before.get(s.name) != trigger) and trigger >= self._started:
                    seconds = max(0.0, (now - trigger).total_seconds())
                    observed.append((s.family, seconds))
                    newest = trigger if newest is None else max(newest, trigger)
            if current:
                self._triggers[key] = current
            if newest is not None:
                last[key] = Latency(max(0.0, (now - newest).total_seconds()), TRIGGER, now)
            elif seen is not None:
                wait = waits.get(seen)
                if wait is None:
                    wait = waits[seen] = Latency(max(0.0, (now - seen).total_seconds()), SEEN, now)
                last[key] = wait
        return observed

    def slowest(self, n: int) -> list[tuple[ServiceKey, Latency]]:
        """The ``n`` Services whose last change took longest, slowest first."""
        return heapq.nlargest(n, self.last.items(), key=lambda item: item[1].seconds)

    def to_json(self, service: ServiceKey | None = None) -> dict[str, object]:
        """What the daemon's ``/programming`` serves: the :data:`ANSWERED` slowest Services
        (``count``: how many have a latency); with ``service``, that one alone (``status``
        asks for the first, ``explain`` for the second). Never the whole table: any client of
        the metrics port may ask, and the answer is built on the event loop."""
        if service is not None:
            one = self.last.get(service)
            chosen = [] if one is None else [(service, one)]
        else:
            chosen = self.slowest(ANSWERED)
        return {"services": {str(k): v.to_json() for k, v in chosen}, "count": len(self.last)}
