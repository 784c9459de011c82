"""Kinds this identity may not read: an optional one is synced as absent and picked up once
granted; a required one holds up the first sync and is reported, never retried silently.

Against the in-repo API server answering 403 as kube-apiserver's RBAC authorizer does, through
the real ``kubernetes`` client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import trio
from structlog.testing import capture_logs

from nlproxy.cluster.kube import KubeSource, Unavailable
from nlproxy.cluster.model import Change, Replace
from nlproxy.serve.health import HealthState, healthz
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import (
    NODE,
    Feed,
    by_kind,
    eventually,
    is_upsert_of,
    names,
    populate,
    start_source,
)
from tests.objects import service, service_cidr


class Reports:
    """What the source reported through ``on_unavailable``, in order."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Unavailable]] = []

    def __call__(self, kinds: Mapping[str, Unavailable]) -> None:
        self.seen.append(dict(kinds))

    @property
    def now(self) -> dict[str, Unavailable]:
        return self.seen[-1] if self.seen else {}


def list_requests(apiserver: ApiServer, plural: str) -> int:
    path = f"/apis/networking.k8s.io/v1/{plural}" if plural == "servicecidrs" else plural
    return sum(1 for p, q in apiserver.requests if p.endswith(path) and "watch" not in q)


def logged(event: Mapping[str, Any]) -> tuple[str, str, str]:
    return event["log_level"], event["kind"], event["verb"]


def is_cidr_replace(c: Change) -> bool:
    return isinstance(c, Replace) and c.kind == "ServiceCIDR"


@pytest.mark.parametrize("verbs", [("list", "watch"), ("list",)], ids=["no-access", "no-list"])
async def test_forbidden_optional_kind_is_absent_until_granted(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery, verbs: tuple[str, ...]
) -> None:
    populate(apiserver)
    apiserver.forbid("servicecidrs", *verbs)
    reports = Reports()
    with capture_logs() as logs:
        feed, source = await start_source(
            nursery, api_client, on_unavailable=reports, backoff_max=0.2
        )
        # Everything else is sent at once, ServiceCIDRs as absent.
        replaces = by_kind(feed.batches[0])
        assert names(replaces["Service"]) == {"svc-0", "svc-1", "svc-2"}
        assert replaces["ServiceCIDR"] == Replace(kind="ServiceCIDR", changes=())
        [problem] = reports.now.values()
        assert (problem.kind, problem.verb, problem.reason) == ("ServiceCIDR", "list", "forbidden")
        assert not problem.required
        assert 'cannot list resource "servicecidrs"' in problem.detail
        # Retried in the background, warned about once; other kinds keep flowing.
        await eventually(lambda: list_requests(apiserver, "servicecidrs") >= 4)
        apiserver.store.put("services", service("web", cluster_ip="10.96.1.1"))
        await feed.until(is_upsert_of("web"))
    warnings = [logged(e) for e in logs if e["event"] == "source.kind_unavailable"]
    assert [w for w in warnings if w[0] != "debug"] == [("warning", "ServiceCIDR", "list")]
    [said] = [e for e in logs if e["event"] == "source.kind_unavailable" and "meanwhile" in e]
    assert "no drop rule for unallocated ClusterIPs" in said["meanwhile"]
    # A role fixed while running takes effect without a restart.
    apiserver.allow("servicecidrs")
    [granted] = [c for c in await feed.until(is_cidr_replace) if is_cidr_replace(c)]
    assert isinstance(granted, Replace)
    assert names(granted) == {"kubernetes"}
    assert reports.now == {}
    assert source.unavailable == {}
    # ... and its watch follows changes from then on.
    apiserver.store.put("servicecidrs", service_cidr("extra", "10.97.0.0/16"))
    await feed.until(is_upsert_of("extra", "ServiceCIDR"))


async def test_forbidden_watch_of_optional_kind_keeps_its_list(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver)
    apiserver.forbid("servicecidrs", "watch")
    reports = Reports()
    feed, _ = await start_source(nursery, api_client, on_unavailable=reports, backoff_max=0.2)
    assert names(by_kind(feed.batches[0])["ServiceCIDR"]) == {"kubernetes"}
    await eventually(lambda: "ServiceCIDR" in reports.now)
    assert reports.now["ServiceCIDR"].verb == "watch"
    apiserver.allow("servicecidrs")
    await eventually(lambda: reports.now == {})
    apiserver.store.put("servicecidrs", service_cidr("extra", "10.97.0.0/16"))
    seen = await feed.until(is_upsert_of("extra", "ServiceCIDR"))
    assert not feed.replaces(seen)  # resumed from the list's version: no relist was needed


@pytest.mark.parametrize(("plural", "kind"), [("services", "Service"), ("nodes", "Node")])
async def test_forbidden_required_kind_holds_the_first_sync_and_says_why(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery, plural: str, kind: str
) -> None:
    populate(apiserver)
    apiserver.forbid(plural)
    reports = Reports()
    health = HealthState(grace_seconds=60)

    def report(kinds: Mapping[str, Unavailable]) -> None:  # as the daemon wires it
        reports(kinds)
        health.block("; ".join(str(u) for u in kinds.values() if u.required))

    send, receive = trio.open_memory_channel[list[Change]](10)
    source = KubeSource(
        api_client,
        node_name=NODE,
        backoff_initial=0.05,
        backoff_max=0.1,
        on_unavailable=report,
    )
    with capture_logs() as logs:
        nursery.start_soon(source.run, send)
        await eventually(lambda: kind in reports.now)
        await eventually(lambda: list_requests(apiserver, f"/{plural}") >= 4)  # retried
        with trio.move_on_after(0.3):
            await receive.receive()
            raise AssertionError("synced without a required kind")
    problem = reports.now[kind]
    assert problem.required
    assert (problem.verb, problem.reason) == ("list", "forbidden")
    said = [logged(e) for e in logs if e["event"] == "source.kind_unavailable"]
    assert [s for s in said if s[0] != "debug"] == [("error", kind, "list")]  # once, loudly
    health.synced(0.0)  # even a proxy that synced before is not ready while blocked
    code, body = healthz(health, 0.0)
    assert code == 503
    assert f"{kind}: list forbidden" in body.decode()
    apiserver.allow(plural)
    feed = Feed(receive)
    batch = await feed.batch()
    assert names(by_kind(batch)["Service"]) == {"svc-0", "svc-1", "svc-2"}
    assert reports.now == {}
    assert healthz(health, 0.0)[0] == 200


async def test_unauthorized_token_is_reported(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver)
    apiserver.token = "rotated-away"
    reports = Reports()
    send, _receive = trio.open_memory_channel[list[Change]](10)
    source = KubeSource(
        api_client, node_name=NODE, backoff_initial=0.05, backoff_max=0.1, on_unavailable=reports
    )
    nursery.start_soon(source.run, send)
    await eventually(lambda: {"Service", "EndpointSlice", "Node"} <= set(reports.now))
    assert {u.reason for u in reports.now.values()} == {"unauthorized"}


async def test_service_cidrs_not_served_are_expected_not_warned(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    # A cluster before 1.33: no ServiceCIDR API at all. Reported (metric), said at info
    # level, and asked about again only every watch timeout, not at the backoff's pace.
    populate(apiserver)
    apiserver.disabled.add("/apis/networking.k8s.io/v1/servicecidrs")
    reports = Reports()
    with capture_logs() as logs:
        feed, _ = await start_source(
            nursery, api_client, on_unavailable=reports, backoff_max=0.05, watch_timeout=30
        )
        await feed.nothing_for(1.0)
    assert reports.now["ServiceCIDR"].reason == "not-served"
    said = [logged(e) for e in logs if e["event"] == "source.kind_unavailable"]
    assert [s for s in said if s[0] != "debug"] == [("info", "ServiceCIDR", "list")]
    assert list_requests(apiserver, "servicecidrs") <= 2
