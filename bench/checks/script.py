"""Run a benchmark script as ``make bench`` does, for its self-test: its JSON lines, or its
stderr when it fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent.parent


def run_script(script: str, *args: str, timeout: float = 300) -> list[dict[str, Any]]:
    """``bench/<script> args``: the JSON records it printed (lines starting ``{``)."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True, text=True, check=False, timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, f"{script} exited {proc.returncode}: {proc.stderr[-3000:]}"
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
