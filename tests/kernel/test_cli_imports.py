"""The read-only commands load only what they use: ``nlproxy version`` no netlink, Kubernetes,
metrics, trio, YAML or structlog code; ``rules``, ``conntrack list`` and ``cleanup`` none of the
daemon's libraries (``conntrack`` and ``rules`` not even structlog). Each runs in a fresh
interpreter, which then lists what it imported."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DAEMON_ONLY = ("kubernetes", "pyroute2", "prometheus_client", "trio", "yaml")

PROBE = """\
import sys
from nlproxy.cli import main
status = main(sys.argv[1:])
heavy = {heavy!r}
print("LOADED", *sorted(m for m in heavy if m in sys.modules), file=sys.stderr)
sys.exit(status)
"""


def loaded(*argv: str, heavy: tuple[str, ...]) -> tuple[int, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=heavy), *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
        timeout=60,
    )
    lines = [line for line in proc.stderr.splitlines() if line.startswith("LOADED")]
    assert lines, proc.stderr
    return proc.returncode, lines[-1].split()[1:]


def test_version_loads_no_library_it_does_not_use() -> None:
    status, mods = loaded("version", heavy=(*DAEMON_ONLY, "structlog", "asyncio"))
    assert (status, mods) == (0, [])


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(("rules",), id="rules"),
        pytest.param(("rules", "--json"), id="rules-json"),
        pytest.param(("conntrack", "list"), id="conntrack-list"),
        pytest.param(("cleanup",), id="cleanup"),
    ],
)
def test_read_only_commands_load_none_of_the_daemons_libraries(
    make_netns: Callable[[str], str], argv: tuple[str, ...]
) -> None:
    ns = make_netns("nlp-imp")
    demo = REPO / "examples" / "demo"
    status, _ = loaded(
        "--netns", ns, "run", "--once", "--manifests", str(demo), "--node-name", "node1",
        heavy=(),
    )  # fmt: skip
    assert status == 0
    quiet = ("structlog",) if argv[0] in ("conntrack", "rules") else ()  # they never log
    status, mods = loaded("--netns", ns, *argv, heavy=(*DAEMON_ONLY, *quiet))
    assert (status, mods) == (0, [])
