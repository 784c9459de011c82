"""The daemon's bounded stop: a deadline after which the process ends as it stands.

A stop (SIGTERM, SIGINT, a changed ``--config``) cancels the daemon's tasks on the trio thread;
:class:`StopDeadline` makes sure the process ends :data:`STOP_DEADLINE_SECONDS` later whatever
they are doing: a worker thread still busy in a sync, a read-back or a blocking call is left
behind, and the process ends with its logs flushed (``end``, given by the command line). The
rules are left as they are at any instant: a batch is atomic in the kernel, and the next start
reads the kernel back and sends only the differences.

Wiring only: it holds no state but the deadline's own.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

STOP_DEADLINE_SECONDS = 0.25
"""After a stop is asked for, the longest the daemon waits for its tasks to wind down before
the process is ended as it stands (worker threads left behind).

Nothing needs the time: the rules, sockets and the namespace lock are the kernel's to keep or
release, and the logs are flushed either way. Short, because on a busy node the trio thread
can be inside seconds of stretched CPU work (a full plan's bookkeeping, the inspector's index)
and the process's own teardown after the deadline still takes a few hundred milliseconds
there: at 5k Services x 10 and load 13 on 2 CPUs, 0.5 s gave exits of 0.9-1.0 s
(``bench/bench_shutdown.py``); issue 36 asks for 1 s at any load. Quiet stops take 0.01-0.2 s
and never reach it."""


def _busy_threads() -> list[str]:
    """Where every other thread is (``thread: file:function:line``, its innermost frame in
    nlproxy's code): what an overdue stop was waiting for."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
            continue
        f: FrameType | None = frame
        while f is not None and "/nlproxy/" not in f.f_code.co_filename:
            f = f.f_back
        at = f or frame
        where = f"{os.path.basename(at.f_code.co_filename)}:{at.f_code.co_name}:{at.f_lineno}"
        out.append(f"{names.get(ident, ident)}: {where}")
    return out


class StopDeadline:
    """Ends the process with ``end`` if it still runs :data:`STOP_DEADLINE_SECONDS` after a
    stop was asked for (``end`` None: nothing may end the process, and nothing is armed)."""

    def __init__(self, end: Callable[[int], object] | None, log: FilteringBoundLogger) -> None:
        self._end = end
        self.log = log
        self._deadline_pipe: int | None = None  # write end; see arm
        self._deadline_status: int | None = None

    def arm(self, status: int) -> None:
        """Where the process may be ended, end it with ``status`` if it still runs
        :data:`STOP_DEADLINE_SECONDS` from now (the first call counts).

        Safe in a signal handler: it takes no lock (a handler that interrupted the main thread
        inside a lock it then wanted would hang), it writes a byte to a pipe the deadline's
        thread, started with the daemon, waits on.
        """
        if self._deadline_pipe is None or self._deadline_status is not None:
            return
        self._deadline_status = status
        with contextlib.suppress(OSError):
            os.write(self._deadline_pipe, b"\0")

    def start(self) -> None:
        """Start the deadline's thread (only where ``end`` may end the process)."""
        end = self._end
        if end is None:
            return
        # In the daemon's context: what allows ``end`` to end the process is a context variable
        # of the command line's (``_fastexit``), which a new thread would not see.
        ctx = contextvars.copy_context()
        r, w = os.pipe2(os.O_CLOEXEC)
        self._deadline_pipe = w

        def deadline() -> None:
            os.read(r, 1)
            time.sleep(STOP_DEADLINE_SECONDS)
            status = self._deadline_status or 0
            self.log.warning(
                "daemon.stop_overdue",
                seconds=STOP_DEADLINE_SECONDS,
                busy=_busy_threads(),
                error="tasks still running (a sync or a blocking call): ending the process, "
                "rules left in place",
            )
            ctx.run(end, status)

        threading.Thread(target=deadline, name="stop-deadline", daemon=True).start()

    @contextlib.contextmanager
    def signals(self, stopping: Callable[[int], None]) -> Iterator[None]:
        """SIGTERM and SIGINT stop the daemon (status 0): ``stopping(signum)`` runs on the
        trio thread.

        Handled by plain signal handlers, not a trio signal receiver: a handler runs on the
        main thread between two bytecodes even while the trio thread is busy (applying a large
        burst of changes to the state, building a snapshot), so the deadline is armed at once
        and holds whatever the event loop is doing; the cancellation follows on the loop.
        """
        token = trio.lowlevel.current_trio_token()

        def handler(signum: int, _frame: object) -> None:
            self.arm(0)
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(stopping, signum)

        taken = [(s, signal.signal(s, handler)) for s in (signal.SIGTERM, signal.SIGINT)]
        try:
            yield
        finally:
            for signum, previous in taken:
                signal.signal(signum, previous)
