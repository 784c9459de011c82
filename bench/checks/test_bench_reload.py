"""``bench_reload.py`` at a small size: both figures are printed, in a thread and on the loop."""

from __future__ import annotations

from checks.script import run_script


def test_small_run_prints_both_figures() -> None:
    (row,) = run_script(
        "bench_reload.py", "--services", "50", "--endpoints", "3", "--rewrites", "2"
    )
    assert row["what"] == "reload stalls"
    assert row["max_stall_ms_thread"] >= 0
    assert row["max_stall_ms_loop"] >= 0
    assert row["file_bytes"] > 0
