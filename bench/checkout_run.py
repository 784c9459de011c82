"""A bench's measured child process, run from one checkout: the parent's side, for every bench.

A bench that compares checkouts (this one and ``--base`` or ``--tree``) runs its measured work
in a fresh ``python`` of each checkout: that checkout's interpreter (its ``.venv``), its working
directory, and its nlproxy from compiled bytecode as an installed nlproxy runs
(``bytecode.py``). The child says what it measured as one JSON object on the last line of its
standard output (:func:`json_result`); a daemon's child is started and read by its bench
(:func:`spawn`).

Only the parent imports this module: a child (a bench script run with ``--child``, or code
given with ``-c``) must import the checkout under measure, and this module keeps nothing from
this checkout on its path. It imports only the standard library and ``bytecode`` (the same),
and changes no ``sys.path``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bench import bytecode

STDERR_TAIL = 600
"""Characters of a failed child's stderr that its message keeps (its traceback's last lines)."""


class ChildFailed(SystemExit):
    """A child exited non-zero, timed out, or printed no JSON: one line naming the bench, the
    checkout and what the child said (uncaught, the bench exits 1 with it, no traceback)."""


def prepare(trees: Iterable[Path]) -> None:
    """Compile each checkout to bytecode once, before anything of it is measured.

    Raises:
        ChildFailed: a checkout's module did not compile.
    """
    for tree in dict.fromkeys(t.resolve() for t in trees):
        try:
            bytecode.prepare(tree)
        except RuntimeError as e:
            raise ChildFailed(str(e)) from None


def command(tree: Path, args: Sequence[str | Path]) -> list[str]:
    """``tree``'s interpreter with ``args`` (a script and its flags, ``-c CODE ...``, ``-m``).
    Paths come out absolute: the child starts in ``tree``, where a relative one means another
    place."""
    absolute = (a.resolve() if isinstance(a, Path) else a for a in args)
    return [bytecode.python(tree.resolve()), *map(str, absolute)]


def environ(tree: Path, path: Sequence[Path] = ()) -> dict[str, str]:
    """The child's environment: ``tree``'s bytecode cache, and ``path`` first on its
    ``sys.path`` (``PYTHONPATH``) where the child does not put its checkout there itself."""
    env = bytecode.env(tree.resolve())
    if path:
        env["PYTHONPATH"] = os.pathsep.join(str(p.resolve()) for p in path)
    return env


def json_result(
    name: str,
    tree: Path,
    args: Sequence[str | Path],
    *,
    path: Sequence[Path] = (),
    timeout: float | None = None,
) -> dict[str, Any]:
    """Run ``args`` with ``tree``'s interpreter in ``tree`` and return the JSON object on the
    last line of its standard output (its stderr is kept only for a failure's message).

    Raises:
        ChildFailed: the child exited non-zero, ran past ``timeout`` seconds, or its last line
            is not a JSON object; the message starts with ``name`` (the bench).
    """
    tree = tree.resolve()
    try:
        done = subprocess.run(
            command(tree, args),
            cwd=tree,
            env=environ(tree, path),
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise ChildFailed(f"{name}: {tree}: the child ran past {timeout} s") from None
    if done.returncode != 0:
        said = done.stderr.strip()[-STDERR_TAIL:]
        raise ChildFailed(f"{name}: {tree}: the child exited {done.returncode}: {said}")
    lines = done.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except ValueError:
        result = None
    if not isinstance(result, dict):
        raise ChildFailed(f"{name}: {tree}: the child printed no JSON object last")
    return result


def rounds(
    name: str,
    trees: Sequence[Path],
    count: int,
    args: Sequence[str | Path],
    *,
    path: Sequence[Path] = (),
) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """Prepare ``trees``, then run ``args`` in each of them, in order, ``count`` times over:
    (round, the tree's index in ``trees``, its child's JSON); each child has its own tree
    first on its path, then ``path``."""
    prepare(trees)
    for n in range(count):
        for i, tree in enumerate(trees):
            yield n, i, json_result(name, tree, args, path=(tree, *path))


def spawn(tree: Path, args: Sequence[str | Path], **popen: Any) -> subprocess.Popen[str]:
    """Start ``args`` with ``tree``'s interpreter in ``tree``, from bytecode, and return it
    (a daemon its bench reads and stops); ``popen`` are ``Popen``'s other arguments (its
    streams: text mode is set)."""
    tree = tree.resolve()
    return subprocess.Popen(command(tree, args), cwd=tree, env=environ(tree), text=True, **popen)
