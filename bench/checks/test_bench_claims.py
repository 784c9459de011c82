"""``bench_claims.py`` at a small size: both figures are printed, with and without claims."""

from __future__ import annotations

from checks.script import run_script


def test_small_run_prints_both_figures() -> None:
    rows = run_script("bench_claims.py", "--services", "50", "--endpoints", "3", "--rounds", "1")
    assert [r["what"] for r in rows] == ["cold apply + snapshot", "one slice change"]
    assert all(r["ms_with"] > 0 and r["ms_without"] > 0 for r in rows)
