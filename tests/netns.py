"""Network namespaces and commands for tests and benchmarks: unique names, always deleted.

Namespaces are made and removed by the demo test bed's own code (``nlproxy/demo/ns.py``, the one
implementation); tests and benchmarks then drive the standard tools (``ip``, ``nft``,
``conntrack``) inside them with :func:`sh`; nlproxy itself never runs them.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from nlproxy.demo import ns as demo_ns

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


class CommandFailed(RuntimeError):
    """A command run by :func:`sh` exited with an error (its argv, status and stderr)."""


def sh(*cmd: str, ns: str | None = None, check: bool = True, input_: str | None = None) -> str:
    """Run a command (inside ``ns`` when given; ``input_`` on its stdin) and return its stdout."""
    full = ["ip", "netns", "exec", ns, *cmd] if ns else list(cmd)
    proc = subprocess.run(full, capture_output=True, text=True, input=input_, check=False)
    if check and proc.returncode != 0:
        raise CommandFailed(f"{' '.join(full)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def create(name: str) -> str:
    """Namespace ``name`` with its loopback up."""
    demo_ns.create(name)
    try:
        sh("ip", "link", "set", "lo", "up", ns=name)
    except CommandFailed:
        demo_ns.delete(name)
        raise
    return name


def delete(name: str) -> None:
    """Delete ``name``; one already gone is no error."""
    demo_ns.delete(name)


@contextmanager
def namespace(prefix: str) -> Iterator[str]:
    """A fresh namespace (loopback up), deleted on exit even after a failure."""
    with namespaces(prefix) as (name,):
        yield name


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


def default_sigint() -> None:
    """A ``preexec_fn`` for a child a test interrupts with SIGINT: the default handler, as a
    terminal's Ctrl-C finds it. A run started in the background ignores SIGINT, its children
    inherit the ignore, and Python then never raises KeyboardInterrupt in them."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
