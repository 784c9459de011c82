"""``bench_decode.py`` at a small size, this checkout against itself: every hot path is timed
on both sides and its figures printed."""

from __future__ import annotations

from checks.script import BENCH, run_script


def test_small_run_prints_every_path() -> None:
    rows = run_script(
        "bench_decode.py", "--base", str(BENCH.parent), "--rounds", "1", "--elements", "500",
        "--flows", "300", timeout=120,
    )  # fmt: skip
    assert [r["path"] for r in rows] == [
        "parse_elements",
        "split",
        "decode_flow",
        "line",
        "datagram_lines",
    ]
    assert all(r["base_s"] > 0 and r["this_s"] > 0 and r["ratio"] > 0 for r in rows)
