"""``nlproxy/runtime/imports.py``: a package entered bare imports only the submodules asked for, and
becomes the package a plain import makes at the first other name asked of it. Each case runs in
a fresh interpreter (the packages must not be imported already)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str, path: Path | None = None) -> str:
    env_path = [str(ROOT)] + ([str(path)] if path is not None else [])
    prelude = f"import sys\nsys.path[:0] = {env_path!r}\n"
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _package(tmp_path: Path) -> Path:
    pkg = tmp_path / "heavy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "import sys\n"
        "sys.modules['heavy_init_runs'] = sys.modules.get('heavy_init_runs', 0) + 1\n"
        "from heavy import db\n"
        "from heavy.light import Thing\n"
        "VERSION = '1'\n"
    )
    (pkg / "db.py").write_text("")
    (pkg / "light.py").write_text("from heavy import config\nclass Thing:\n    pass\n")
    (pkg / "config.py").write_text("ON = True\n")
    return tmp_path


def test_submodules_import_without_the_packages_init(tmp_path: Path) -> None:
    out = _run(
        """
        from nlproxy.runtime.imports import bare
        bare("heavy")
        from heavy.light import Thing
        print("heavy.db" in sys.modules, "heavy_init_runs" in sys.modules, Thing.__name__)
        """,
        _package(tmp_path),
    )
    assert out.split() == ["False", "False", "Thing"]


def test_another_name_runs_the_init_once_and_then_it_is_the_whole_package(tmp_path: Path) -> None:
    out = _run(
        """
        from nlproxy.runtime.imports import bare
        heavy = bare("heavy")
        from heavy.light import Thing
        print(heavy.VERSION, heavy.Thing is Thing, "heavy.db" in sys.modules)
        print(heavy.VERSION, sys.modules["heavy_init_runs"], bare("heavy") is heavy)
        try:
            heavy.missing
        except AttributeError as exc:
            print("missing:", exc)
        """,
        _package(tmp_path),
    )
    assert out.splitlines() == [
        "1 True True",
        "1 1 True",
        "missing: module 'heavy' has no attribute 'missing'",
    ]


def test_the_inspectors_pyroute2_leaves_its_databases_unimported() -> None:
    """pyroute2's ``__init__`` imports IPDB and NDB; the inspector's ``IPRoute`` is the same
    class without them, and ``pyroute2.IPRoute`` still answers (running the ``__init__``)."""
    out = _run(
        """
        from nlproxy.inspect.pyroute import IPRoute
        print("pyroute2.ndb" in sys.modules, "pyroute2.ipdb" in sys.modules)
        import pyroute2
        print(pyroute2.IPRoute is IPRoute, "pyroute2.ndb" in sys.modules)
        """
    )
    assert out.split() == ["False", "False", "True", "True"]


def test_a_deferring_import_leaves_what_waits_unimported_until_it_is_used(tmp_path: Path) -> None:
    """``deferring``: the module's imports of what waits bind stand-ins (nothing imported);
    a call imports the module and calls the real function, then the name is the real one; an
    attribute of ``import M.SUB`` imports it; a name that does not wait is the real one."""
    (tmp_path / "slow.py").write_text("def make(n):\n    return ('made', n)\n")
    pkg = tmp_path / "slowpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "part.py").write_text("VALUE = 7\n")
    (tmp_path / "light.py").write_text("ON = True\n")
    (tmp_path / "user.py").write_text(
        "import slowpkg.part\nfrom slow import make\nfrom light import ON\n"
        "def build(n):\n    return make(n)\n"
        "def value():\n    return slowpkg.part.VALUE\n"
    )
    out = _run(
        """
        import json
        from nlproxy.runtime.imports import deferring
        user = deferring("user", {"slow": ("make",), "slowpkg.part": ()})
        first = ["slow" in sys.modules, "slowpkg.part" in sys.modules, user.ON]
        built = user.build(3)
        import slow
        after = [user.make is slow.make, "slowpkg.part" in sys.modules]
        print(json.dumps([first, built, after, user.value(), "slowpkg.part" in sys.modules,
                          deferring("user", {}) is user]))
        """,
        tmp_path,
    )
    assert out.split("\n")[0] == (
        '[[false, false, true], ["made", 3], [true, false], 7, true, true]'
    )
