"""``operate/`` has one module per command, named as the command: each subcommand's module in
``commands/`` parses and prints, and imports its logic from ``nlproxy.operate.<its name>``
(``demo``'s logic is the ``demo/`` package's, which only ``commands/demo.py`` imports)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import nlproxy

PACKAGE = Path(nlproxy.__file__).parent
LOGIC_ELSEWHERE = {"demo": "nlproxy.demo"}


def _commands() -> dict[str, Path]:
    """Every subcommand: its ``NAME`` and module."""
    out = {}
    for path in sorted((PACKAGE / "commands").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if (
                isinstance(node, ast.Assign)
                and [getattr(t, "id", None) for t in node.targets] == ["NAME"]
                and isinstance(node.value, ast.Constant)
            ):
                out[str(node.value.value)] = path
    return out


def _imported(path: Path) -> set[str]:
    """The modules ``path`` imports (``from P import M`` counts as ``P`` and ``P.M``)."""
    found = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom) and n.module:
            found |= {n.module, *(f"{n.module}.{a.name}" for a in n.names)}
        elif isinstance(n, ast.Import):
            found |= {a.name for a in n.names}
    return found


def test_every_command_is_found() -> None:
    assert set(_commands()) >= {
        "run", "rules", "conntrack", "status", "services", "inspect", "explain", "preflight",
        "cleanup", "compare", "plan", "demo", "version",
    }  # fmt: skip


@pytest.mark.parametrize("name", sorted(_commands()))
def test_a_commands_logic_is_the_operate_module_of_its_name(name: str) -> None:
    module = _commands()[name]
    assert module.stem == name, f"commands/{module.name} is the {name!r} command"
    logic = LOGIC_ELSEWHERE.get(name, f"nlproxy.operate.{name}")
    if name not in LOGIC_ELSEWHERE:
        assert (PACKAGE / "operate" / f"{name}.py").is_file(), f"no operate/{name}.py"
    imported = _imported(module)
    assert any(m == logic or m.startswith(f"{logic}.") for m in imported), (
        f"commands/{module.name} does not import {logic}"
    )


MAX_FUNCTION = 60
MAX_MODULE = 700
SIZED = ("operate", "config", "commands")


def _sources() -> list[Path]:
    return sorted(p for d in SIZED for p in (PACKAGE / d).glob("*.py"))


@pytest.mark.parametrize("path", _sources(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_modules_and_functions_stay_readable(path: Path) -> None:
    """No module over 700 lines; no function over 60 without a comment just above it that says
    why it is one piece."""
    lines = path.read_text().splitlines()
    assert len(lines) <= MAX_MODULE
    for node in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        assert node.end_lineno is not None
        if node.end_lineno - node.lineno + 1 <= MAX_FUNCTION:
            continue
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        block = []  # the comment lines just above the def (or its decorators)
        for line in reversed(lines[: first - 1]):
            if not line.strip().startswith("#"):
                break
            block.append(line.strip())
        assert any("one piece" in c.lower() for c in block), (
            f"{node.name} ({node.end_lineno - node.lineno + 1} lines) is longer than "
            f"{MAX_FUNCTION} lines without a comment saying why it is one piece"
        )
