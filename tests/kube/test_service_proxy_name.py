"""``--service-proxy-name``: the kube source selects exactly the Services and slices labelled
``service.kubernetes.io/service-proxy-name=<name>``, asking the in-repo API server through the
real ``kubernetes`` client; a relabelled Service moves in and out on the watch."""

from __future__ import annotations

from typing import Any

import trio

from nlproxy.cluster.kube import NOT_OURS, ours
from nlproxy.cluster.model import Change, Delete, EndpointSlice, ObjectRef, Service, Upsert
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import Feed, by_kind, is_upsert_of, names, populate, start_source
from tests.objects import endpoint, endpoint_slice, service

LABEL = "service.kubernetes.io/service-proxy-name"
CANARY = {LABEL: "nlproxy"}


def _put(apiserver: ApiServer, name: str, ip: str, labels: dict[str, str] | None) -> None:
    """Service ``name`` and its slice, both labelled as the EndpointSlice controller copies a
    Service's labels to its slices."""
    apiserver.store.put("services", service(name, cluster_ip=ip, labels=labels))
    apiserver.store.put(
        "endpointslices",
        endpoint_slice(name, [endpoint("10.0.0.9", "node-a")], name=f"{name}-abc", labels=labels),
    )


async def _both(feed: Feed, first: Any, second: Any) -> list[Change]:
    """The first change matching each predicate, in whichever order the watches sent them."""
    found: dict[int, Change] = {}
    while len(found) < 2:
        for change in await feed.batch():
            for i, pred in enumerate((first, second)):
                if i not in found and pred(change):
                    found[i] = change
    return [found[0], found[1]]


def test_the_selector_names_exactly_the_proxys_label() -> None:
    assert ours(None) == NOT_OURS
    assert ours("nlproxy") == (
        "service.kubernetes.io/service-proxy-name=nlproxy,!service.kubernetes.io/headless"
    )


async def test_only_the_labelled_services_are_listed_and_relabelling_moves_them(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver)  # svc-0..2, unlabelled: kube-proxy's
    _put(apiserver, "canary", "10.96.0.20", CANARY)
    _put(apiserver, "theirs", "10.96.0.21", {LABEL: "other-proxy"})
    _put(apiserver, "headless", "10.96.0.22", {**CANARY, "service.kubernetes.io/headless": ""})
    feed, _ = await start_source(nursery, api_client, proxy_name="nlproxy")
    replaces = by_kind(feed.batches[0])
    assert names(replaces["Service"]) == {"canary"}
    assert names(replaces["EndpointSlice"]) == {"canary-abc"}
    assert all(isinstance(c, Upsert) for c in replaces["Service"].changes)
    [slice_change] = replaces["EndpointSlice"].changes
    assert isinstance(slice_change, Upsert)
    assert isinstance(slice_change.obj, EndpointSlice)
    selectors = {p: q.get("labelSelector") for p, q in apiserver.requests}
    assert selectors["/api/v1/services"] == ours("nlproxy")
    assert selectors["/apis/discovery.k8s.io/v1/endpointslices"] == (
        f"kubernetes.io/service-name,{ours('nlproxy')}"
    )

    # svc-1 is labelled: it moves in, Service and slice (each kind's watch in its own order).
    _put(apiserver, "svc-1", "10.96.0.2", CANARY)
    moved_in = await _both(feed, is_upsert_of("svc-1"), is_upsert_of("svc-1-abc", "EndpointSlice"))
    assert isinstance(moved_in[0], Upsert)
    assert isinstance(moved_in[0].obj, Service)

    # The canary loses its label: it moves out (the server reports it DELETED), slice too.
    _put(apiserver, "canary", "10.96.0.20", None)
    gone = ObjectRef(kind="Service", namespace="default", name="canary")
    slice_gone = ObjectRef(kind="EndpointSlice", namespace="default", name="canary-abc")
    await _both(feed, lambda c: c == Delete(ref=gone), lambda c: c == Delete(ref=slice_gone))

    # Another proxy's Service, and one of ours gaining another proxy's name, are never served.
    _put(apiserver, "theirs-2", "10.96.0.23", {LABEL: "other-proxy"})
    _put(apiserver, "svc-1", "10.96.0.2", {LABEL: "other-proxy"})
    seen = await feed.until(lambda c: isinstance(c, Delete) and c.ref.name == "svc-1")
    assert not [c for c in seen if isinstance(c, Upsert) and c.ref.name == "theirs-2"]


async def test_without_a_name_the_labelled_services_are_left_to_their_proxy(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver)
    _put(apiserver, "canary", "10.96.0.20", CANARY)
    feed, _ = await start_source(nursery, api_client)
    assert names(by_kind(feed.batches[0])["Service"]) == {"svc-0", "svc-1", "svc-2"}
    # The canary moves back to kube-proxy (its label removed): the default proxy takes it.
    _put(apiserver, "canary", "10.96.0.20", None)
    await feed.until(is_upsert_of("canary"))
