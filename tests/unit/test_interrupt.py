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


# The console script again, with Ctrl-C at the Nth import once nlproxy's entry module is running
# (what the interpreter and pip's script do before it is theirs), or with N = 0 at the very end
# (an exit handler that runs after every other, while the interpreter tears down). A run with N
# = -1 counts the imports.
AT_IMPORT = """
import atexit, importlib.abc, os, signal, sys, time
n = int(sys.argv[1])

class Interrupt(importlib.abc.MetaPathFinder):
    seen = 0
    def find_spec(self, name, path=None, target=None):
        if "nlproxy.__main__" in sys.modules:
            Interrupt.seen += 1
            if Interrupt.seen == n:
                os.kill(os.getpid(), signal.SIGINT)
        return None

def last():
    if n == -1:
        os.write(2, b"IMPORTS %d" % Interrupt.seen)
    if n == 0:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)

atexit.register(last)
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.meta_path.insert(0, Interrupt())
sys.argv = ["nlproxy", *sys.argv[2:]]
from nlproxy.__main__ import entry
sys.exit(entry())
"""


def at_import(n: int, argv: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", AT_IMPORT, str(n), *argv],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    "argv", [pytest.param(("version",), id="version"), pytest.param(("rules",), id="rules")]
)
def test_interrupt_at_any_import_or_at_the_end_exits_130_silently(argv: tuple[str, ...]) -> None:
    counted = at_import(-1, argv)
    imports = int(counted.stderr.rpartition("IMPORTS ")[2])
    assert imports > 5, counted.stderr  # the command line's modules load after the entry
    # The first imports, a spread of the rest (the command's own among them), the last one, and
    # the interpreter's teardown once the command has returned (and said what it says: as an
    # unprivileged user, rules is refused).
    moments = [*sorted({1, 2, 3, *range(4, imports, max(1, imports // 8)), imports}), 0]
    own = counted.stderr.rpartition("IMPORTS ")[0]  # what the command says uninterrupted
    endings = {n: at_import(n, argv) for n in moments}
    wrong = {
        n: (p.returncode, p.stderr)
        for n, p in endings.items()
        if (p.returncode, p.stderr) != (130, own if n == 0 else "")
    }
    assert wrong == {}


def test_the_entry_module_sets_its_handler_before_importing_anything() -> None:
    """What the console script imports first loads nothing an installed interpreter has not
    loaded already (``os``, through ``site``): no import stands between the start and the
    handler (the development venv's import finder loads more, so this runs without ``site``)."""
    probe = (
        f"import _signal, os, sys; sys.path.insert(0, {str(ROOT)!r}); before = set(sys.modules)\n"
        "import nlproxy.__main__\n"
        "print(sorted(set(sys.modules) - before), "
        "_signal.getsignal(_signal.SIGINT) is _signal.default_int_handler)"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.split("]")[0] == "['nlproxy', 'nlproxy.__main__'", done.stderr
    assert done.stdout.strip().endswith("False"), done.stdout
