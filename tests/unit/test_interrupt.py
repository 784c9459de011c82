"""Ctrl-C at any moment of the command's start ends quietly with 130, never a traceback: here
while the command line's modules are still loading (issue 28: the first ~0.2 s)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The console script as pip writes it, for the entry point pyproject.toml names; the interrupt
# arrives while argparse (the first thing the command line needs) is being imported.
SCRIPT = """
import importlib.abc, os, signal, sys

class Interrupt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "argparse":
            os.kill(os.getpid(), signal.SIGINT)
        return None

signal.signal(signal.SIGINT, signal.default_int_handler)
sys.meta_path.insert(0, Interrupt())
sys.argv = ["nlproxy", "version"]
from {module} import {function}
sys.exit({function}())
"""


@pytest.mark.parametrize("script", ["nlproxy"])
def test_interrupt_while_importing_exits_130_without_a_traceback(script: str) -> None:
    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"][script]
    module, function = target.split(":")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(module=module, function=function)],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 130, proc.stderr
