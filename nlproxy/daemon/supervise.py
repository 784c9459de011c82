"""The daemon's long-running tasks kept running: a task that fails is said, restarted, counted.

Each task the daemon starts for good (the source, the generation watch, the inspector, the
foreign-proxy check, the address and ``--config`` watches) handles the failures it knows of
itself (an unreachable API server, a refused dump). Anything else it raises is a fault of
nlproxy's or of something it did not foresee, and must neither end the proxy (the rules already
programmed keep the traffic flowing) nor pass unnoticed (a source that stopped following the
cluster leaves the node's rules going stale, with ``/healthz`` still 200):

- the failure is logged with the task's name and the error (``task.failed``; the stack with it
  when the error names nothing), once while it repeats: the same failure again is a debug line;
- the task is started again after a backoff (``RESTART_INITIAL`` doubling to ``RESTART_MAX``),
  and ``nlproxy_task_restarts_total{task}`` counts it;
- a task that fails ``FAILING_AFTER`` times in a row makes ``/healthz`` unhealthy, naming it,
  until it has run ``STEADY_SECONDS`` since its restart (``task.recovered``).

A failure before a task first reports itself started is the start's: it ends the daemon as
before (a configuration or permission error then has its own exit status). A stop cancels
everything at once, backoffs included. Wiring only: what each task does is its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from nlproxy.errors import NlproxyError
from nlproxy.log import get_logger
from nlproxy.serve.health import HealthState

if TYPE_CHECKING:
    from prometheus_client import Counter

RESTART_INITIAL = 1.0
"""Seconds before the first restart of a failed task; doubled at each failure in a row."""
RESTART_MAX = 60.0
"""The longest wait before a restart."""
FAILING_AFTER = 3
"""Failures in a row after which ``/healthz`` reports the task failing."""
STEADY_SECONDS = 60.0
"""A task that ran this long since it was (re)started has recovered: its count and backoff
start afresh."""

Task = Callable[..., Awaitable[object]]
"""A long-running task: called with ``task_status=`` only, it calls ``started()`` once ready."""


class Supervisor:
    """Runs tasks under :meth:`keep`; reports failing ones to ``health`` and counts restarts.

    Args:
        restarts: the counter of restarts, labelled ``task``.
        health: whose ``tasks_failing`` is told which tasks keep failing.
        initial, maximum, failing_after, steady: see the module's constants.
    """

    def __init__(
        self,
        restarts: Counter,
        health: HealthState,
        *,
        initial: float = RESTART_INITIAL,
        maximum: float = RESTART_MAX,
        failing_after: int = FAILING_AFTER,
        steady: float = STEADY_SECONDS,
    ) -> None:
        self.restarts = restarts
        self.health = health
        self.initial, self.maximum = initial, maximum
        self.failing_after, self.steady = failing_after, steady
        self.failing: dict[str, str] = {}
        """Tasks failing ``failing_after`` times in a row, with their last error."""
        self.log = get_logger("daemon")

    async def keep(
        self,
        name: str,
        task: Task,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run ``task``, and again after each failure once it has started; returns when it
        returns (a task that ends the daemon on purpose, such as the ``--config`` watch).

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
        if self.failing.pop(run.name, None) is not None:
            self._report()

    def _failed(self, run: _Run, exc: Exception) -> float:
        """Say the failure (once while it repeats), note it; returns the wait before the
        restart."""
        leaf: BaseException = exc
        while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
            leaf = leaf.exceptions[0]  # the task's own error, out of its nurseries' groups
        named = isinstance(leaf, NlproxyError)
        error = str(leaf) if named else f"{type(leaf).__name__}: {leaf}"
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
        if run.failures >= self.failing_after:
            self.failing[run.name] = error
            self._report()
        return delay

    def _report(self) -> None:
        self.health.tasks_failing(
            "; ".join(
                f"task {name} keeps failing ({error})"
                for name, error in sorted(self.failing.items())
            )
        )


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
