"""``bench_metrics.py`` at a small size: every figure it promises is printed, and the
no-local-endpoints gauge it times counts the services set up to be counted."""

from __future__ import annotations

from checks.script import run_script


def test_small_run_prints_every_figure() -> None:
    rows = run_script(
        "bench_metrics.py", "--services", "50", "--endpoints", "3", "--local-every", "10",
        "--rounds", "1",
    )  # fmt: skip
    assert [r["what"] for r in rows] == [
        "plan",
        "no-local recount, full sync",
        "no-local recount, one service",
        "exposition",
    ]
    assert {r["no_local_counted"] for r in rows} == {5.0}
    assert all(r["ms"] >= 0 for r in rows)
