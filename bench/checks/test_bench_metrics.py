"""``bench_metrics.py`` at a small size: every figure it promises is printed, and the
no-local-endpoints gauge it times counts the services set up to be counted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent


def test_small_run_prints_every_figure() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH / "bench_metrics.py"), "--services", "50", "--endpoints", "3",
         "--local-every", "10", "--rounds", "1"],
        capture_output=True, text=True, check=True, timeout=300,
    ).stdout  # fmt: skip
    rows = [json.loads(line) for line in out.splitlines() if line.startswith('{"bench"')]
    assert [r["what"] for r in rows] == [
        "plan",
        "no-local recount, full sync",
        "no-local recount, one service",
        "exposition",
    ]
    assert {r["no_local_counted"] for r in rows} == {5.0}
    assert all(r["ms"] >= 0 for r in rows)
