"""The read-only commands load only what they use: ``nlproxy version`` no netlink, Kubernetes,
metrics, trio, YAML or structlog code; ``rules``, ``conntrack list`` and ``cleanup`` none of the
daemon's libraries (and not even structlog: they never log); ``conntrack flush`` by address,
port and protocol nothing but the conntrack codec and its socket. Each runs in a fresh
interpreter, which then lists what it imported."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from nlproxy.conntrack.kernel import Conntrack
from tests.kernel.test_conntrack_cli import fill, flow

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
    quiet = ("structlog",) if argv[0] in ("conntrack", "rules", "cleanup") else ()  # never log
    status, mods = loaded("--netns", ns, *argv, heavy=(*DAEMON_ONLY, *quiet))
    assert (status, mods) == (0, [])


FLUSH_BY_FILTERS_NEVER_LOADS = (
    *DAEMON_ONLY,
    "structlog",
    "json",
    "logging",  # no logging set up, and nothing that logs
    "nlproxy.conntrack.lines",  # the listing's line maker
    "shutil",  # argparse's help width (it loads the bz2 and lzma libraries)
    "nlproxy.proxy",  # the planner and the layout reader (read back for --service only)
    "nlproxy.nft",
    "nlproxy.cluster",
    "nlproxy.sync",
    "nlproxy._nftshim",
)


def test_flush_by_filters_loads_no_planner_no_nftables_and_no_logging(
    make_netns: Callable[[str], str],
) -> None:
    ns = make_netns("nlp-imp")
    gone = [flow("udp", "10.1.0.1", p, "10.96.0.7", 53, "10.244.0.8", 5353) for p in (1, 2, 3)]
    kept = flow("udp", "10.1.0.1", 2000, "10.96.0.7", 53, "10.244.0.9", 5353)
    fill(ns, [*gone, kept])
    status, mods = loaded(
        "--netns", ns, "conntrack", "flush", "--proto", "udp", "--dst", "10.96.0.7",
        "--dport", "53", "--endpoint", "10.244.0.8",
        heavy=FLUSH_BY_FILTERS_NEVER_LOADS,
    )  # fmt: skip
    assert (status, mods) == (0, [])
    assert [f.reply.src for f in Conntrack(ns).list()] == [kept.reply.src]
