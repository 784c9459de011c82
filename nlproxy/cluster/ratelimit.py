"""The API client's rate limit: ``--kube-api-qps`` and ``--kube-api-burst`` (``clientConnection``).

A token bucket, as client-go's ``flowcontrol.NewTokenBucketRateLimiter``: it holds up to
``burst`` tokens, refilled at ``qps`` per second; every request to the API server takes one,
waiting for it when none is left. As in client-go, a negative ``qps`` turns the limit off, and
0 (for either) means the default, 5 per second with a burst of 10.
Requests run in worker threads (``kube_http.py``), so the bucket is thread-safe and waits by
blocking the requesting thread; it never blocks the event loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

DEFAULT_QPS = 5.0
DEFAULT_BURST = 10


class TokenBucket:
    """``burst`` requests at once, then ``qps`` per second.

    Args:
        qps: tokens added per second; negative: no limit; 0: ``DEFAULT_QPS``.
        burst: the most tokens held; 0 (or less): ``DEFAULT_BURST``; the bucket starts full.
        clock: seconds, monotonic.
        sleep: waits that many seconds of ``clock``.
    """

    def __init__(
        self,
        qps: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.qps = qps or DEFAULT_QPS
        self.burst = burst if burst > 0 else DEFAULT_BURST
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = float(self.burst)
        self._last = clock()

    def take(self) -> float:
        """Take a token, waiting until it is there; returns the seconds waited.

        A token is reserved at once, even when it is owed (the count goes below zero), so
        concurrent requests wait their turn in the order they asked, each for its own share.
        """
        if self.qps < 0:
            return 0.0
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
            self._last = now
            self._tokens -= 1.0
            owed = -self._tokens
        if owed <= 0:
            return 0.0
        wait = owed / self.qps
        self._sleep(wait)
        return wait
