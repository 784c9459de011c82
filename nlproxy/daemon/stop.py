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

import structlog
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


def _stack(frame: FrameType | None, depth: int = 16) -> list[str]:
    """``frame`` and its callers, innermost first (``file:function:line``, at most ``depth``)."""
    out: list[str] = []
    while frame is not None and len(out) < depth:
        code = frame.f_code
        out.append(f"{os.path.basename(code.co_filename)}:{code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    return out


def _main_frame() -> FrameType | None:
    """The main thread's current frame (seen from another thread)."""
    return sys._current_frames().get(threading.main_thread().ident or 0)


OVERDUE = "tasks still running (a sync or a blocking call): ending the process, rules left in place"


class StopDeadline:
    """Ends the process with ``end`` if it still runs :data:`STOP_DEADLINE_SECONDS` after a
    stop was asked for (``end`` None: nothing may end the process, and nothing is armed).

    Two hands end it, whichever comes first: within :meth:`signals`, a SIGALRM handler on the
    main thread, which is where the stretched work of a busy node runs (the event loop's),
    so it ends it between two bytecodes without waiting for the interpreter lock to change
    hands; and a thread of its own, at twice the deadline, for a main thread that cannot run
    Python (a wait the signal does not interrupt). On a loaded node a thread waiting for the
    lock is slow to get it: with 2 CPUs at load 16, the thread alone was seen writing its
    line 0.4-0.9 s past the deadline.

    Either hand's line may block (stderr a pipe no one reads: a stalled log collector), and
    so may ``end``'s flush: the thread gives the hand that writes the line one more deadline,
    then ends the process with ``os._exit`` itself, unless ``end`` returned (where nothing may
    end the process: in-process callers).

    The line names the main thread's stack (``main``, innermost first: what the event loop
    was doing) and where each other thread was (``busy``).
    """

    def __init__(self, end: Callable[[int], object] | None, log: FilteringBoundLogger) -> None:
        self._end = end
        self.log = log
        self._deadline_pipe: int | None = None  # write end; see arm
        self._deadline_status: int | None = None
        self._alarm = False  # a SIGALRM handler is in place (within signals)
        self._once = threading.Lock()  # taken by the hand that ends the process
        self._returned = False  # ``end`` returned: nothing may end this process
        self._ctx = contextvars.copy_context()

    def arm(self, status: int) -> None:
        """Where the process may be ended, end it with ``status`` if it still runs
        :data:`STOP_DEADLINE_SECONDS` from now (the first call counts).

        Safe in a signal handler: it takes no lock (a handler that interrupted the main thread
        inside a lock it then wanted would hang), it sets a timer and writes a byte to a pipe
        the deadline's thread, started with the daemon, waits on.
        """
        if self._deadline_status is not None or not (self._alarm or self._deadline_pipe):
            return
        self._deadline_status = status
        if self._alarm:
            signal.setitimer(signal.ITIMER_REAL, STOP_DEADLINE_SECONDS)
        if self._deadline_pipe is not None:
            with contextlib.suppress(OSError):
                os.write(self._deadline_pipe, b"\0")

    def _overdue(self, *, main: FrameType | None) -> None:
        """End the process now, with the line that says so (the first caller only). ``main``:
        the main thread's frame, when the SIGALRM handler interrupted it (else looked up)."""
        if not self._once.acquire(blocking=False):
            return
        on_signal = main is not None
        status = self._deadline_status or 0
        fields = {
            "seconds": STOP_DEADLINE_SECONDS,
            "main": _stack(main if main is not None else _main_frame()),
            "busy": _busy_threads(),
            "error": OVERDUE,
        }
        if on_signal:
            # The handler may have interrupted the main thread inside the logger's own lock:
            # the line is rendered by the configured processors and written past it.
            _write_line("daemon.stop_overdue", fields)
        else:
            self.log.warning("daemon.stop_overdue", **fields)
        assert self._end is not None, "armed only with an end"
        try:
            self._ctx.run(self._end, status)
        except RuntimeError:  # interrupted inside stderr's own write: the thread ends it
            self._once.release()
        else:
            self._returned = True

    def start(self) -> None:
        """Start the deadline's thread (only where ``end`` may end the process)."""
        if self._end is None:
            return
        # In the daemon's context: what allows ``end`` to end the process is a context variable
        # of the command line's (``_fastexit``), which a new thread would not see.
        self._ctx = contextvars.copy_context()
        r, w = os.pipe2(os.O_CLOEXEC)
        self._deadline_pipe = w

        def deadline() -> None:
            os.read(r, 1)
            time.sleep(2 * STOP_DEADLINE_SECONDS if self._alarm else STOP_DEADLINE_SECONDS)
            # The line and ``end`` from a thread of their own: either may block on stderr.
            hand = threading.Thread(
                target=self._overdue, kwargs={"main": None}, name="stop-overdue", daemon=True
            )
            try:
                hand.start()
            except RuntimeError:  # no thread to be had (a pids limit): end it without a line
                os._exit(self._deadline_status or 0)
            hand.join(STOP_DEADLINE_SECONDS)
            if not self._returned:  # a hand is stuck (or the other one is): end it here
                os._exit(self._deadline_status or 0)

        threading.Thread(target=deadline, name="stop-deadline", daemon=True).start()

    @contextlib.contextmanager
    def signals(self, stopping: Callable[[int], None]) -> Iterator[None]:
        """SIGTERM and SIGINT stop the daemon (status 0): ``stopping(signum)`` runs on the
        trio thread. SIGALRM is the deadline's (see the class).

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

        def alarm(_signum: int, frame: FrameType | None) -> None:
            self._overdue(main=frame or _main_frame())

        taken = [(s, signal.signal(s, handler)) for s in (signal.SIGTERM, signal.SIGINT)]
        if self._end is not None:
            taken.append((signal.SIGALRM, signal.signal(signal.SIGALRM, alarm)))
            self._alarm = True
        try:
            yield
        finally:
            self._alarm = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            for signum, previous in taken:
                signal.signal(signum, previous)


def _write_line(event: str, fields: dict[str, object]) -> None:
    """Write one log line as the configured processors render it, straight to stderr's
    descriptor: no logger's lock, no buffer's."""
    line: object = {"component": "daemon", "event": event, **fields}
    for processor in structlog.get_config()["processors"]:
        line = processor(None, "warning", line)
    text = line if isinstance(line, str) else str(line)
    with contextlib.suppress(OSError):
        os.write(2, (text + "\n").encode())
