"""Bytecode for the checkouts a bench runs, as an installed nlproxy has it.

An installed nlproxy runs from compiled bytecode (``packaging/build-deb.sh`` compiles every
module; pip does too), but a checkout run where ``PYTHONDONTWRITEBYTECODE`` is set compiles
every module it imports from source at each start: ~0.2 s more CPU for the daemon, the same for
any two checkouts, that an installed daemon never pays. A bench's child gets :func:`env`: no
``PYTHONDONTWRITEBYTECODE``, and its bytecode in a cache of its own per checkout under the temp
directory (``PYTHONPYCACHEPREFIX``), so nothing is written into the checkout (the base may be
read-only); :func:`prepare` fills that cache before anything is measured.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CACHE = Path(tempfile.gettempdir()) / "nlproxy-bench-pycache"

_WARM = (
    "import compileall, re, sys, sysconfig\n"
    "paths = sysconfig.get_paths()\n"
    "dirs = [sys.argv[1], paths['stdlib'], paths['purelib'], paths['platlib']]\n"
    # The standard library's own tests hold files that do not compile on purpose (bad syntax,
    # bad encodings, Python 2 samples); nothing imports them.
    "skip = re.compile(re.escape(paths['stdlib']) + r'/(test|lib2to3/tests|idlelib/idle_test)/')\n"
    "ok = all([compileall.compile_dir(d, quiet=1, workers=0, rx=skip)\n"
    "          for d in dict.fromkeys(dirs)])\n"
    "sys.exit(0 if ok else 1)\n"
)


def python(tree: Path) -> str:
    """The checkout's interpreter (its ``.venv``), else this one."""
    venv = tree / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def env(tree: Path) -> dict[str, str]:
    """The environment for a child running ``tree``'s nlproxy with cached bytecode."""
    child = dict(os.environ)
    child.pop("PYTHONDONTWRITEBYTECODE", None)
    tag = hashlib.sha256(str(tree.resolve()).encode()).hexdigest()[:12]
    child["PYTHONPYCACHEPREFIX"] = str(CACHE / tag)
    return child


def prepare(tree: Path) -> None:
    """Compile ``tree``'s nlproxy, its interpreter's standard library and its packages into
    the cache :func:`env` names (once: later calls find them current and are quick).

    Raises:
        RuntimeError: a module did not compile (its error, the last lines of the output).
    """
    done = subprocess.run(
        [python(tree), "-c", _WARM, str(tree / "nlproxy")],
        env=env(tree),
        cwd=tree,
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:  # measured from source instead would be no like-for-like figure
        said = (done.stdout + done.stderr).strip().splitlines()[-12:]
        raise RuntimeError(f"{tree}: compiling to bytecode failed:\n" + "\n".join(said))
