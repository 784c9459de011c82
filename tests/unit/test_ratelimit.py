"""The API client's token bucket (``--kube-api-qps``/``--kube-api-burst``), on a clock the
test moves: a burst at once, then one request per 1/qps seconds, in the order they asked."""

from __future__ import annotations

import pytest

from nlproxy.cluster.ratelimit import DEFAULT_BURST, DEFAULT_QPS, TokenBucket


class Clock:
    """Seconds that pass only when a request sleeps (a single thread: nothing else waits)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _bucket(qps: float, burst: int, clock: Clock) -> TokenBucket:
    return TokenBucket(qps, burst, clock=clock.time, sleep=clock.sleep)


def test_a_burst_at_once_then_qps() -> None:
    clock = Clock()
    bucket = _bucket(2.0, 3, clock)
    waits = [bucket.take() for _ in range(7)]
    assert waits == [0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5]
    clock.now += 10  # idle: the bucket fills up to the burst again, no further
    assert [bucket.take() for _ in range(4)] == [0.0, 0.0, 0.0, 0.5]


def test_requests_that_ask_together_wait_in_turn() -> None:
    clock = Clock()
    bucket = TokenBucket(1.0, 1, clock=clock.time, sleep=lambda s: None)  # nobody sleeps
    assert [bucket.take() for _ in range(4)] == [0.0, 1.0, 2.0, 3.0]


def test_negative_qps_is_no_limit_and_zero_the_default() -> None:
    clock = Clock()
    unlimited = _bucket(-1, 1, clock)
    assert [unlimited.take() for _ in range(50)] == [0.0] * 50
    assert clock.slept == []
    default = _bucket(0, 0, clock)
    assert (default.qps, default.burst) == (DEFAULT_QPS, DEFAULT_BURST)
    waits = [default.take() for _ in range(DEFAULT_BURST + 1)]
    assert waits[-1] == pytest.approx(1 / DEFAULT_QPS)
    assert not any(waits[:-1])
