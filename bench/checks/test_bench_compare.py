"""``bench_compare.py`` at a small size, this checkout against itself: both sides timed, the
certificate's summary printed, and the two trees' certificates found equal."""

from __future__ import annotations

from checks.script import BENCH, run_script


def test_small_run_prints_both_trees_and_the_same_certificate() -> None:
    rows = run_script(
        "bench_compare.py", "--base", str(BENCH.parent), "--services", "20", "--endpoints", "2",
        "--rounds", "1", timeout=240,
    )  # fmt: skip
    assert len(rows) == 1
    row = rows[0]
    assert row["bench"] == "compare"
    assert all(row[k] > 0 for k in ("base_cpu_s", "this_cpu_s", "ratio"))
    assert row["same_output"] is True
    assert row["summary"].startswith("100 connections to 40 frontends compared")
