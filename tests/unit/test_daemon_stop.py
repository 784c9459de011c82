"""The daemon's stop deadline (``daemon/stop.py``): once armed it ends the process with the first
status asked for, in the daemon's context, and its last line says where each thread was."""

from __future__ import annotations

import contextvars
import os
import queue
import subprocess
import sys
import threading
import time
from typing import Any, cast

import pytest
from structlog.typing import FilteringBoundLogger

from nlproxy.daemon.stop import StopDeadline

ALLOWED: contextvars.ContextVar[bool] = contextvars.ContextVar("allowed", default=False)


class Recorder:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **kw: Any) -> None:
        self.lines.append((event, kw))


def test_an_armed_deadline_ends_with_the_first_status_and_names_the_busy_threads() -> None:
    release = threading.Event()
    busy = threading.Thread(target=release.wait, name="busy-sync", daemon=True)
    busy.start()
    ended: queue.Queue[tuple[int, bool]] = queue.Queue()
    log = Recorder()
    # What lets ``end`` end the process is a context variable of the command line's: the
    # deadline's thread must see the daemon's context.
    ALLOWED.set(True)
    try:
        deadline = StopDeadline(
            lambda status: ended.put((status, ALLOWED.get())), cast(FilteringBoundLogger, log)
        )
        deadline.start()
        deadline.arm(3)  # a changed --config
        deadline.arm(0)  # a SIGTERM meanwhile: the first stop's status stands
        assert ended.get(timeout=60) == (3, True)
    finally:
        ALLOWED.set(False)
        release.set()
        busy.join(timeout=10)
    ((event, fields),) = log.lines
    assert event == "daemon.stop_overdue"
    assert any(where.startswith("busy-sync: ") for where in fields["busy"]), fields["busy"]
    # The main thread's stack, innermost first: here, this test waiting for the queue.
    assert any(":test_an_armed_deadline_ends" in where for where in fields["main"])


def test_without_an_end_nothing_is_armed() -> None:
    """In-process callers (the tests, the demo) pass no ``end``: a stop must never end them."""
    log = Recorder()
    deadline = StopDeadline(None, cast(FilteringBoundLogger, log))
    # The test before may leave its deadline's thread ending still: only a new one counts.
    before = {t for t in threading.enumerate() if t.name == "stop-deadline"}
    deadline.start()
    deadline.arm(0)
    assert not {t for t in threading.enumerate() if t.name == "stop-deadline"} - before
    assert log.lines == []


async def test_the_alarm_ends_a_main_thread_busy_in_python(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The event loop's thread stretched over CPU work (a busy node): the SIGALRM hand ends
    it between two bytecodes, its line written past the logger."""
    ended: list[tuple[int, bool]] = []
    log = Recorder()
    ALLOWED.set(True)
    try:
        deadline = StopDeadline(
            lambda status: ended.append((status, ALLOWED.get())), cast(FilteringBoundLogger, log)
        )
        with deadline.signals(lambda _signum: None):
            deadline.arm(5)
            limit = time.monotonic() + 60
            while not ended and time.monotonic() < limit:
                _spin()  # Python work on the main thread, as the loop's
    finally:
        ALLOWED.set(False)
    assert ended == [(5, True)]
    assert log.lines == []  # not the thread's hand (none was started)
    err = capfd.readouterr().err
    assert "daemon.stop_overdue" in err
    assert "_spin" in err  # the main thread's stack: where the loop was busy


def _spin() -> int:
    # A loop of bytecodes, not one C call: the interpreter takes a pending signal at a jump
    # back, and after a C call the first one would be in the caller's loop, not here.
    total = 0
    for i in range(10_000):
        total += i
    return total


STALLED = """
import fcntl, os
import trio
from nlproxy.commands import _fastexit
from nlproxy.daemon.stop import StopDeadline
from nlproxy.log import get_logger

# stderr is a pipe no one reads: fill it, so the next write blocks (a stalled log collector).
flags = fcntl.fcntl(2, fcntl.F_GETFL)
fcntl.fcntl(2, fcntl.F_SETFL, flags | os.O_NONBLOCK)
try:
    while True:
        os.write(2, b"x" * 4096)
except BlockingIOError:
    pass
fcntl.fcntl(2, fcntl.F_SETFL, flags)
_fastexit.allow()


async def main():
    deadline = StopDeadline(_fastexit.end, get_logger("daemon"))
    deadline.start()
    with deadline.signals(lambda signum: None):
        deadline.arm(7)
        os.write(1, b"armed\\n")
        while True:
            sum(range(1000))  # the loop's Python work: the SIGALRM hand runs, blocks writing


trio.run(main)
"""


def test_a_hand_blocked_on_a_stalled_stderr_still_ends_the_process() -> None:
    """The SIGALRM hand blocks writing its line to a full stderr pipe: the deadline's thread
    ends the process all the same, with the stop's status."""
    r, w = os.pipe()
    try:
        with subprocess.Popen(
            [sys.executable, "-c", STALLED], stdout=subprocess.PIPE, stderr=w, text=True
        ) as proc:
            os.close(w)
            w = -1
            assert proc.stdout is not None
            assert proc.stdout.readline() == "armed\n"
            try:
                status = proc.wait(timeout=60)  # generous: a shared machine
            except subprocess.TimeoutExpired:
                proc.kill()
                raise
    finally:
        os.close(r)
        if w != -1:
            os.close(w)
    assert status == 7


NO_THREADS = """
import os, threading, time
from nlproxy.commands import _fastexit
from nlproxy.daemon.stop import StopDeadline
from nlproxy.log import get_logger

_fastexit.allow()
deadline = StopDeadline(_fastexit.end, get_logger("daemon"))
deadline.start()


def refused(self):
    raise RuntimeError("can't start new thread")  # a pids limit reached


threading.Thread.start = refused
deadline.arm(5)
os.write(1, b"armed\\n")
time.sleep(600)  # a main thread that runs no Python: only the deadline's thread can end it
"""


def test_a_deadline_that_cannot_start_its_hand_ends_the_process_itself() -> None:
    """No thread to be had for the hand that writes the line: the deadline's thread ends the
    process with the stop's status, without the line."""
    with subprocess.Popen(
        [sys.executable, "-c", NO_THREADS], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"armed\n"
        try:
            status = proc.wait(timeout=60)  # generous: a shared machine
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert status == 5
