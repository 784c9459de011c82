"""The in-repo API server speaks the protocol the ``kubernetes`` client expects.

Driven by the client's own generated API and ``kubernetes.watch.Watch``, so the source tests rest
on a server the upstream client agrees with.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from kubernetes.client.exceptions import ApiException

from nlproxy.cluster.kube import api_client_from_config
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import TOKEN, write_kubeconfig
from tests.objects import node, service


@pytest.fixture
def api_client(apiserver: ApiServer, tmp_path: Path) -> Iterator[Any]:
    """The client's own ``ApiClient`` (its generated API), with the configuration nlproxy's
    loading makes (the source itself sends through the same configuration's REST client)."""
    client = api_client_from_config(str(write_kubeconfig(tmp_path / "kubeconfig", apiserver)))
    with kubernetes.client.ApiClient(client.configuration) as api:
        yield api
    client.close()


def fill(apiserver: ApiServer, count: int) -> None:
    for i in range(count):
        apiserver.store.put("services", service(f"svc-{i:02}", cluster_ip=f"10.96.0.{i + 1}"))


def test_chunked_list_is_a_consistent_snapshot(apiserver: ApiServer, api_client: Any) -> None:
    fill(apiserver, 12)
    v1 = kubernetes.client.CoreV1Api(api_client)
    first = v1.list_service_for_all_namespaces(limit=5)
    assert [s.metadata.name for s in first.items] == [f"svc-{i:02}" for i in range(5)]
    assert first.metadata.remaining_item_count == 7
    apiserver.store.put(
        "services", service("svc-99", cluster_ip="10.96.0.99")
    )  # after the snapshot
    seen, cont = list(first.items), first.metadata.var_continue
    while cont:
        page = v1.list_service_for_all_namespaces(limit=5, _continue=cont)
        assert page.metadata.resource_version == first.metadata.resource_version
        seen += page.items
        cont = page.metadata.var_continue
    assert len(seen) == 12
    assert int(first.metadata.resource_version) < apiserver.store.rv


def test_expired_continue_token_is_410(apiserver: ApiServer, api_client: Any) -> None:
    fill(apiserver, 6)
    v1 = kubernetes.client.CoreV1Api(api_client)
    first = v1.list_service_for_all_namespaces(limit=5)
    apiserver.store.compact()
    with pytest.raises(ApiException) as info:
        v1.list_service_for_all_namespaces(limit=5, _continue=first.metadata.var_continue)
    assert info.value.status == 410
    assert json.loads(info.value.body)["reason"] == "Expired"


def test_selectors(apiserver: ApiServer, api_client: Any) -> None:
    fill(apiserver, 2)
    other = {"service.kubernetes.io/service-proxy-name": "x"}
    apiserver.store.put("services", service("theirs", labels=other))
    apiserver.store.put("nodes", node("node-a"))
    apiserver.store.put("nodes", node("node-b"))
    v1 = kubernetes.client.CoreV1Api(api_client)
    ours = v1.list_service_for_all_namespaces(
        label_selector="!service.kubernetes.io/service-proxy-name"
    )
    assert sorted(s.metadata.name for s in ours.items) == ["svc-00", "svc-01"]
    theirs = v1.list_service_for_all_namespaces(
        label_selector="service.kubernetes.io/service-proxy-name=x"
    )
    assert [s.metadata.name for s in theirs.items] == ["theirs"]
    nodes = v1.list_node(field_selector="metadata.name=node-b")
    assert [n.metadata.name for n in nodes.items] == ["node-b"]


def test_watch_streams_changes_and_ends_at_timeout(apiserver: ApiServer, api_client: Any) -> None:
    fill(apiserver, 1)
    rv = str(apiserver.store.rv)
    apiserver.store.put("services", service("web", cluster_ip="10.96.1.1"))
    apiserver.store.put(
        "services",
        service(
            "web", cluster_ip="10.96.1.1", ports=[{"name": "tcp", "port": 81, "targetPort": 8080}]
        ),
    )
    apiserver.store.delete("services", "default", "svc-00")
    v1 = kubernetes.client.CoreV1Api(api_client)
    watch = kubernetes.watch.Watch()
    events = [
        (e["type"], e["object"].metadata.name)
        for e in watch.stream(
            v1.list_service_for_all_namespaces, resource_version=rv, timeout_seconds=1
        )
    ]
    assert events == [("ADDED", "web"), ("MODIFIED", "web"), ("DELETED", "svc-00")]
    assert watch.resource_version == str(apiserver.store.rv)


def test_watch_from_compacted_version_is_gone(apiserver: ApiServer, api_client: Any) -> None:
    fill(apiserver, 2)
    rv = str(apiserver.store.rv - 1)
    apiserver.store.compact()
    v1 = kubernetes.client.CoreV1Api(api_client)
    stream = kubernetes.watch.Watch().stream(
        v1.list_service_for_all_namespaces, resource_version=rv, timeout_seconds=1
    )
    with pytest.raises(ApiException) as info:
        next(stream)
    assert info.value.status == 410


def test_bookmarks_carry_the_current_version(apiserver: ApiServer, api_client: Any) -> None:
    fill(apiserver, 1)
    apiserver.bookmark_interval = 0.2
    rv = str(apiserver.store.rv)
    apiserver.store.put("nodes", node("node-b"))  # another kind: only a bookmark reports it
    v1 = kubernetes.client.CoreV1Api(api_client)
    events = list(
        kubernetes.watch.Watch().stream(
            v1.list_service_for_all_namespaces,
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=1,
            deserialize=False,
        )
    )
    assert events
    assert {e["type"] for e in events} == {"BOOKMARK"}
    assert events[0]["object"]["metadata"]["resourceVersion"] == str(apiserver.store.rv)


def test_requests_need_the_token(apiserver: ApiServer) -> None:
    config = kubernetes.client.Configuration(host=apiserver.url)
    with kubernetes.client.ApiClient(config) as client:
        with pytest.raises(ApiException) as info:
            kubernetes.client.CoreV1Api(client).list_node()
        assert info.value.status == 401
        config.api_key = {"BearerToken": TOKEN}
        config.api_key_prefix = {"BearerToken": "Bearer"}
        assert kubernetes.client.CoreV1Api(client).list_node().items == []


def test_list_pages_are_the_objects_as_stored_now(apiserver: ApiServer) -> None:
    """A page assembled from each object's cached encoding is the whole body's encoding, and
    follows every change of an object (replaced, deleted)."""
    import urllib.request

    fill(apiserver, 3)
    apiserver.store.put("services", service("svc-01", cluster_ip="10.96.1.1", labels={"a": "b"}))
    apiserver.store.delete("services", "default", "svc-02")

    def page() -> bytes:
        req = urllib.request.Request(
            f"{apiserver.url}/api/v1/services?limit=10",
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            data: bytes = resp.read()
            return data

    for _ in range(2):  # encoded, then from the cache
        body = page()
        objs = sorted(apiserver.store.objects["services"].items())
        items = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for _, o in objs]
        whole = {
            "kind": "ServiceList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(apiserver.store.rv)},
            "items": items,
        }
        assert body == json.dumps(whole).encode()
    assert [i["metadata"]["name"] for i in json.loads(body)["items"]] == ["svc-00", "svc-01"]
    assert json.loads(body)["items"][1]["metadata"]["labels"] == {"a": "b"}


def test_compaction_drops_the_encodings_of_objects_no_longer_stored(apiserver: ApiServer) -> None:
    """A page of an older version (a continue token's snapshot) encodes objects replaced since;
    after a compaction nothing can serve them, and their encodings go."""
    fill(apiserver, 2)
    store = apiserver.store
    old = store.objects["services"][("default", "svc-00")]
    store.item_json(old)
    store.put("services", service("svc-00", cluster_ip="10.96.1.1"))
    store.item_json(old)  # as a page of the older snapshot would
    assert id(old) in store.encoded
    now = store.objects["services"][("default", "svc-00")]
    store.item_json(now)
    store.compact()
    assert id(old) not in store.encoded
    assert id(now) in store.encoded
