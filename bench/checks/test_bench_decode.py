"""``bench_decode.py`` at a small size, this checkout against itself: every hot path is timed
on both sides and its figures printed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent


def test_small_run_prints_every_path() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH / "bench_decode.py"), "--base", str(BENCH.parent),
         "--rounds", "1", "--elements", "500", "--flows", "300"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["path"] for r in rows] == [
        "parse_elements",
        "split",
        "decode_flow",
        "line",
        "datagram_lines",
    ]
    assert all(r["base_s"] > 0 and r["this_s"] > 0 and r["ratio"] > 0 for r in rows)
