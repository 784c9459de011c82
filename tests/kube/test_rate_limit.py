"""``--kube-api-qps``/``--kube-api-burst`` limit the kube source's requests to the in-repo API
server (real ``kubernetes`` client): ``burst`` requests at once, then one per token, on a clock
the test moves (the counts are asserted, never the time)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import trio

from nlproxy.cluster.kube import KubeSource
from nlproxy.cluster.model import Change
from nlproxy.cluster.ratelimit import TokenBucket
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import NODE, Feed, by_kind, eventually, names, populate


class Clock:
    """A clock that moves only when the test says; a sleeping request wakes once it has."""

    def __init__(self) -> None:
        self._now = 0.0
        self._moved = threading.Condition()

    def time(self) -> float:
        with self._moved:
            return self._now

    def sleep(self, seconds: float) -> None:
        with self._moved:
            due = self._now + seconds
            while self._now < due:
                self._moved.wait()

    def advance(self, seconds: float) -> None:
        with self._moved:
            self._now += seconds
            self._moved.notify_all()


def _requests(apiserver: ApiServer) -> int:
    return len(list(apiserver.requests))


async def test_requests_wait_for_tokens(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver)
    clock = Clock()
    limit = TokenBucket(1.0, 2, clock=clock.time, sleep=clock.sleep)
    send, receive = trio.open_memory_channel[Sequence[Change]](100)
    source = KubeSource(api_client, node_name=NODE, limit=limit, backoff_initial=0.05)
    nursery.start_soon(source.run, send)
    try:
        # Four kinds to list, a burst of two: two lists reach the server, two wait.
        await eventually(lambda: _requests(apiserver) == 2)
        await trio.sleep(0.5)
        assert _requests(apiserver) == 2
        # Each second of the clock lets one more through.
        clock.advance(1.0)
        await eventually(lambda: _requests(apiserver) == 3)
        await trio.sleep(0.2)
        assert _requests(apiserver) == 3
        clock.advance(1.0)
        feed = Feed(receive)
        replaces = by_kind(await feed.batch())
        assert names(replaces["Service"]) == {"svc-0", "svc-1", "svc-2"}
        assert _requests(apiserver) == 4
        # The four watches wait for their tokens too.
        await trio.sleep(0.2)
        assert _requests(apiserver) == 4
        clock.advance(100.0)
        await eventually(lambda: _requests(apiserver) == 8)
    finally:
        clock.advance(10_000.0)  # no thread is left waiting
