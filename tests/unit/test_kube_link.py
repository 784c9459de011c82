"""The API source's waiting (``nlproxy/cluster/kube_link.py``): one probe loop for every kind
while the API server is unreachable, at a bounded, growing interval, released together."""

from __future__ import annotations

import random

import trio

from nlproxy.cluster.kube_http import KubeApiError, Unreachable
from nlproxy.cluster.kube_link import ApiLink, Backoff


class FakeProbe:
    """Unreachable for ``down`` probes, then the given statuses, then 200; records when."""

    def __init__(self, down: int, statuses: tuple[int, ...] = ()) -> None:
        self.down, self.statuses = down, list(statuses)
        self.calls = 0
        self.token = trio.lowlevel.current_trio_token()
        self.times: list[float] = []

    def __call__(self) -> int:
        self.calls += 1
        self.times.append(trio.from_thread.run_sync(trio.current_time, trio_token=self.token))
        if self.calls <= self.down:
            raise Unreachable("API server /readyz", "request failed: connection refused")
        return self.statuses.pop(0) if self.statuses else 200


async def test_one_probe_loop_for_all_waiters_bounded_interval(autojump_clock: object) -> None:
    probe = FakeProbe(down=30, statuses=(500, 500))
    link = ApiLink(probe, initial=0.1, maximum=1.0, rng=random.Random(7))
    released: list[float] = []
    error = Unreachable("Service /api/v1/services", "watch broken")

    async def waiter(kind: str) -> None:
        await link.wait_until_back(kind, error)
        released.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        for kind in ("Service", "EndpointSlice", "Node", "ServiceCIDR"):
            nursery.start_soon(waiter, kind)
    assert probe.calls == 33  # 30 refused, two 500s (up, not ready), then 200: one loop
    assert link.outages == 1
    gaps = [b - a for a, b in zip([0.0, *probe.times], probe.times, strict=False)]
    assert max(gaps) <= 1.0  # never slower than the maximum, however long it was down
    assert min(gaps[5:]) >= 0.5  # and never faster than half of it once grown: no hammering
    assert len(set(released)) == 1  # every kind released by the same answered probe
    assert released[0] == probe.times[-1]


async def test_answered_request_resets_the_interval(autojump_clock: object) -> None:
    probe = FakeProbe(down=10)
    link = ApiLink(probe, initial=0.1, maximum=1.0, rng=random.Random(1))
    error = Unreachable("Node /api/v1/nodes", "request failed")
    await link.wait_until_back("Node", error)
    probe.down, probe.calls, probe.times = 1, 0, []
    started = trio.current_time()
    await link.wait_until_back("Node", error)  # not reset: picks up at the slow end
    assert probe.times[0] - started >= 0.5
    link.answered()
    probe.calls, probe.times = 0, []
    started = trio.current_time()
    await link.wait_until_back("Node", error)
    assert probe.times[0] - started <= 0.1


def test_backoff_is_jittered_doubling_and_bounded() -> None:
    b = Backoff(0.5, 30.0, rng=random.Random(3))
    delays = [b.next() for _ in range(12)]
    for n, d in enumerate(delays):
        cap = min(30.0, 0.5 * 2**n)
        assert cap / 2 <= d <= cap
    b.reset()
    assert b.next() <= 0.5


async def test_a_probe_that_cannot_be_sent_releases_the_waiters(autojump_clock: object) -> None:
    """A probe refused before it is sent (a token no header can carry, ``kube_http``) is no
    outage to wait out: the waiters go back to their requests, which say why and retry."""

    class Unsendable(FakeProbe):
        def __call__(self) -> int:
            super().__call__()
            raise KubeApiError("API server /readyz", "request not sent: the Authorization ...")

    probe = Unsendable(down=2)
    link = ApiLink(probe, initial=0.1, maximum=1.0, rng=random.Random(5))
    # No fail_after: with the autojump clock, virtual time runs on while a probe's thread
    # works, so a deadline could pass on a loaded machine before the probe returns.
    await link.wait_until_back("Service", Unreachable("Service /api/v1/services", "reset"))
    assert probe.calls == 3  # two unanswered, then one not sent: released
