"""``bench_claims.py`` at a small size: both figures are printed, with and without claims."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent


def test_small_run_prints_both_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH / "bench_claims.py"), "--services", "50", "--endpoints", "3",
         "--rounds", "1"],
        capture_output=True, text=True, check=True, timeout=300,
    ).stdout  # fmt: skip
    rows = [json.loads(line) for line in out.splitlines() if line.startswith('{"bench"')]
    assert [r["what"] for r in rows] == ["cold apply + snapshot", "one slice change"]
    assert all(r["ms_with"] > 0 and r["ms_without"] > 0 for r in rows)
