"""The inspector's failed passes (``inspect/reachability.py``): each failure is said once while
it lasts, whatever came between, and its end is said once. A fake node that fails as scripted
stands in for the kernel; ``autojump_clock`` skips the pauses between retries."""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from typing import Any

import pytest
import structlog
import trio
from prometheus_client import CollectorRegistry

from nlproxy.errors import NlproxyError
from nlproxy.inspect.fake import FakeNode
from nlproxy.inspect.reachability import ReachabilityMonitor
from nlproxy.inspect.rtnl import Snapshot
from nlproxy.proxy.planner import plan
from tests.unit.test_reachability_index import CONFIG, world

DUMP_REFUSED = NlproxyError("rtnetlink dump", "refused: Operation not permitted")
NO_ROUTES = NlproxyError("rtnetlink dump", "no routes table")


class FailingNode(FakeNode):
    """A fake node whose dumps fail with the scripted errors, in order (None: answers)."""

    def __init__(self, script: Iterable[Exception | None]) -> None:
        super().__init__()
        self.script = list(script)

    def dump(self, families: Iterable[int]) -> Snapshot:
        error = self.script.pop(0)
        if error is not None:
            raise error
        return super().dump(families)


def said(logs: list[MutableMapping[str, Any]]) -> list[tuple[str, object, str]]:
    """(event, the failure it names, level) of the inspector's failure and recovery lines."""
    events = ("inspector.failed", "inspector.recovered")
    out = []
    for e in logs:
        if e["event"] in events:
            what = e.get("error", e.get("after"))
            if e.get("exc_info"):
                what = "logged with its traceback"
            out.append((str(e["event"]), what, str(e["log_level"])))
    return out


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        pytest.param(
            [DUMP_REFUSED, RuntimeError("bug"), DUMP_REFUSED, DUMP_REFUSED, None],
            [
                ("inspector.failed", str(DUMP_REFUSED), "warning"),
                ("inspector.failed", "logged with its traceback", "error"),
                ("inspector.failed", str(DUMP_REFUSED), "warning"),
                ("inspector.failed", str(DUMP_REFUSED), "debug"),
                ("inspector.recovered", str(DUMP_REFUSED), "info"),
            ],
            id="unnamed-between-two-of-the-same",
        ),
        pytest.param(
            [RuntimeError("bug"), RuntimeError("bug"), None],
            [
                ("inspector.failed", "logged with its traceback", "error"),
                ("inspector.failed", "RuntimeError: bug", "debug"),
                ("inspector.recovered", "RuntimeError: bug", "info"),
            ],
            id="unnamed-repeated-then-recovered",
        ),
        pytest.param(
            [DUMP_REFUSED, NO_ROUTES, DUMP_REFUSED, None, DUMP_REFUSED, None],
            [
                ("inspector.failed", str(DUMP_REFUSED), "warning"),
                ("inspector.failed", str(NO_ROUTES), "warning"),
                ("inspector.failed", str(DUMP_REFUSED), "warning"),
                ("inspector.recovered", str(DUMP_REFUSED), "info"),
                ("inspector.failed", str(DUMP_REFUSED), "warning"),
                ("inspector.recovered", str(DUMP_REFUSED), "info"),
            ],
            id="alternating-named",
        ),
    ],
)
async def test_each_failure_is_warned_once_while_it_lasts_and_its_end_is_said(
    script: list[Exception | None],
    expected: list[tuple[str, object, str]],
    autojump_clock: trio.abc.Clock,
) -> None:
    node = FailingNode(script)
    monitor = ReachabilityMonitor(CollectorRegistry(), node=node)
    monitor.plan_changed(plan(world({"a": ["10.1.0.1"]}), CONFIG).ports, None)
    with structlog.testing.capture_logs() as logs:
        for _ in script:
            await monitor._evaluate_guarded(full=True)
    assert not node.script
    assert said(logs) == expected
