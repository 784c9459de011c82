"""bench_lb.py on a small cluster: it runs, and the facts its figures rest on hold (a
consistent-hash endpoint change is element updates; one endpoint more or less moves at most
2/(N+1) of the clients)."""

from __future__ import annotations

import json

import pytest

from bench import bench_lb


def test_small_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_lb.main(["--services", "3", "--endpoints", "10", "--skip-wait"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    cost = {r["algorithm"]: r for r in rows if r["part"] == "cost"}
    assert set(cost) == {"random", "round-robin", "consistent-hash"}
    ch = cost["consistent-hash"]
    assert ch["per_service"]["sets"] == 1
    assert ch["per_service"]["elements"] >= 4096
    for change in ("replaced", "removed"):
        assert ch[change]["incremental"]
        assert set(ch[change]["kinds"]) <= {"add element", "delete element"}
    (worst,) = [r for r in rows if r["part"] == "disruption-worst"]
    assert worst["worst_moved_vs_bound"] <= 1.0


def test_wait_part_falls_back_past_the_budget() -> None:
    """Five consistent-hash ports (5 x 4096 elements) are past the budget of one Service; one
    port is within it and gets its table."""
    past = bench_lb.wait("five", 5, 3)
    assert (past["fell_back"], past["lb_elements"]) == (True, 0)
    within = bench_lb.wait("one", 1, 3)
    assert (within["fell_back"], within["lb_elements"]) == (False, 4096)
    lifted = bench_lb.wait("five", 5, 3, budget=False)
    assert (lifted["fell_back"], lifted["lb_elements"]) == (False, 5 * 4096)


def test_burst_part_spreads_tables_over_syncs() -> None:
    """Two Services at the budget: with the quota, one sync each; without, one sync."""
    spread = bench_lb.burst(2, quota=True)
    assert (spread["syncs"], spread["node_budget_fallbacks"]) == (2, 0)
    assert bench_lb.burst(2, quota=False)["syncs"] == 1
