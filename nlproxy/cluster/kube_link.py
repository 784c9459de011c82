"""How the Kubernetes API source waits: retry delays, the API server's reachability, and the
kinds it may not read.

Sits beside ``kube.py`` (the trio source), which decides what to do; this module only decides
how long to wait and keeps track of why. Two kinds of failure wait differently:

- **No answer** (connection refused, reset, timed out): the API server is down or restarting,
  and it is the same server for every kind. One ``ApiLink`` is shared by all kinds: the first
  kind to find the server unreachable probes ``/readyz`` at a short, jittered interval that
  grows to at most ``maximum`` (one small request per interval, not one per kind), and every
  kind waiting on it retries as soon as a probe is answered. So recovery after an outage of any
  length takes about one probe interval, where per-kind backoffs grown during the outage would
  leave each kind asleep for up to their maximum.
- **An error answer** (5xx, 429, a refused permission): the server is up and said no. Each kind
  keeps its own exponential ``Backoff`` with jitter, reset by that kind's next success
  (client-go's reflector does the same: 0.8 s doubling to 30 s).

It holds no trio state at import time and does no I/O of its own: the probe is passed in.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import trio

from nlproxy.cluster.kube_http import KubeApiError, Unreachable
from nlproxy.log import get_logger

__all__ = ["ApiLink", "Backoff", "Unavailable"]


class Backoff:
    """Exponential backoff with jitter: each delay is drawn from [d/2, d], d doubling up to
    ``maximum``; ``reset()`` after a success."""

    def __init__(
        self, initial: float = 0.5, maximum: float = 30.0, *, rng: random.Random | None = None
    ) -> None:
        self.initial, self.maximum = initial, maximum
        self._rng = rng or random.Random()
        self._delay = initial

    def next(self) -> float:
        delay = self._delay
        self._delay = min(self.maximum, self._delay * 2)
        return self._rng.uniform(delay / 2, delay)

    def reset(self) -> None:
        self._delay = self.initial


@dataclass(frozen=True, slots=True)
class Unavailable:
    """A kind the source may not read right now.

    Attributes:
        kind: ``Service``, ``EndpointSlice``, ``Node`` or ``ServiceCIDR``.
        verb: the refused verb (``list`` or ``watch``).
        reason: ``forbidden`` (403), ``unauthorized`` (401) or ``not-served`` (404).
        required: whether nlproxy can program rules without it (an optional kind is synced as
            absent; a required one holds up the first sync and makes ``/healthz`` not ready).
        detail: the API server's message.
    """

    kind: str
    verb: str
    reason: str
    required: bool
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.verb} {self.reason} ({self.detail})"


class ApiLink:
    """Whether the API server answers; shared by every kind's loop of one source.

    Args:
        probe: a blocking call (run in a worker thread) returning the HTTP status of a cheap
            request, raising ``Unreachable`` when there is no answer.
        initial, maximum: the probe interval while unreachable: jittered, doubling from
            ``initial`` to ``maximum``; reset by ``answered()``.
        on_down: told why nothing answers once an outage is warned of (the probe failed
            too), and ``None`` when the server answers again: for ``/healthz``.
        unreachable: the reason given to ``on_down`` and the warning (default: the error),
            when the address has a known cause of being unreachable (the in-cluster fallback).
    """

    def __init__(
        self,
        probe: Callable[[], int],
        *,
        initial: float = 0.1,
        maximum: float = 1.0,
        rng: random.Random | None = None,
        on_down: Callable[[str | None], None] | None = None,
        unreachable: str = "",
    ) -> None:
        self._probe = probe
        self._on_down = on_down
        self._unreachable = unreachable
        self._interval = Backoff(initial, maximum, rng=rng)
        self._back: trio.Event | None = None
        self._log = get_logger("kube-source")
        self.outages = 0

    def answered(self) -> None:
        """A real request was answered: the next outage starts probing at the short end.

        Not reset by a probe: a server that answers ``/readyz`` but drops every list keeps
        its retries at the slow end of the interval."""
        self._interval.reset()

    async def wait_until_back(self, kind: str, error: Unreachable) -> None:
        """Wait until the API server answers again.

        The first caller probes; later callers wait for that probe to be answered.

        Cancellation: the probe's thread is abandoned (a bounded GET); the waiters are woken
        so that one of them probes instead.
        """
        if self._back is not None:
            await self._back.wait()
            return
        back = self._back = trio.Event()
        self.outages += 1
        started = trio.current_time()
        probes, warned = 0, False
        try:
            while True:
                await trio.sleep(self._interval.next())
                probes += 1
                try:
                    status = await trio.to_thread.run_sync(self._probe, abandon_on_cancel=True)
                except Unreachable as exc:
                    if not warned:  # said once, when not just a dropped connection
                        reason = self._unreachable or f"API server does not answer: {exc}"
                        extra = {"reason": self._unreachable} if self._unreachable else {}
                        self._log.warning(
                            "source.api_unreachable",
                            kind=kind,
                            error=str(error),
                            probe=str(exc),
                            **extra,
                        )
                        warned = True
                        if self._on_down is not None:
                            self._on_down(reason)
                    continue
                except KubeApiError:
                    # Not sent (a token no header can carry): nothing to wait for here; the
                    # request that follows says why and is retried with the source's backoff.
                    status = 0
                    break
                # 5xx: up but not ready (a starting server's /readyz is 500 until its caches
                # are filled). Anything else (200, or 401/403/404 where /readyz is not open
                # to this identity) proves it answers.
                if status < 500:
                    break
            down_ms = round((trio.current_time() - started) * 1000, 1)
            if warned:
                self._log.info("source.api_back", down_ms=down_ms, probes=probes, readyz=status)
                if self._on_down is not None:
                    self._on_down(None)
            else:
                self._log.debug("source.reconnecting", kind=kind, error=str(error), down_ms=down_ms)
        finally:
            self._back = None
            back.set()
