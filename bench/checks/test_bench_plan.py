"""``bench_plan.py`` at a small size, this checkout against itself: every stage is timed (wall
and CPU) for both trees, with the objects alive after planning, and a ratio row follows."""

from __future__ import annotations

from checks.script import BENCH, run_script

STAGES = ("plan", "diff_cold", "validate", "encode", "remember", "diff_restart", "free")


def test_small_run_prints_every_stage_for_both_trees() -> None:
    tree = str(BENCH.parent)
    rows = run_script(
        "bench_plan.py", "--services", "30", "--endpoints", "3", "--tree", tree, "--tree", tree,
        timeout=120,
    )  # fmt: skip
    stages = [r for r in rows if r["bench"] == "plan_stages"]
    assert len(stages) == 2
    for r in stages:
        assert all(f"{s}_s" in r and f"{s}_cpu_s" in r for s in STAGES)
        assert r["objects_after_plan"] > 0
        assert r["packed_bytes_objects"] > 0
        assert r["ops"] > 0
        assert r["restart_ops"] == 0
        assert len(r["loadavg"]) == 3
    (ratio,) = [r for r in rows if r["bench"] == "plan_stages_ratio"]
    assert ratio["objects_after_plan"] == 1.0
