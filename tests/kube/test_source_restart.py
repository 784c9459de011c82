"""A source that fails unexpectedly after it started ends its run, and so the daemon, with one
line naming it (``daemon/supervise.py``): it is not restarted in-process, where its abandoned
list and watch threads would page on beside the new run's. Against the in-repo API server and
the real client.

The failure comes from inside a watch's worker thread: the ``on_request`` hook the daemon hands
the source (its ``rest_client_*`` metrics) raises at the first request after the watches are
dropped, as any fault of nlproxy's own in the stream's thread would.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import partial

import pytest
import structlog
import trio

from nlproxy.cluster.kube import KubeSource
from nlproxy.cluster.model import Change, Replace
from nlproxy.daemon.supervise import TaskEnded, ending
from nlproxy.errors import NlproxyError
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import NODE, Feed, populate


class FailOnce:
    """An ``on_request`` hook that raises ``error`` once, at the first request after
    ``arm()``."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self._armed = threading.Event()
        self._lock = threading.Lock()
        self.raised = 0

    def arm(self) -> None:
        self._armed.set()

    def __call__(self, method: str, host: str, status: int | None, seconds: float) -> None:
        with self._lock:
            if not self._armed.is_set() or self.raised:
                return
            self.raised += 1
        raise self.error


async def fail_after_start(apiserver: ApiServer, api_client: object, hook: FailOnce) -> None:
    """Start the source as the daemon does, see its first lists, then make a watch's thread
    fail; returns once the source's run has ended (raising what it ended with)."""
    populate(apiserver)
    source = KubeSource(
        api_client,  # type: ignore[arg-type]
        node_name=NODE,
        backoff_initial=0.05,
        backoff_max=0.3,
        on_request=hook,
    )
    send, receive = trio.open_memory_channel[Sequence[Change]](1000)
    feed = Feed(receive)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(ending("source", partial(source.run, send)))
            first = await feed.batch()
            assert {c.kind for c in first if isinstance(c, Replace)} == {
                "Service",
                "EndpointSlice",
                "Node",
                "ServiceCIDR",
            }
            hook.arm()
            apiserver.drop_connections()  # the watches ask again: the first request fails
            await trio.sleep_forever()  # until the source's failure ends the nursery


async def test_a_source_that_fails_after_it_started_ends_naming_itself(
    apiserver: ApiServer, api_client: object
) -> None:
    hook = FailOnce(RuntimeError("fault in the watch thread"))
    with (
        structlog.testing.capture_logs() as logs,
        pytest.RaisesGroup(
            pytest.RaisesExc(RuntimeError, match="^fault in the watch thread$"),
            flatten_subgroups=True,
        ),
    ):
        await fail_after_start(apiserver, api_client, hook)
    assert hook.raised == 1
    ended = [(e["event"], e["task"], e["error"]) for e in logs if e["event"] == "task.ended"]
    assert ended == [("task.ended", "source", "RuntimeError: fault in the watch thread")]


async def test_a_named_source_failure_after_it_started_is_one_line_naming_the_task(
    apiserver: ApiServer, api_client: object
) -> None:
    hook = FailOnce(NlproxyError("rest client", "metrics hook refused the answer"))
    with pytest.RaisesGroup(
        pytest.RaisesExc(
            TaskEnded, match="^task source: rest client: metrics hook refused the answer$"
        ),
        flatten_subgroups=True,
    ):
        await fail_after_start(apiserver, api_client, hook)
    assert hook.raised == 1
