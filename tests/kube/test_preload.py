"""A cold start's pages into the state as they arrive (``on_page``, ``ClusterState.preload``),
against the in-repo API server through the real ``kubernetes`` client."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trio

from nlproxy.cluster.model import Change, Invalid, Replace, ServiceKey, Skip, Upsert
from nlproxy.cluster.state import ClusterState
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import NODE, by_kind, eventually, populate, start_source
from tests.objects import service


class Pages:
    """What ``on_page`` was told, checked to be on the event loop, beside a state it feeds."""

    def __init__(self) -> None:
        self.state = ClusterState(NODE)
        self.pages: list[list[str]] = []
        self.preloaded: set[ServiceKey] = set()

    def __call__(self, changes: Sequence[Upsert | Skip | Invalid]) -> None:
        trio.lowlevel.current_trio_token()  # raises outside the event loop's thread
        self.pages.append([f"{c.ref.kind}/{c.ref.name}" for c in changes])
        self.preloaded |= self.state.preload(changes)


def fresh(batch: Sequence[Change]) -> ClusterState:
    state = ClusterState(NODE)
    state.apply(batch)
    return state


def same(a: ClusterState, b: ClusterState) -> bool:
    sa, sb = a.snapshot(), b.snapshot()
    return (
        dict(sa.services) == dict(sb.services)
        and dict(sa.slices) == dict(sb.slices)
        and sa.node == sb.node
        and sa.service_cidrs == sb.service_cidrs
        and a.invalid == b.invalid
    )


async def test_pages_reach_the_state_before_the_lists_end(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver, services=12)
    pages = Pages()
    feed, _ = await start_source(nursery, api_client, page_size=5, on_page=pages)
    # Every page of every kind was handed over before the one batch of the lists was sent.
    services = [p for p in pages.pages if p[0].startswith("Service/")]
    assert [len(p) for p in services] == [5, 5, 2]
    listed = [name for p in pages.pages for name in p]
    batch = feed.batches[0]
    assert sorted(listed) == sorted(
        f"{r.kind}/{c.ref.name}" for r in batch if isinstance(r, Replace) for c in r.changes
    )
    # The lists' Replace applied over the preloaded state: the state a cold apply makes, and
    # every service reported changed once, by that apply (the sync's accounting).
    changed = pages.state.apply(batch)
    assert same(pages.state, fresh(batch))
    assert changed == {ServiceKey(namespace="default", name=f"svc-{i}") for i in range(12)}
    assert changed == pages.preloaded
    assert pages.state.apply([]) == set()  # reported once, not again


async def test_a_restarted_list_leaves_out_what_its_first_pages_held(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver, services=12)
    compactions: list[int] = []

    def delete_and_compact(plural: str) -> None:  # after the first page: the token expires
        if plural == "services" and not compactions:
            compactions.append(apiserver.store.rv)
            apiserver.store.delete("services", "default", "svc-0")
            apiserver.store.compact()

    apiserver.after_page = delete_and_compact
    pages = Pages()
    feed, _ = await start_source(nursery, api_client, page_size=5, on_page=pages)
    first = next(p for p in pages.pages if p[0].startswith("Service/"))
    assert "Service/svc-0" in first  # handed over before the list restarted
    services = by_kind(feed.batches[0])["Service"]
    assert "svc-0" not in {c.ref.name for c in services.changes}
    pages.state.apply(feed.batches[0])
    assert ServiceKey(namespace="default", name="svc-0") not in pages.state.snapshot().services
    assert same(pages.state, fresh(feed.batches[0]))


async def test_relists_are_not_handed_over(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver, services=3)
    pages = Pages()
    feed, _ = await start_source(nursery, api_client, on_page=pages)
    before = len(pages.pages)
    await eventually(lambda: apiserver.watch_count("services") == 1)
    with apiserver.store.cond:  # a compacted history: the watches get 410 and relist
        apiserver.store.put("services", service("late", cluster_ip="10.96.1.9"))
        apiserver.store.compact()
    seen = await feed.until(lambda c: isinstance(c, Replace) and c.kind == "Service")
    assert "late" in {c.ref.name for c in feed.replaces(seen)[-1].changes}
    assert len(pages.pages) == before


async def test_each_kind_is_told_listed_after_its_last_page_and_before_the_lists_go(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver, services=7)
    told: list[str] = []

    def on_page(changes: Sequence[Upsert | Skip | Invalid]) -> None:
        told.append(f"page {changes[0].ref.kind}")

    def on_listed(kind: str) -> None:
        trio.lowlevel.current_trio_token()  # on the event loop
        told.append(f"listed {kind}")

    feed, _ = await start_source(
        nursery, api_client, page_size=3, on_page=on_page, on_listed=on_listed
    )
    assert feed.batches  # the lists went after every kind was told
    for kind, pages in (("Service", 3), ("EndpointSlice", 3), ("Node", 1), ("ServiceCIDR", 1)):
        mine = [t for t in told if t.endswith(f" {kind}")]
        assert mine == [f"page {kind}"] * pages + [f"listed {kind}"]
    await eventually(lambda: apiserver.watch_count("services") == 1)
    with apiserver.store.cond:  # a relist tells nothing
        apiserver.store.put("services", service("late", cluster_ip="10.96.1.9"))
        apiserver.store.compact()
    before = len(told)
    await feed.until(lambda c: isinstance(c, Replace) and c.kind == "Service")
    assert len(told) == before
