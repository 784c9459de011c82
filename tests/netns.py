"""Network namespaces for tests: unique names, always deleted, even after a failure.

Tests drive the standard tools (``ip``) to build their topology; nlproxy itself never runs them.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

_counter = itertools.count()

TOOLS = ("ip", "nft", "conntrack")


def missing_prerequisites() -> list[str]:
    """What a test that programs the kernel lacks here: the tools it drives, and root."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if os.geteuid() != 0:
        missing.append("root (the tests program the kernel)")
    return missing


def unique_name(prefix: str) -> str:
    """A namespace name no other test (or concurrent test run) uses: prefix, pid and a counter."""
    return f"nlp-{prefix}-{os.getpid()}-{next(_counter)}"


def sh(*cmd: str, ns: str | None = None, check: bool = True) -> str:
    """Run a command (inside ``ns`` when given) and return its stdout."""
    full = ["ip", "netns", "exec", ns, *cmd] if ns else list(cmd)
    proc = subprocess.run(full, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(full)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def create(name: str) -> str:
    sh("ip", "netns", "add", name)
    sh("ip", "link", "set", "lo", "up", ns=name)
    return name


def delete(name: str) -> None:
    sh("ip", "netns", "delete", name, check=False)


@contextmanager
def namespaces(*prefixes: str) -> Iterator[list[str]]:
    """Create one namespace per prefix; delete them all on exit."""
    made: list[str] = []
    try:
        for p in prefixes:
            made.append(create(unique_name(p)))  # noqa: PERF401 - keep what exists if one fails
        yield made
    finally:
        for name in made:
            delete(name)
