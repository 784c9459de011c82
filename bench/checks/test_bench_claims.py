"""``bench_claims.py`` at a small size: its figures are printed, with and without claims."""

from __future__ import annotations

from checks.script import run_script


def test_small_run_prints_both_figures() -> None:
    rows = run_script("bench_claims.py", "--services", "50", "--endpoints", "3", "--rounds", "1")
    assert [r["what"] for r in rows] == [
        "cold apply + snapshot",
        "one slice change",
        "state memory after the cold apply",
    ]
    assert all(r["ms_with"] > 0 and r["ms_without"] > 0 for r in rows[:2])
    memory = rows[2]
    assert memory["kib_with"] > memory["kib_without"] > 0  # the claims hold something
    assert abs(memory["claims_kib"] - (memory["kib_with"] - memory["kib_without"])) <= 0.2
