"""nlproxy stays readable: no module over 700 lines, no function over 60 without a reason.

A function longer than 60 lines is allowed when a comment on its ``def`` line or in the comment
lines just above it (or its decorators) says why it is one piece (``# One piece: ...``), as a
hot loop kept flat or a table of declarations would.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "nlproxy"
MODULE_LINES = 700
FUNCTION_LINES = 60
REASON = "one piece"


def long_functions(source: str) -> list[tuple[str, int, int]]:
    """``(name, first line, length)`` of each function over ``FUNCTION_LINES`` lines (the
    decorators and the ``def`` included) without a comment saying it is one piece on its
    ``def`` line or in the comment lines just above it."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        assert node.end_lineno is not None
        length = node.end_lineno - first + 1
        if length <= FUNCTION_LINES:
            continue
        said = [lines[node.lineno - 1]]
        for line in reversed(lines[: first - 1]):
            if not line.strip().startswith("#"):
                break
            said.append(line)
        if not any(REASON in line.lower() for line in said if "#" in line):
            found.append((node.name, first, length))
    return found


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_module_over_700_lines() -> None:
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in _modules()}
    assert len(sizes) > 100, PACKAGE
    assert {name: n for name, n in sizes.items() if n > MODULE_LINES} == {}


def test_no_function_over_60_lines_without_a_reason() -> None:
    found = {
        str(p.relative_to(PACKAGE)): long
        for p in _modules()
        if (long := long_functions(p.read_text()))
    }
    assert found == {}


BODY = "".join(f"    x{i} = {i}\n" for i in range(FUNCTION_LINES))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param(f"def f():\n{BODY}", [("f", 1, FUNCTION_LINES + 1)], id="too-long"),
        pytest.param(f"def f():\n{BODY[: BODY.rindex('    x')]}", [], id="sixty-lines"),
        pytest.param(f"# one piece: a hot loop\ndef f():\n{BODY}", [], id="reason-above"),
        pytest.param(
            f"# One piece (61 lines): a table,\n# one entry a line.\ndef f():\n{BODY}",
            [],
            id="reason-in-the-block-above",
        ),
        pytest.param(
            f"# one piece: not this one's\nx = 1\ndef f():\n{BODY}", [("f", 3, 61)], id="too-far"
        ),
        pytest.param(f"def f():  # one piece: flat\n{BODY}", [], id="reason-on-def"),
        pytest.param(f"# a comment, no reason\ndef f():\n{BODY}", [("f", 2, 61)], id="no-reason"),
        pytest.param(
            f"class C:\n    @staticmethod\n    def m():\n{BODY.replace('    ', '        ')}",
            [("m", 2, FUNCTION_LINES + 2)],
            id="method-with-decorator",
        ),
    ],
)
def test_long_functions_finds_what_it_should(
    source: str, expected: list[tuple[str, int, int]]
) -> None:
    assert long_functions(source) == expected
