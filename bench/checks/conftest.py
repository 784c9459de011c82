"""Benchmark self-tests: the generators, topology and helpers are checked against the real
kernel here, so the figures ``bench/run.py`` prints compare rulesets that really work."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
