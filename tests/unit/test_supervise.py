"""The daemon's long-running tasks under ``daemon/supervise.py``: a report-only task's failure
is said once with the task's name, the task restarted after a growing backoff and counted, and
its failures forgotten once it has run steadily; a stop ends it at once. Any other task's failure
after it started ends its run, naming it. ``autojump_clock`` skips the waits."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import pytest
import structlog
import trio
import trio.testing
from prometheus_client import CollectorRegistry

from nlproxy.daemon.supervise import Supervisor, TaskEnded, at_once, ending
from nlproxy.errors import ConfigError, NlproxyError
from nlproxy.serve.metrics import Metrics

STEADY = 30.0


class Flaky:
    """A task that fails as scripted at each run, after reporting itself started and running a
    second (or as long as a ``(seconds, error)`` pair says; None: runs until cancelled);
    ``runs`` counts its starts."""

    def __init__(self, *script: Exception | tuple[float, Exception] | None) -> None:
        self.script = list(script)
        self.runs = 0
        self.running = trio.Event()
        self.failed = trio.Event()

    async def __call__(self, *, task_status: trio.TaskStatus[None]) -> None:
        self.runs += 1
        task_status.started()
        error = self.script.pop(0) if self.script else None
        ran, error = error if isinstance(error, tuple) else (1.0, error)
        await trio.sleep(ran)  # ran a while
        if error is not None:
            self.failed.set()
            raise error
        self.running.set()
        await trio.sleep_forever()


def supervised() -> tuple[Supervisor, CollectorRegistry]:
    registry = CollectorRegistry()
    sup = Supervisor(Metrics(registry).task_restarts, initial=1.0, maximum=8.0, steady=STEADY)
    return sup, registry


def restarts(registry: CollectorRegistry, task: str) -> float | None:
    return registry.get_sample_value("nlproxy_task_restarts_total", {"task": task})


def lines(logs: list[MutableMapping[str, Any]]) -> list[tuple[str, str, object, bool]]:
    return [
        (e["event"], e["log_level"], e.get("error", e.get("after")), "exc_info" in e)
        for e in logs
        if str(e["event"]).startswith("task.")
    ]


async def test_a_failing_task_is_said_once_restarted_counted_until_it_runs_steadily(
    autojump_clock: trio.abc.Clock,
) -> None:
    sup, registry = supervised()
    bug = RuntimeError("decode went wrong")
    task = Flaky(bug, bug, bug, (STEADY + 5, bug), None)
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.keep, "inspector", task)
            assert restarts(registry, "inspector") == 0.0  # there from the start
            await task.running.wait()  # the fifth run: four failures, four restarts
            assert task.runs == 5
            assert restarts(registry, "inspector") == 4.0
            nursery.cancel_scope.cancel()
    error = "RuntimeError: decode went wrong"
    assert lines(logs) == [
        ("task.failed", "error", error, True),  # with its stack: it names nothing
        ("task.failed", "debug", error, False),  # the same again: not said again
        ("task.failed", "debug", error, False),
        ("task.recovered", "info", error, False),  # the fourth run ran steadily
        ("task.failed", "error", error, True),  # after a recovery: said again
    ]
    delays = [e["restart_in"] for e in logs if e["event"] == "task.failed"]
    assert delays == [1.0, 2.0, 4.0, 1.0]  # doubling; afresh after the recovery


async def test_the_backoff_stops_doubling_at_its_maximum(autojump_clock: trio.abc.Clock) -> None:
    sup, registry = supervised()
    bug = RuntimeError("bug")
    task = Flaky(*[bug] * 6, None)
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.keep, "foreign-check", task)
            await task.running.wait()
            nursery.cancel_scope.cancel()
    delays = [e["restart_in"] for e in logs if e["event"] == "task.failed"]
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert restarts(registry, "foreign-check") == 6.0


async def test_another_failure_is_said_again_and_a_named_one_without_a_stack(
    autojump_clock: trio.abc.Clock,
) -> None:
    sup, _ = supervised()
    refused = NlproxyError("foreign-proxy check", "its dump ended unasked")
    task = Flaky(refused, KeyError("x"), refused, None)
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.keep, "foreign-check", task)
            await task.running.wait()
            nursery.cancel_scope.cancel()
    assert lines(logs) == [
        ("task.failed", "error", str(refused), False),
        ("task.failed", "error", "KeyError: 'x'", True),
        ("task.failed", "error", str(refused), False),
    ]


async def test_a_failure_before_the_first_start_is_the_starts() -> None:
    sup, registry = supervised()

    async def refused(*, task_status: trio.TaskStatus[None]) -> None:
        raise NlproxyError("reachability inspector", "Operation not permitted")

    with pytest.RaisesGroup(NlproxyError, flatten_subgroups=True):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.keep, "inspector", refused)
    assert restarts(registry, "inspector") == 0.0


async def test_a_task_that_returns_is_not_restarted(autojump_clock: trio.abc.Clock) -> None:
    sup, registry = supervised()
    ran: list[int] = []

    async def once() -> None:
        ran.append(1)

    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.keep, "foreign-check", at_once(once))
    assert ran == [1]
    assert restarts(registry, "foreign-check") == 0.0
    assert not logs


async def test_a_stop_ends_a_task_waiting_for_its_restart(autojump_clock: trio.abc.Clock) -> None:
    sup, registry = supervised()
    task = Flaky(RuntimeError("bug"), None)
    with structlog.testing.capture_logs() as logs, trio.CancelScope() as stop:
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.keep, "inspector", task)
            await task.failed.wait()
            await trio.testing.wait_all_tasks_blocked()  # waiting for its restart
            stop.cancel()
    assert stop.cancelled_caught
    assert lines(logs) == [("task.failed", "error", "RuntimeError: bug", True)]
    assert task.runs == 1  # not started again after the stop
    assert restarts(registry, "inspector") == 0.0


async def test_a_task_that_steers_the_rules_ends_its_run_naming_itself_and_the_error(
    autojump_clock: trio.abc.Clock,
) -> None:
    refused = NlproxyError("chain services", "Device or resource busy")
    task = Flaky(refused, None)
    with (
        structlog.testing.capture_logs() as logs,
        pytest.RaisesGroup(
            pytest.RaisesExc(TaskEnded, match="^task source: chain services: Device or"),
            flatten_subgroups=True,
        ) as caught,
    ):
        async with trio.open_nursery() as nursery:
            await nursery.start(ending("source", task))
            await trio.sleep_forever()  # ended by the task's failure
    assert task.runs == 1  # not started again
    ended = caught.value.exceptions[0]
    while isinstance(ended, BaseExceptionGroup):
        ended = ended.exceptions[0]
    assert ended.__cause__ is refused
    assert lines(logs) == []  # the daemon's last line says it: no stack, no log line


async def test_an_unnamed_failure_is_raised_as_it_is_after_a_line_naming_the_task(
    autojump_clock: trio.abc.Clock,
) -> None:
    task = Flaky(KeyError("x"), None)
    with (
        structlog.testing.capture_logs() as logs,
        pytest.RaisesGroup(KeyError, flatten_subgroups=True),
    ):
        async with trio.open_nursery() as nursery:
            await nursery.start(ending("config-watch", task))
    assert task.runs == 1
    ended = [(e["event"], e["log_level"], e["task"], e["error"], "exc_info" in e) for e in logs]
    assert ended == [("task.ended", "error", "config-watch", "KeyError: 'x'", False)]


async def test_a_failure_before_the_start_is_raised_as_it_is() -> None:
    async def refused(*, task_status: trio.TaskStatus[None]) -> None:
        raise ConfigError("--config", "nodePortAddresses: 'x' is not a CIDR")

    with (
        structlog.testing.capture_logs() as logs,
        pytest.RaisesGroup(ConfigError, flatten_subgroups=True),  # its status 2 kept
    ):
        async with trio.open_nursery() as nursery:
            await nursery.start(ending("addresses", refused))
    assert not logs


async def test_a_task_that_steers_the_rules_and_returns_ends_quietly() -> None:
    ran: list[int] = []

    async def once() -> None:
        ran.append(1)

    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(ending("config-watch", at_once(once)))
    assert ran == [1]
    assert not logs
