"""The daemon's long-running tasks under ``daemon/supervise.py``: a failure is said once with
the task's name, the task restarted after a growing backoff and counted, ``/healthz`` unhealthy
while it keeps failing and healthy again once it has run steadily; a stop ends it at once.
``autojump_clock`` skips the waits."""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

import pytest
import structlog
import trio
import trio.testing
from prometheus_client import CollectorRegistry

from nlproxy.daemon.supervise import Supervisor, at_once
from nlproxy.errors import NlproxyError
from nlproxy.serve.health import HealthState, healthz
from nlproxy.serve.metrics import Metrics

STEADY = 30.0


class Flaky:
    """A task that fails as scripted at each run, after reporting itself started (None: runs
    until cancelled); ``runs`` counts its starts."""

    def __init__(self, *script: Exception | None) -> None:
        self.script = list(script)
        self.runs = 0
        self.running = trio.Event()
        self.failed = trio.Event()

    async def __call__(self, *, task_status: trio.TaskStatus[None]) -> None:
        self.runs += 1
        task_status.started()
        error = self.script.pop(0) if self.script else None
        await trio.sleep(1)  # ran a while
        if error is not None:
            self.failed.set()
            raise error
        self.running.set()
        await trio.sleep_forever()


def supervised() -> tuple[Supervisor, HealthState, CollectorRegistry]:
    registry = CollectorRegistry()
    health = HealthState(grace_seconds=60)
    health.synced(0.0)
    sup = Supervisor(
        Metrics(registry).task_restarts, health, initial=1.0, maximum=8.0, steady=STEADY
    )
    return sup, health, registry


def restarts(registry: CollectorRegistry, task: str) -> float | None:
    return registry.get_sample_value("nlproxy_task_restarts_total", {"task": task})


def lines(logs: list[MutableMapping[str, Any]]) -> list[tuple[str, str, object, bool]]:
    return [
        (e["event"], e["log_level"], e.get("error", e.get("after")), "exc_info" in e)
        for e in logs
        if str(e["event"]).startswith("task.")
    ]


async def test_a_failing_task_is_said_once_restarted_counted_and_fails_healthz_until_steady(
    autojump_clock: trio.abc.Clock,
) -> None:
    sup, health, registry = supervised()
    bug = RuntimeError("decode went wrong")
    task = Flaky(bug, bug, bug, None)
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.keep, "source", task)
            assert restarts(registry, "source") == 0.0  # there from the start
            await task.running.wait()  # the fourth run: three failures, three restarts
            assert task.runs == 4
            assert restarts(registry, "source") == 3.0
            code, body = healthz(health, trio.current_time())
            assert code == 503
            reason = json.loads(body)["reason"]
            assert reason == "task source keeps failing (RuntimeError: decode went wrong)"
            assert healthz(health, trio.current_time(), live=True)[0] == 200  # not /livez's
            await trio.sleep(STEADY + 1)  # ran steadily: recovered
            code, body = healthz(health, trio.current_time())
            assert (code, "reason" in json.loads(body)) == (200, False)
            nursery.cancel_scope.cancel()
    error = "RuntimeError: decode went wrong"
    assert lines(logs) == [
        ("task.failed", "error", error, True),  # with its stack: it names nothing
        ("task.failed", "debug", error, False),
        ("task.failed", "debug", error, False),
        ("task.recovered", "info", error, False),
    ]
    delays = [e["restart_in"] for e in logs if e["event"] == "task.failed"]
    assert delays == [1.0, 2.0, 4.0]


async def test_another_failure_is_said_again_and_a_named_one_without_a_stack(
    autojump_clock: trio.abc.Clock,
) -> None:
    sup, health, _ = supervised()
    refused = NlproxyError("generation watch", "its thread ended unasked")
    task = Flaky(refused, KeyError("x"), refused, None)
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.keep, "generation-watch", task)
            await task.running.wait()
            nursery.cancel_scope.cancel()
    assert lines(logs) == [
        ("task.failed", "error", str(refused), False),
        ("task.failed", "error", "KeyError: 'x'", True),
        ("task.failed", "error", str(refused), False),
    ]
    assert "generation-watch" in health.failing  # three in a row, none steady


async def test_a_failure_before_the_first_start_is_the_starts() -> None:
    sup, _, registry = supervised()

    async def refused(*, task_status: trio.TaskStatus[None]) -> None:
        raise NlproxyError("generation watch", "Operation not permitted")

    with pytest.RaisesGroup(NlproxyError, flatten_subgroups=True):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.keep, "generation-watch", refused)
    assert restarts(registry, "generation-watch") == 0.0


async def test_a_task_that_returns_is_not_restarted(autojump_clock: trio.abc.Clock) -> None:
    sup, _, registry = supervised()
    ran: list[int] = []

    async def once() -> None:
        ran.append(1)

    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.keep, "config-watch", at_once(once))
    assert ran == [1]
    assert restarts(registry, "config-watch") == 0.0
    assert not logs


async def test_a_stop_ends_a_task_waiting_for_its_restart(autojump_clock: trio.abc.Clock) -> None:
    sup, _, registry = supervised()
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
