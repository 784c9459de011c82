"""``bench_external_ips.py`` at a small size: a row per size, both figures printed."""

from __future__ import annotations

from checks.script import run_script


def test_small_run_prints_a_row_per_size() -> None:
    rows = run_script("bench_external_ips.py", "--external-ips", "10", "100", "--rounds", "1")
    assert [r["external_ips"] for r in rows] == [10, 100]
    assert all(r["apply_ms"] > 0 and r["change_ms"] > 0 for r in rows)
