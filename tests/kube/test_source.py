"""The kube source against the in-repo API server, through the real ``kubernetes`` client."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Any

import pytest
import trio

from nlproxy.cluster.kube import NOT_OURS, KubeSource, kinds
from nlproxy.cluster.kube_http import Http, list_kind
from nlproxy.cluster.model import Change, Delete, Invalid, ObjectRef, Replace, Service, Upsert
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import (
    NODE,
    by_kind,
    eventually,
    is_upsert_of,
    names,
    populate,
    start_source,
)
from tests.objects import endpoint, endpoint_slice, node, service


def svc_ref(name: str, namespace: str = "default") -> ObjectRef:
    return ObjectRef(kind="Service", namespace=namespace, name=name)


async def test_initial_list_is_chunked(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver, services=23)
    feed, _ = await start_source(nursery, api_client, page_size=5)
    replaces = by_kind(feed.batches[0])
    assert list(replaces) == ["Service", "EndpointSlice", "Node", "ServiceCIDR"]
    assert names(replaces["Service"]) == {f"svc-{i}" for i in range(23)}
    assert len(replaces["EndpointSlice"].changes) == 23
    assert names(replaces["Node"]) == {NODE}  # only this node, by field selector
    assert names(replaces["ServiceCIDR"]) == {"kubernetes"}
    assert all(isinstance(c, Upsert) for r in replaces.values() for c in r.changes)
    pages = [q for p, q in apiserver.requests if p == "/api/v1/services" and "watch" not in q]
    assert len(pages) == 5
    assert all(q["limit"] == "5" for q in pages)
    assert ["continue" in q for q in pages] == [False, True, True, True, True]


async def test_add_modify_delete_flow_through(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver)
    feed, _ = await start_source(nursery, api_client)
    apiserver.store.put("services", service("web", cluster_ip="10.96.1.1"))
    await feed.until(is_upsert_of("web"))
    apiserver.store.put(
        "services",
        service(
            "web", cluster_ip="10.96.1.1", ports=[{"name": "tcp", "port": 8443, "targetPort": 8080}]
        ),
    )
    [modified] = await feed.until(is_upsert_of("web"))
    assert isinstance(modified, Upsert)
    assert isinstance(modified.obj, Service)
    assert modified.obj.ports[0].port == 8443
    apiserver.store.delete("services", "default", "web")
    assert await feed.until(lambda c: isinstance(c, Delete)) == [Delete(ref=svc_ref("web"))]
    apiserver.store.put(
        "endpointslices", endpoint_slice("web", [endpoint("10.0.0.1", "node-a")], name="web-1")
    )
    await feed.until(is_upsert_of("web-1", "EndpointSlice"))
    apiserver.store.put("nodes", node(NODE, ip="192.0.2.9"))
    [changed] = await feed.until(is_upsert_of(NODE, "Node"))
    assert isinstance(changed, Upsert)


async def test_label_selectors_are_honoured(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver)
    other = {"service.kubernetes.io/service-proxy-name": "other-proxy"}
    headless = {"service.kubernetes.io/headless": ""}
    apiserver.store.put("services", service("theirs", labels=other))
    apiserver.store.put("services", service("headless", labels=headless))
    apiserver.store.put(
        "endpointslices",
        endpoint_slice("x", [endpoint("10.0.0.1", "node-a")], name="headless-1", labels=headless),
    )
    apiserver.store.put(
        "endpointslices", endpoint_slice(None, [endpoint("10.0.0.1", "node-a")], name="orphan")
    )
    feed, _ = await start_source(nursery, api_client)
    replaces = by_kind(feed.batches[0])
    assert names(replaces["Service"]) == {"svc-0", "svc-1", "svc-2"}
    assert names(replaces["EndpointSlice"]) == {"svc-0-abc", "svc-1-abc", "svc-2-abc"}
    selectors = {p: q.get("labelSelector") for p, q in apiserver.requests}
    assert selectors["/api/v1/services"] == NOT_OURS
    assert selectors["/apis/discovery.k8s.io/v1/endpointslices"] == (
        f"kubernetes.io/service-name,{NOT_OURS}"
    )
    # On the watch: another proxy's new Service is never seen; one that moves to another
    # proxy disappears (the server reports it DELETED).
    apiserver.store.put("services", service("theirs-2", labels=other))
    apiserver.store.put("services", service("svc-1", cluster_ip="10.96.0.2", labels=other))
    seen = await feed.until(lambda c: isinstance(c, Delete))
    assert seen == [Delete(ref=svc_ref("svc-1"))]


async def test_bookmark_advances_resource_version(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver)
    feed, _ = await start_source(nursery, api_client)
    await eventually(lambda: apiserver.watch_count("services") == 1)
    for i in range(5):  # changes this source does not see: only a bookmark tells it the RV
        apiserver.store.put("nodes", node("node-b", ip=f"192.0.2.{10 + i}"))
    marks_before = apiserver.bookmarks_sent
    # Sent again until each of the four watches has had one: on a loaded machine a watch may
    # still be starting when the first is sent (the resourceVersion does not move meanwhile).
    with trio.fail_after(60):
        while apiserver.bookmarks_sent < marks_before + 4:
            apiserver.send_bookmarks()
            await trio.sleep(0.2)
    bookmark_rv = str(apiserver.store.rv)
    apiserver.store.compact()  # a resume from the pre-bookmark RV would now get 410 Gone
    apiserver.drop_connections()
    await eventually(lambda: apiserver.watch_count("services") == 2)
    apiserver.store.put("services", service("web", cluster_ip="10.96.1.1"))
    seen = await feed.until(is_upsert_of("web"))
    assert not feed.replaces(seen), "resumed with a relist instead of from the bookmark"
    watches = [q for p, q in apiserver.requests if p == "/api/v1/services" and "watch" in q]
    assert watches[1]["resourceVersion"] == bookmark_rv
    assert watches[1]["allowWatchBookmarks"] == "true"


@pytest.mark.parametrize("how", ["error-event", "http-410-after-outage"])
async def test_gone_relists_and_replaces_with_deletions(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery, how: str
) -> None:
    populate(apiserver)
    feed, _ = await start_source(nursery, api_client)
    await eventually(lambda: apiserver.watch_count("services") == 1)
    if how == "http-410-after-outage":
        apiserver.gone_as_http = True
        apiserver.stop()
    with apiserver.store.cond:  # changes the watch never streams: history is compacted at once
        apiserver.store.delete("services", "default", "svc-1")
        apiserver.store.put("services", service("svc-9", cluster_ip="10.96.0.99"))
        apiserver.store.compact()
    if how == "http-410-after-outage":
        apiserver.start()
    seen = await feed.until(lambda c: isinstance(c, Replace) and c.kind == "Service")
    assert not [c for c in seen if isinstance(c, Delete | Upsert)]
    assert names(feed.replaces(seen)[-1]) == {"svc-0", "svc-2", "svc-9"}
    apiserver.store.put("services", service("web", cluster_ip="10.96.1.1"))
    await feed.until(is_upsert_of("web"))


async def test_connection_drop_resumes_from_last_version(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver)
    feed, _ = await start_source(nursery, api_client)
    apiserver.store.put("services", service("web", cluster_ip="10.96.1.1"))
    await feed.until(is_upsert_of("web"))
    web_rv = apiserver.store.rv
    apiserver.drop_connections()
    apiserver.store.put("services", service("api", cluster_ip="10.96.1.2"))
    seen = await feed.until(is_upsert_of("api"))
    assert not feed.replaces(seen)
    watches = [q for p, q in apiserver.requests if p == "/api/v1/services" and "watch" in q]
    assert len(watches) >= 2
    assert watches[-1]["resourceVersion"] == str(web_rv)


async def test_api_outage_keeps_state_then_converges(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver)
    feed, _ = await start_source(nursery, api_client)
    await eventually(lambda: apiserver.watch_count("services") == 1)
    apiserver.stop()
    apiserver.store.delete("services", "default", "svc-0")
    apiserver.store.put("services", service("web", cluster_ip="10.96.1.1"))
    await feed.nothing_for(1.5)  # refused connections, retried with backoff: nothing emitted
    apiserver.start()
    seen = await feed.until(is_upsert_of("web"))  # history order: the delete comes first
    assert Delete(ref=svc_ref("svc-0")) in seen
    assert not feed.replaces(seen)  # history was kept: a plain resume, no relist


async def test_invalid_object_named_while_others_flow(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver)
    bad = service("bad", cluster_ip="10.96.0.50")
    bad["spec"]["ports"][0]["port"] = 70000
    apiserver.store.put("services", bad)
    feed, _ = await start_source(nursery, api_client)
    initial = by_kind(feed.batches[0])["Service"].changes
    [invalid] = [c for c in initial if isinstance(c, Invalid)]
    assert invalid.ref == svc_ref("bad")
    assert "Service default/bad" in invalid.error
    assert "spec.ports[0].port" in invalid.error
    assert len([c for c in initial if isinstance(c, Upsert)]) == 3
    worse = service("worse", cluster_ip="not-an-ip")
    apiserver.store.put("services", worse)
    apiserver.store.put("services", service("good", cluster_ip="10.96.1.1"))
    seen = await feed.until(is_upsert_of("good"))
    assert [type(c) for c in seen] == [Invalid, Upsert]
    assert seen[0].ref == svc_ref("worse")


async def test_service_cidrs_not_served(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver)
    apiserver.disabled.add("/apis/networking.k8s.io/v1/servicecidrs")
    feed, _ = await start_source(nursery, api_client)
    replaces = by_kind(feed.batches[0])
    assert replaces["ServiceCIDR"] == Replace(kind="ServiceCIDR", changes=())
    apiserver.store.put("services", service("web", cluster_ip="10.96.1.1"))
    await feed.until(is_upsert_of("web"))


async def test_server_timeout_ends_watch_and_source_rewatches(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver)
    feed, _ = await start_source(nursery, api_client, watch_timeout=1)
    await eventually(lambda: apiserver.watch_count("services") >= 3)
    watches = [q for p, q in apiserver.requests if p == "/api/v1/services" and "watch" in q]
    assert {q["timeoutSeconds"] for q in watches} == {"1"}
    apiserver.store.put("services", service("web", cluster_ip="10.96.1.1"))
    seen = await feed.until(is_upsert_of("web"))
    assert not feed.replaces(seen)


async def test_cancellation_does_not_wait_for_the_watches(
    apiserver: ApiServer, api_client: Any
) -> None:
    """Cancelling the source aborts its blocked watch threads instead of waiting out their
    server-side timeout (300 s)."""
    populate(apiserver)
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await start_source(nursery, api_client)
            await eventually(lambda: apiserver.watch_count("servicecidrs") == 1)
            await trio.sleep(0.2)  # the watch threads are now blocked reading
            nursery.cancel_scope.cancel()
            started = trio.current_time()
    assert trio.current_time() - started < 60  # far below the watches' 300 s
    # The aborted watches closed their connections: the server sees its clients hang up.
    await eventually(lambda: apiserver.active_watches == 0)


async def test_start_waits_for_an_unreachable_api(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver)
    apiserver.stop()
    send, receive = trio.open_memory_channel[Sequence[Change]](10)
    source = KubeSource(api_client, node_name=NODE, backoff_initial=0.05, backoff_max=0.2)
    nursery.start_soon(source.run, send)
    with trio.move_on_after(1):
        await receive.receive()
        raise AssertionError("sent something while the API was down")
    apiserver.start()
    with trio.fail_after(60):
        batch = await receive.receive()
    assert names(by_kind(batch)["Service"]) == {"svc-0", "svc-1", "svc-2"}


async def test_list_restarts_when_its_continue_token_expires(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver, services=12)
    compactions = []

    def compact_once(plural: str) -> None:  # the list outlives the server's history, once
        if plural == "services" and not compactions:
            compactions.append(apiserver.store.rv)
            apiserver.store.put("services", service("late", cluster_ip="10.96.1.1"))
            apiserver.store.compact()

    apiserver.after_page = compact_once
    feed, _ = await start_source(nursery, api_client, page_size=5)
    services = by_kind(feed.batches[0])["Service"]
    assert len(services.changes) == 13  # a complete, fresh snapshot, including the late one
    pages = [q for p, q in apiserver.requests if p == "/api/v1/services" and "watch" not in q]
    assert ["continue" in q for q in pages][:2] == [False, True]  # expired, then restarted
    assert ["continue" in q for q in pages].count(False) == 2


@pytest.mark.parametrize(("code", "reason"), [(500, "InternalError"), (429, "TooManyRequests")])
async def test_watch_error_event_resumes_without_relist(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery, code: int, reason: str
) -> None:
    populate(apiserver)
    feed, _ = await start_source(nursery, api_client)
    await eventually(lambda: apiserver.watch_count("services") == 1)
    apiserver.end_watches(code, reason, "try again")
    apiserver.store.put("services", service("web", cluster_ip="10.96.1.1"))
    seen = await feed.until(is_upsert_of("web"))
    assert not feed.replaces(seen)
    await eventually(lambda: apiserver.watch_count("services") >= 2)


_COLLECTIONS = ("services", "endpointslices", "nodes", "servicecidrs")


def _upserts_alive(namespace: str) -> int:
    """Upsert events of objects in ``namespace`` that something still refers to (after a
    full collection)."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Upsert and o.ref.namespace == namespace)


async def test_lists_are_not_kept_once_sent(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    # The initial lists and a relist hold an event per object of the cluster; once the
    # receiver is done with them, the source must not keep them (the state has the objects).
    ns = "lists-not-kept"
    for i in range(20):
        apiserver.store.put(
            "services", service(f"s{i}", namespace=ns, cluster_ip=f"10.96.0.{i + 1}")
        )
        apiserver.store.put(
            "endpointslices",
            endpoint_slice(f"s{i}", [endpoint("10.0.0.1", "node-a")], name=f"s{i}", namespace=ns),
        )
    apiserver.store.put("nodes", node(NODE))
    send, receive = trio.open_memory_channel[Sequence[Change]](10)
    source = KubeSource(api_client, node_name=NODE, backoff_initial=0.05, backoff_max=0.3)
    with trio.fail_after(60):
        await nursery.start(source.run, send)
        batch = await receive.receive()
    assert {k: len(r.changes) for k, r in by_kind(batch).items()} == {
        "Service": 20,
        "EndpointSlice": 20,
        "Node": 1,
        "ServiceCIDR": 0,
    }
    # Every kind watching means every listing task has moved on from its list.
    await eventually(lambda: all(apiserver.watch_count(k) == 1 for k in _COLLECTIONS))
    del batch
    assert _upserts_alive(ns) == 0
    with apiserver.store.cond:  # a compacted history: the watches get 410 and relist
        apiserver.store.put("services", service("s99", namespace=ns, cluster_ip="10.96.0.99"))
        apiserver.store.compact()
    relisted: dict[str, int] = {}
    with trio.fail_after(60):
        while len(relisted) < 4:  # every kind relists
            [replace] = await receive.receive()
            assert isinstance(replace, Replace)
            relisted[replace.kind] = len(replace.changes)
    assert relisted == {"Service": 21, "EndpointSlice": 20, "Node": 1, "ServiceCIDR": 0}
    del replace
    await eventually(lambda: all(apiserver.watch_count(k) == 2 for k in _COLLECTIONS))
    assert _upserts_alive(ns) == 0


@pytest.mark.parametrize("ahead", [False, True], ids=["one-by-one", "next-page-ahead"])
def test_list_reads_every_page_and_restarts_on_an_expired_token(
    apiserver: ApiServer, api_client: Any, ahead: bool
) -> None:
    populate(apiserver, services=12)
    compactions = []

    def compact_once(plural: str) -> None:  # after the first page, the history goes, once
        if plural == "services" and not compactions:
            compactions.append(apiserver.store.rv)
            apiserver.store.put("services", service("late", cluster_ip="10.96.1.1"))
            apiserver.store.compact()

    apiserver.after_page = compact_once
    spec = next(s for s in kinds(NODE) if s.kind == "Service")
    listing = list_kind(Http(api_client), spec, 5, ahead=ahead)
    assert sorted(c.ref.name for c in listing.changes) == sorted(
        [*(f"svc-{i}" for i in range(12)), "late"]
    )
    assert listing.pages == 3  # the restarted list: 13 objects in pages of 5
    pages = [q for p, q in apiserver.requests if p == "/api/v1/services"]
    assert ["continue" in q for q in pages].count(False) == 2


async def test_a_relist_pauses_the_cyclic_gc_while_it_lists(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    """Every page of a relist is decoded with the cyclic GC paused (its objects are not
    garbage); it runs again once the lists are done (the other kinds' relists, which the same
    410 starts, may still hold it when the Services' ends), and stays off where it was off."""
    populate(apiserver, services=6)
    during: list[bool] = []
    apiserver.after_page = lambda plural: during.append(gc.isenabled())
    assert gc.isenabled()
    feed, _ = await start_source(nursery, api_client, page_size=2)
    assert during
    assert not any(during)  # the initial lists
    await eventually(gc.isenabled)
    await eventually(lambda: apiserver.watch_count("services") == 1)
    during.clear()
    apiserver.store.put("services", service("svc-9", cluster_ip="10.96.0.99"))
    apiserver.expire_watches()  # 410 Gone: every kind is listed again
    await feed.until(lambda c: isinstance(c, Replace) and c.kind == "Service")
    assert during
    assert not any(during)
    await eventually(gc.isenabled)
    await eventually(lambda: apiserver.watch_count("services") == 2)
    gc.disable()  # a daemon's cold start pauses it itself: not turned on behind its back
    try:
        during.clear()
        apiserver.store.put("services", service("svc-8", cluster_ip="10.96.0.98"))
        apiserver.expire_watches()
        await feed.until(lambda c: isinstance(c, Replace) and c.kind == "Service")
        assert during
        assert not gc.isenabled()
    finally:
        gc.enable()
