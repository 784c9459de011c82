"""``run --once`` and the other one-shot paths end at once from the console entry point only:
output flushed, the exit status kept; in-process (``cli.main``) they return."""

from __future__ import annotations

import subprocess
import sys

from nlproxy.commands import _fastexit

SCRIPT = """
import sys
from nlproxy.commands import _fastexit
_fastexit.allow()
print("flushed", end="")
print("also on stderr", file=sys.stderr, end="")
big = [object() for _ in range(10)]
_fastexit.end(int(sys.argv[1]))
print("never")
"""


def test_exits_with_the_status_after_flushing() -> None:
    for status in (0, 3):
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(status)], capture_output=True, text=True, check=False
        )
        assert (done.returncode, done.stdout, done.stderr) == (status, "flushed", "also on stderr")


def test_returns_where_not_allowed() -> None:
    assert _fastexit.end(3) == 3
