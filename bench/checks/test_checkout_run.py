"""``checkout_run``: a bench's child runs in its checkout (its code first, its bytecode cache),
its last JSON line is the result, and a failed child ends the bench with one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench import bytecode, checkout_run

REPORT = (
    "import json, os, sys; import nlproxy; "
    "print('warming up'); "
    "print(json.dumps({'nlproxy': nlproxy.__file__, 'cwd': os.getcwd(), 'argv': sys.argv[1:], "
    "'pycache': os.environ.get('PYTHONPYCACHEPREFIX'), "
    "'nobytecode': os.environ.get('PYTHONDONTWRITEBYTECODE'), "
    "'path': os.environ.get('PYTHONPATH')}))"
)


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The children's bytecode in this test's directory, not in the benches' shared cache."""
    monkeypatch.setattr(bytecode, "CACHE", tmp_path / "pycache")


def _checkout(tmp_path: Path) -> Path:
    """A checkout of its own (no ``.venv``: this interpreter, which has this checkout's
    ``nlproxy`` installed) whose ``nlproxy`` is a stand-in."""
    tree = tmp_path / "other"
    (tree / "nlproxy").mkdir(parents=True)
    (tree / "nlproxy" / "__init__.py").write_text("")
    return tree


def test_the_child_runs_the_checkout_under_measure_from_its_bytecode_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    tree = _checkout(tmp_path)
    got = checkout_run.json_result("test", tree, ["-c", REPORT, 7, tmp_path])
    assert got["nlproxy"] == str(tree / "nlproxy" / "__init__.py")  # not this checkout's
    assert got["cwd"] == str(tree)
    assert got["argv"] == ["7", str(tmp_path)]
    assert got["pycache"] == bytecode.env(tree)["PYTHONPYCACHEPREFIX"]
    assert Path(got["pycache"]).is_relative_to(tmp_path / "pycache")
    assert got["nobytecode"] is None
    assert got["path"] is None


def test_path_goes_first_on_the_childs_path(tmp_path: Path) -> None:
    tree = _checkout(tmp_path)
    extra = tmp_path / "extra"
    got = checkout_run.json_result("test", tree, ["-c", REPORT], path=[tree, extra])
    assert got["path"] == f"{tree}:{extra}"


def test_a_failed_child_ends_the_bench_with_one_line_naming_it(tmp_path: Path) -> None:
    tree = _checkout(tmp_path)
    fail = "import sys; print('partial', flush=True); sys.exit('the cluster did not load')"
    with pytest.raises(checkout_run.ChildFailed) as e:
        checkout_run.json_result("bench_x", tree, ["-c", fail])
    assert str(e.value) == f"bench_x: {tree}: the child exited 1: the cluster did not load"


@pytest.mark.parametrize("out", ["", "no json here", "[1, 2]"])
def test_a_child_without_a_json_object_last_fails(tmp_path: Path, out: str) -> None:
    tree = _checkout(tmp_path)
    with pytest.raises(checkout_run.ChildFailed, match="printed no JSON object last"):
        checkout_run.json_result("bench_x", tree, ["-c", f"print({out!r})"])


def test_a_child_past_its_timeout_fails(tmp_path: Path) -> None:
    tree = _checkout(tmp_path)
    sleep = ["-c", "import time; time.sleep(60)"]
    with pytest.raises(checkout_run.ChildFailed, match=r"ran past 0\.5 s"):
        checkout_run.json_result("bench_x", tree, sleep, timeout=0.5)


def test_an_uncaught_failure_is_one_line_and_exit_1(tmp_path: Path) -> None:
    tree = _checkout(tmp_path)
    bench = Path(checkout_run.__file__).resolve().parent
    driver = (
        "import sys; from pathlib import Path; "
        f"sys.path.insert(0, {str(bench.parent)!r}); from bench import bytecode, checkout_run; "
        f"bytecode.CACHE = Path({str(tmp_path / 'pycache')!r}); "
        f"checkout_run.json_result('bench_x', Path({str(tree)!r}), ['-c', 'raise SystemExit(3)'])"
    )
    done = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr == f"bench_x: {tree}: the child exited 3: \n"


def test_spawn_starts_the_checkouts_python_in_it(tmp_path: Path) -> None:
    tree = _checkout(tmp_path)
    proc = checkout_run.spawn(tree, ["-c", REPORT], stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert f'"cwd": "{tree}"' in out
    assert f'"nlproxy": "{tree / "nlproxy" / "__init__.py"}"' in out


def test_a_checkout_given_by_a_relative_path_runs_from_where_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child starts in its checkout: a path relative to the bench's directory (``--base
    wt-base``) means another place there, so the child's paths are made absolute."""
    tree = _checkout(tmp_path)
    monkeypatch.chdir(tmp_path)
    here = Path(tree.name)
    got = checkout_run.json_result("test", here, ["-c", REPORT, here], path=[here])
    assert got["cwd"] == str(tree)
    assert got["argv"] == [str(tree)]
    assert got["path"] == str(tree)
    assert got["pycache"] == bytecode.env(tree)["PYTHONPYCACHEPREFIX"]
