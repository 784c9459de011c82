"""``bench_input.py`` at a small size: every input is measured on both paths, decode and parse
apart, and both paths gave the same changes (the script exits 1 otherwise)."""

from __future__ import annotations

from checks.script import run_script


def test_small_run_prints_both_paths_per_input() -> None:
    rows = run_script(
        "bench_input.py", "--services", "30", "--endpoints", "3", "--rounds", "1", timeout=120
    )
    assert [(r["input"], r["path"]) for r in rows] == [
        (i, p) for i in ("json", "yaml", "api") for p in ("parser", "typed")
    ]
    for r in rows:
        assert r["decode_s"] >= 0
        assert r["total_s"] >= r["decode_s"]
        assert r["ratio_total"] >= 0
