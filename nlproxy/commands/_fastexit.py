"""Ending a one-shot command at once: its output flushed, the process exits without freeing
its heap (at 10k Services x 10 endpoints, tearing down the cluster state and the plan object by
object took a sixth of ``run --once``).

Only the console entry point (``cli.entry``) allows it; ``cli.main`` called in-process (the
tests) returns as usual. The kernel releases what the process holds (sockets, the namespace
lock) as at any exit.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from contextvars import ContextVar

_ALLOWED: ContextVar[bool] = ContextVar("fast_exit_allowed", default=False)
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE, as ``cli.EXIT_BROKEN_PIPE``."""


def allow() -> None:
    """Let ``end`` exit the process (``cli.entry`` only)."""
    _ALLOWED.set(True)


def allowed() -> bool:
    """Whether :func:`end` ends the process here (the console entry point), not returns (a
    command line run in-process)."""
    return _ALLOWED.get()


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A command line run inside another (the demo's steps) returns instead of ending the
    process that runs it."""
    token = _ALLOWED.set(False)
    try:
        yield
    finally:
        _ALLOWED.reset(token)


def end(status: int) -> int:
    """``status``, or, where allowed, exit with it now: stdout and stderr flushed first (a
    closed stdout pipe exits 141, as the interpreter's own ending would be reported)."""
    if not _ALLOWED.get():
        return status
    os._exit(flushed(status))


def flushed(status: int) -> int:
    """``status`` once stdout and stderr are flushed; 141 if stdout's pipe was closed."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        status = EXIT_BROKEN_PIPE
    except (OSError, ValueError):
        pass  # stdout closed: nothing more to write
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    return status
