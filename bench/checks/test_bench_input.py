"""``bench_input.py`` at a small size: every input is measured on both paths, decode and parse
apart, and both paths gave the same changes (the script exits 1 otherwise)."""

from __future__ import annotations

from checks.script import BENCH, run_script


def test_small_run_prints_both_paths_per_input() -> None:
    rows = run_script(
        "bench_input.py", "--services", "30", "--endpoints", "3", "--rounds", "1", timeout=120
    )
    assert [(r["input"], r["path"]) for r in rows] == [
        (i, p) for i in ("json", "yaml", "api") for p in ("parser", "typed")
    ]
    for r in rows:
        # Each figure is timed on its own run: at this size a whole load (a few ms) can take
        # less CPU than the decode timed before it, so only their signs are facts here.
        assert r["decode_s"] >= 0
        assert r["parse_s"] >= 0
        assert r["total_s"] > 0
        assert r["ratio_total"] >= 0


def test_side_by_side_prints_each_checkout_and_the_ratios() -> None:
    """``--base`` (this checkout against itself): the typed path's stages per checkout, with
    the ratios this / base and the child's peak RSS."""
    rows = run_script(
        "bench_input.py",
        *("--services", "30", "--endpoints", "3", "--rounds", "2"),
        *("--inputs", "json,yaml-kubectl", "--base", str(BENCH.parent)),
        timeout=120,
    )
    assert [(r["input"], r["checkout"]) for r in rows] == [
        (i, c) for i in ("json", "yaml-kubectl") for c in ("base", "this")
    ]
    for r in rows:
        assert r["total_s"] > 0
        assert r["maxrss_mib"] > 0
        if r["checkout"] == "this":
            assert r["ratio_total_s"] > 0
            assert r["ratio_state_s_paired"] > 0
