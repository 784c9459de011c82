"""The kube source against the test API server at scale: 10k Services and 10k EndpointSlices
with realistic bodies, listed in pages of 500 (what the source and client-go's pager ask for),
then a burst of 2,000 slice updates replayed at once, every one of them seen.

Counts and contents only: the times are measured by ``bench/bench_kube_cold.py``.
"""

from __future__ import annotations

from typing import Any

import trio

from nlproxy.cluster.model import EndpointSlice, Replace, Upsert
from tests.kube import scale
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import by_kind, start_source

SERVICES = 10_000
ENDPOINTS = 10
BURST = 2_000


def pages_of(apiserver: ApiServer, path: str) -> list[dict[str, str]]:
    return [q for p, q in apiserver.requests if p == path and "watch" not in q]


async def test_ten_thousand_services_in_pages_then_a_burst(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    scale.populate(apiserver, SERVICES, ENDPOINTS)
    feed, _ = await start_source(nursery, api_client, node_name=scale.NODE)
    replaces = by_kind(feed.batches[0])
    services, slices = replaces["Service"].changes, replaces["EndpointSlice"].changes
    assert len(services) == len(slices) == SERVICES
    assert all(isinstance(c, Upsert) for c in (*services, *slices))  # realistic bodies parse
    assert {c.ref.name for c in replaces["Node"].changes} == {scale.NODE}
    assert len(replaces["ServiceCIDR"].changes) == 1
    for path in ("/api/v1/services", "/apis/discovery.k8s.io/v1/endpointslices"):
        pages = pages_of(apiserver, path)
        assert len(pages) == SERVICES // 500
        assert {q["limit"] for q in pages} == {"500"}
        assert ["continue" in q for q in pages] == [False] + [True] * (len(pages) - 1)
    first = next(c.obj for c in slices if isinstance(c, Upsert) and c.ref.name == "svc-00007-x7k2p")
    assert isinstance(first, EndpointSlice)
    assert len(first.endpoints) == ENDPOINTS
    assert first.endpoints[0].zone == "zone-1"
    del replaces, services, slices, first

    scale.burst(apiserver, SERVICES, ENDPOINTS, BURST)
    updates: list[Upsert] = []
    with trio.fail_after(120):
        while len(updates) < BURST:
            for change in await feed.batch(within=60):
                assert not isinstance(change, Replace), "a burst must not cause a relist"
                assert isinstance(change, Upsert)
                assert change.ref.kind == "EndpointSlice"
                updates.append(change)
    assert len(updates) == BURST
    last = updates[-1].obj
    assert isinstance(last, EndpointSlice)
    # Each update gives its slice a fresh IP of its own: the updates arrive in order, the last
    # one (the last resourceVersion) last.
    arrived = [str(u.obj.endpoints[-1].ip) for u in updates]  # type: ignore[union-attr]
    fresh = [scale.pod_ip(SERVICES * ENDPOINTS + u) for u in range(BURST)]
    assert arrived == fresh
    await feed.nothing_for(0.5)
