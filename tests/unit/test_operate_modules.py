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
