"""The daemon's look for another proxy's rules (``daemon/foreign.py``): one thread of its own
makes every look, an ask brings one at once, and what the last look found is not reported
again."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import trio
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from nlproxy.daemon.foreign import ForeignWatch
from nlproxy.inspect.foreign import ForeignTable, Leftovers
from nlproxy.serve.metrics import Metrics

BOUND = 30.0  # seconds a condition may take on a loaded machine


class Check:
    """Answers each look with what ``found`` holds now; notes the thread of each look."""

    netns = None

    def __init__(self) -> None:
        self.found = Leftovers()
        self.threads: list[int] = []
        self.fail: BaseException | None = None

    def look(self) -> Leftovers:
        self.threads.append(threading.get_ident())
        if self.fail is not None:
            fail, self.fail = self.fail, None
            raise fail
        return self.found

    def forget(self) -> None:
        pass


def watch_of(check: Check, period: float = 3600.0) -> tuple[ForeignWatch, Metrics]:
    settings = SimpleNamespace(
        daemon=SimpleNamespace(sync_period=period),
        service_proxy_name=None,
        replace_kube_proxy=False,
    )
    metrics = Metrics(CollectorRegistry())
    return ForeignWatch(check, metrics, lambda: settings), metrics  # type: ignore[arg-type]


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {BOUND} s"
        await trio.sleep(0.01)


def held(condition: Callable[[], bool], what: str) -> None:
    """Wait for ``condition`` without yielding to the event loop."""
    deadline = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {BOUND} s"
        time.sleep(0.01)


def table(name: str) -> ForeignTable:
    return ForeignTable(family="ip", table=name, mode="nftables", chains=())


def detected(logs: list[dict[str, Any]]) -> list[str]:
    return [e["table"] for e in logs if e["event"] == "foreign_proxy.detected"]


def gauge(metrics: Metrics, name: str) -> float | None:
    labels = {"family": "ip", "table": name, "mode": "nftables"}
    return metrics.registry.get_sample_value("nlproxy_foreign_proxy_tables", labels)


def test_the_looks_need_no_event_loop_and_an_ask_brings_one_at_once() -> None:
    """Looks 2 to 4 are asked for and made while the event loop is held (a plain sleep in
    it): the thread looks and reports without it, and only what differs from the last look."""
    check = Check()
    watch, metrics = watch_of(check)
    reports: list[Leftovers] = []
    report = watch._report

    def counted(found: Leftovers, known: set[str]) -> set[str]:
        reports.append(found)
        return report(found, known)

    watch._report = counted  # type: ignore[method-assign]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch.run)
            await until(lambda: len(check.threads) == 1, "first look")
            check.found = Leftovers(tables=(table("kube-proxy"),))
            for n in (2, 3, 4):  # the interval is an hour: only the asks bring these
                watch.ask()
                held(lambda n=n: len(check.threads) == n, f"look {n}")  # type: ignore[misc]
            held(lambda: gauge(metrics, "kube-proxy") == 1.0, "the gauge")
            nursery.cancel_scope.cancel()

    with capture_logs() as logs:
        trio.run(main)
    assert len(set(check.threads)) == 1  # no thread made per look
    assert check.threads[0] != threading.get_ident()  # nor the event loop's
    assert detected(logs) == ["ip kube-proxy"]  # found three times, said once
    assert reports == [Leftovers(), check.found]  # reported when it changed only


def test_a_failed_look_is_a_warning_and_a_fault_ends_the_task_for_its_supervisor() -> None:
    check = Check()
    watch, _ = watch_of(check)
    check.found = Leftovers(tables=(table("kube-proxy"),))

    async def main() -> BaseException | None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch.run)
            await until(lambda: len(check.threads) == 1, "first look")
            check.fail = OSError(105, "No buffer space available")
            watch.ask()
            await until(lambda: len(check.threads) == 2, "the failed look")
            nursery.cancel_scope.cancel()
        check.fail = RuntimeError("a fault")
        try:
            await watch.run()  # as the supervisor starts it again
        except RuntimeError as exc:
            return exc
        return None

    with capture_logs() as logs:
        fault = trio.run(main)
    assert str(fault) == "a fault"
    warnings = [e for e in logs if e["event"] == "foreign_proxy.check_failed"]
    assert [w["error"] for w in warnings] == ["[Errno 105] No buffer space available"]
    assert detected(logs) == ["ip kube-proxy"]  # the restarted task knew it


def test_a_cancelled_watch_lets_its_thread_go() -> None:
    check = Check()
    watch, _ = watch_of(check)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch.run)
            await until(lambda: len(check.threads) == 1, "first look")
            nursery.cancel_scope.cancel()

    trio.run(main)
    (ident,) = set(check.threads)
    deadline = time.monotonic() + BOUND
    while in_looking(ident):  # trio's thread cache may keep the thread itself a while
        assert time.monotonic() < deadline, "the look's thread still waits"
        time.sleep(0.01)
    watch.ask()
    assert len(check.threads) == 1  # it did not look again on its way out


def in_looking(ident: int) -> bool:
    """Whether thread ``ident`` is in ``ForeignWatch._looking`` now."""
    frame = sys._current_frames().get(ident)
    while frame is not None:
        if frame.f_code is ForeignWatch._looking.__code__:
            return True
        frame = frame.f_back
    return False


def test_a_table_that_goes_leaves_the_gauge_of_those_that_stay() -> None:
    check = Check()
    watch, metrics = watch_of(check)
    check.found = Leftovers(tables=(table("kube-proxy"), table("other")))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch.run)
            await until(lambda: gauge(metrics, "other") == 1.0, "both tables")
            check.found = Leftovers(tables=(table("kube-proxy"),))
            watch.ask()
            await until(lambda: gauge(metrics, "other") is None, "the one that went")
            nursery.cancel_scope.cancel()

    with capture_logs() as logs:
        trio.run(main)
    assert gauge(metrics, "kube-proxy") == 1.0
    gone = [e["table"] for e in logs if e["event"] == "foreign_proxy.gone"]
    assert gone == ["ip other"]
