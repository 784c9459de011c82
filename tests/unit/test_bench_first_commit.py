"""bench/bench_first_commit.py's accounting: each second of a stage counted once, a timed call
inside another (the seed's balancing pass and digest) under its own label only, and the
head/base ratios beside the raw figures."""

from __future__ import annotations

import time
from typing import Any

import pytest

from bench.bench_first_commit import ratios, stages


class Guard:
    """The seed calls the balancing pass and takes a digest, as ``BalancingGuard.seed`` does."""

    def __init__(self, clock: list[float], records: Records) -> None:
        self.clock, self.records = clock, records

    def apply(self) -> None:
        self.clock[0] += 2.0

    def seed(self) -> None:
        self.clock[0] += 1.0
        self.apply()
        self.records.take_digest()


class Records:
    def __init__(self, clock: list[float]) -> None:
        self.clock = clock

    def take_digest(self) -> None:
        self.clock[0] += 4.0


def test_a_timed_call_inside_another_is_counted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A seed of one unit calling a pass of two and a digest of four, then a pass: balancing
    counts the seed's own unit and two passes (5), the digest its four; together what ran."""
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    fig: dict[str, Any] = {}
    timed = stages(fig)
    records = Records(clock)
    guard = Guard(clock, records)
    timed(guard, "apply", "balancing_s")
    timed(guard, "seed", "balancing_s")
    timed(records, "take_digest", "digest_s")
    guard.seed()
    guard.apply()
    assert fig == {"balancing_s": 5.0, "digest_s": 4.0}
    assert sum(fig.values()) == clock[0]


def test_ratios_are_head_over_base_for_the_numbers_both_have() -> None:
    head = {"sync_s": 1.5, "ops": 10, "balancing_s": 0.2, "batches": [{}], "rss_mb": 90.0}
    base = {"sync_s": 3.0, "ops": 10, "balancing_s": 0.0, "batches": [{}]}
    assert ratios(head, base) == {"sync_s": 0.5, "ops": 1.0, "balancing_s": None}
