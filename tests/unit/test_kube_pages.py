"""A list page decoded in one call (``kube_http.page_changes``) gives what each raw item through
``typed.change`` gives: the same changes, the same metadata, the same errors (a differential
test over pages of plain, uncommon, invalid and ill-fitting objects)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from nlproxy.cluster import kube_http, typed
from tests.objects import DROP
from tests.objects import example_endpoint_slice as endpoint_slice
from tests.objects import example_service as service

Doc = dict[str, Any]


def svc(i: int, **fields: Any) -> Doc:
    ip = f"10.96.0.{i + 1}"
    fields = {"metadata.name": f"s{i}", "spec.clusterIP": ip, "spec.clusterIPs": [ip], **fields}
    return service(**fields)


def eps(i: int, **fields: Any) -> Doc:
    return endpoint_slice(
        **{
            "metadata.name": f"s{i}-a",
            "metadata.labels": {"kubernetes.io/service-name": f"s{i}"},
            "endpoints": [{"addresses": [f"10.1.0.{i + 1}"], "nodeName": "node-a"}],
            **fields,
        }
    )


def page(items: list[Any] | None, *, cont: str = "", version: str = "42") -> bytes:
    """A page as the API server writes it (``kind`` and ``apiVersion`` left off its items)."""
    meta: Doc = {"resourceVersion": version, **({"continue": cont} if cont else {})}
    if items is not None:
        items = [
            {k: v for k, v in i.items() if k not in ("kind", "apiVersion")}
            if isinstance(i, dict)
            else i
            for i in items
        ]
    return json.dumps({"metadata": meta, "items": items}).encode()


def one_by_one(data: bytes, kind: str, proxy_name: str | None) -> tuple[object, list[object]]:
    """What the list did before: the page's raw items, each through ``typed.change``."""
    raw = kube_http._PAGE.decode(data)
    return raw.metadata, [typed.change(item, kind, proxy_name) for item in raw.items or ()]


PLAIN = [svc(i) for i in range(4)]
SLICES = [eps(i) for i in range(4)]
PAGES: dict[str, tuple[str, bytes]] = {
    "plain-services": ("Service", page(PLAIN, cont="next")),
    "plain-slices": ("EndpointSlice", page(SLICES)),
    "an-empty-page": ("Service", page([])),
    "items-null": ("EndpointSlice", page(None)),
    "uncommon-services": ("Service", page([
        svc(0, **{"spec.sessionAffinity": "ClientIP"}),
        svc(1, **{"spec.externalIPs": ["192.0.2.1"]}),
        svc(2, **{"spec.type": "ExternalName", "spec.externalName": "example.com"}),
        svc(3, **{"metadata.labels": {"service.kubernetes.io/service-proxy-name": "other"}}),
    ])),
    "an-invalid-service-among-plain-ones": ("Service", page(
        [*PLAIN[:2], svc(2, **{"spec.ports[0].port": 70000}), *PLAIN[3:]])),
    "a-service-without-a-name": ("Service", page([*PLAIN[:2], svc(2, **{"metadata.name": DROP})])),
    "a-field-of-the-wrong-type": ("Service", page([*PLAIN[:2], svc(2, **{"spec.ports": "80"})])),
    "an-item-that-is-no-object": ("EndpointSlice", page([*SLICES[:2], "slice", 7])),
    "slices-with-hints": ("EndpointSlice", page([
        *SLICES[:2], eps(2, **{"endpoints[0].hints": {"forZones": [{"name": "a"}]}})])),
    "a-slice-with-a-bad-address": ("EndpointSlice", page(
        [*SLICES[:2], eps(2, **{"endpoints[0].addresses": ["10.1.0.300"]})])),
    "an-fqdn-slice": ("EndpointSlice", page([*SLICES[:2], eps(2, addressType="FQDN")])),
    "a-node-page": ("Node", page([{"metadata": {"name": "node-a"}}])),
}  # fmt: skip


@pytest.mark.parametrize(("kind", "data"), list(PAGES.values()), ids=list(PAGES))
@pytest.mark.parametrize("proxy_name", [None, "other"], ids=["no-proxy-name", "proxy-name"])
def test_a_page_decoded_whole_gives_what_its_items_one_by_one_give(
    kind: str, data: bytes, proxy_name: str | None
) -> None:
    meta, changes = kube_http.page_changes(data, kind, proxy_name)
    want_meta, want = one_by_one(data, kind, proxy_name)
    assert (meta.resourceVersion, meta.continue_) == (
        want_meta.resourceVersion,  # type: ignore[attr-defined]
        want_meta.continue_,  # type: ignore[attr-defined]
    )
    assert changes == want


@pytest.mark.parametrize(
    "data",
    [b"not json", b"[]", b'{"items": []}', b'{"metadata": 5, "items": []}', b'{"metadata": {}'],
    ids=["not-json", "a-list", "no-metadata", "metadata-not-an-object", "cut-short"],
)
def test_a_page_that_is_no_list_page_raises_what_the_raw_decode_raises(data: bytes) -> None:
    with pytest.raises(msgspec.MsgspecError) as whole:
        kube_http.page_changes(data, "Service")
    with pytest.raises(msgspec.MsgspecError) as raw:
        kube_http._PAGE.decode(data)
    assert type(whole.value) is type(raw.value)


def test_a_plain_page_is_read_without_an_item_decoded_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The case it is for: every item plainly valid, none goes through ``typed.change``."""

    def no(*_: object, **__: object) -> None:
        raise AssertionError("decoded alone")

    monkeypatch.setattr(typed, "change", no)
    _, changes = kube_http.page_changes(page(PLAIN), "Service")
    assert len(changes) == len(PLAIN)
