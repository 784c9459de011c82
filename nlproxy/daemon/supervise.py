"""The daemon's long-running tasks: which are kept running, and how the others end it.

Each task the daemon starts for good handles the failures it knows of itself (an unreachable
API server, a refused dump). Anything else it raises is a fault of nlproxy's or of something
it did not foresee. What becomes of the task then depends on what it does:

- A task that only reports (the reachability inspector, the foreign-proxy check) is kept
  running under :meth:`Supervisor.keep`: the failure is logged with the task's name and the
  error (``task.failed``; the stack with it when the error names nothing), once while it
  repeats (the same failure again is a debug line); the task is started again after a backoff
  (``RESTART_INITIAL`` doubling to ``RESTART_MAX``), and ``nlproxy_task_restarts_total{task}``
  counts it. ``/healthz`` does not look at it: the rules are right meanwhile, and a load
  balancer probing ``/healthz`` must not drop every node for a fault in a report.
- A task that programs or steers the rules (the source, the generation watch, the address and
  ``--config`` watches) ends the daemon, status 1 (:func:`ending`): restarted in-process it
  would leave half-states a process never has (a source's abandoned list threads, a half
  applied ``--config`` change), while the process's own restart is safe: nothing is sent to the
  kernel meanwhile, systemd or the DaemonSet starts it again, and it relists cleanly.

A failure before a task first reports itself started is the start's, in both cases: it ends
the daemon as it is (a configuration or permission error then has its own exit status). A
stop cancels everything at once, backoffs included. Wiring only: what each task does is its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from nlproxy.errors import NlproxyError
from nlproxy.log import get_logger

if TYPE_CHECKING:
    from prometheus_client import Counter

RESTART_INITIAL = 1.0
"""Seconds before the first restart of a failed task; doubled at each failure in a row."""
RESTART_MAX = 60.0
"""The longest wait before a restart."""
STEADY_SECONDS = 60.0
"""A task that ran this long since it was (re)started has recovered: its count and backoff
start afresh."""

Task = Callable[..., Awaitable[object]]
"""A long-running task: called with ``task_status=`` only, it calls ``started()`` once ready."""


class TaskEnded(NlproxyError):
    """A task that programs or steers the rules failed after it started: the daemon ends
    (status 1), the line naming the task and its error."""


class Supervisor:
    """Runs report-only tasks under :meth:`keep`, restarting them; counts the restarts.

    Args:
        restarts: the counter of restarts, labelled ``task``.
        initial, maximum, steady: see the module's constants.
    """

    def __init__(
        self,
        restarts: Counter,
        *,
        initial: float = RESTART_INITIAL,
        maximum: float = RESTART_MAX,
        steady: float = STEADY_SECONDS,
    ) -> None:
        self.restarts = restarts
        self.initial, self.maximum, self.steady = initial, maximum, steady
        self.log = get_logger("daemon")

    async def keep(
        self,
        name: str,
        task: Task,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run ``task``, and again after each failure once it has started; returns when it
        returns (its work done).

        Raises:
            Exception: whatever ``task`` raised before it first reported itself started.

        Cancellation: at once, in the task or in a backoff.
        """
        self.restarts.labels(task=name)  # the series exists at 0 from the start
        run = _Run(name, self.initial)
        while True:
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(self._body, task, nursery.cancel_scope)
                    if not run.started:
                        run.started = True
                        task_status.started()
                    nursery.start_soon(self._steady, run)
            except Exception as exc:
                if not run.started:
                    raise
                delay = self._failed(run, exc)
            else:  # the task returned
                return
            await trio.sleep(delay)
            self.restarts.labels(task=name).inc()

    @staticmethod
    async def _body(
        task: Task,
        scope: trio.CancelScope,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """``task``; once it returns, the rest of its nursery (the steady timer) is cancelled."""
        await task(task_status=task_status)
        scope.cancel()

    async def _steady(self, run: _Run) -> None:
        """After ``steady`` seconds of running, the task's failures are behind it."""
        await trio.sleep(self.steady)
        if run.failures:
            self.log.info("task.recovered", task=run.name, after=run.error, failures=run.failures)
        run.failures, run.error, run.delay = 0, None, self.initial

    def _failed(self, run: _Run, exc: Exception) -> float:
        """Say the failure (once while it repeats), note it; returns the wait before the
        restart."""
        leaf = _leaf(exc)
        named = isinstance(leaf, NlproxyError)
        error = _said(leaf)
        delay, run.delay = run.delay, min(self.maximum, run.delay * 2)
        run.failures += 1
        fields = {"task": run.name, "error": error, "restart_in": delay, "failures": run.failures}
        if error == run.error:
            self.log.debug("task.failed", **fields)
        elif named:  # says what failed: no stack
            self.log.error("task.failed", **fields)
        else:
            self.log.error("task.failed", **fields, exc_info=leaf)
        run.error = error
        return delay


class _Run:
    """One supervised task's record: failures in a row, the last one, the next backoff."""

    __slots__ = ("delay", "error", "failures", "name", "started")

    def __init__(self, name: str, delay: float) -> None:
        self.name = name
        self.delay = delay
        self.failures = 0
        self.error: str | None = None
        self.started = False


def at_once(task: Callable[[], Awaitable[object]]) -> Task:
    """``task`` (which takes no ``task_status``) as a :data:`Task` started as it begins."""

    async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await task()

    return run


def ending(name: str, task: Task) -> Task:
    """``task`` as one whose failure after it started ends the daemon with one line naming it:
    a :class:`TaskEnded` for an error that names its object (no stack), else the error as it is
    (the command line's top level decides how a bug is said), after a ``task.ended`` line that
    names the task. A failure before it started is raised as it is (the start's: a
    configuration error keeps its status 2)."""

    async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        started = False
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(task)
                started = True
                task_status.started()
        except Exception as exc:
            if not started:
                raise
            leaf = _leaf(exc)
            if isinstance(leaf, NlproxyError):
                raise TaskEnded(f"task {name}", str(leaf)) from leaf
            get_logger("daemon").error("task.ended", task=name, error=_said(leaf))
            raise

    return run


def _leaf(exc: BaseException) -> BaseException:
    """The task's own error, out of its nurseries' groups (a group of several as it is)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _said(exc: BaseException) -> str:
    """An error as a log line gives it: its own words when it names its object, else with its
    type (``KeyError: 'x'`` alone would say nothing)."""
    return str(exc) if isinstance(exc, NlproxyError) else f"{type(exc).__name__}: {exc}"
