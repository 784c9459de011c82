"""A cold start's initial lists taken page by page (``ClusterState.preload``,
``RestartRecords.warm``, ``sync/preload.py``): the state and the restart digest the complete
lists give afterwards are those of the lists applied at once, and only the tail is left."""

from __future__ import annotations

from ipaddress import ip_network
from typing import Any

import pytest
import structlog

from nlproxy.cluster.model import (
    Change,
    ClusterSnapshot,
    Invalid,
    ObjectRef,
    Replace,
    ServiceKey,
    Skip,
    Upsert,
)
from nlproxy.cluster.parse import to_change
from nlproxy.cluster.state import ClusterState
from nlproxy.conntrack.fake import FakeConntrack
from nlproxy.nft.fake import FakeNftables
from nlproxy.nft.ir import Family, Ruleset
from nlproxy.nft.render import render_ruleset
from nlproxy.proxy import naming as n
from nlproxy.proxy.config import ProxyConfig
from nlproxy.sync.kernel import SyncKernel
from nlproxy.sync.preload import preloading
from nlproxy.sync.restart import RestartRecords
from nlproxy.sync.syncer import Syncer
from tests.objects import example_endpoint_slice as endpoint_slice
from tests.objects import example_node as node
from tests.objects import example_service as service

NODE = "node-a"
CONFIG = ProxyConfig(node_name=NODE, cluster_cidrs=(ip_network("10.0.0.0/8"),))

Listed = Upsert | Skip | Invalid


def svc(i: int, **fields: Any) -> Listed:
    ip = f"10.96.0.{i + 1}"
    doc = service(
        **{"metadata.name": f"s{i}", "spec.clusterIP": ip, "spec.clusterIPs": [ip], **fields}
    )
    change = to_change(doc)
    assert isinstance(change, Upsert | Skip | Invalid)
    return change


def eps(i: int, ip: str | None = None, **fields: Any) -> Listed:
    doc = endpoint_slice(
        **{
            "metadata.name": f"s{i}-a",
            "metadata.labels": {"kubernetes.io/service-name": f"s{i}"},
            "endpoints": [{"addresses": [ip or f"10.1.0.{i + 1}"], "nodeName": NODE}],
            **fields,
        }
    )
    change = to_change(doc)
    assert isinstance(change, Upsert | Skip | Invalid)
    return change


def the_node() -> Listed:
    change = to_change(node(**{"metadata.name": NODE}))
    assert isinstance(change, Upsert)
    return change


def lists(services: list[Listed], slices: list[Listed]) -> list[Change]:
    """The batch a source sends when its lists end."""
    return [
        Replace(kind="Service", changes=tuple(services)),
        Replace(kind="EndpointSlice", changes=tuple(slices)),
        Replace(kind="Node", changes=(the_node(),)),
    ]


def pages(changes: list[Listed], size: int) -> list[list[Listed]]:
    return [changes[i : i + size] for i in range(0, len(changes), size)]


def same(a: ClusterSnapshot, b: ClusterSnapshot) -> bool:
    return (
        dict(a.services) == dict(b.services)
        and dict(a.slices) == dict(b.slices)
        and a.node == b.node
    )


def render(rs: Ruleset | None) -> str:
    assert rs is not None
    return render_ruleset(rs)


def key(i: int) -> ServiceKey:
    return ServiceKey(namespace="default", name=f"s{i}")


def test_the_lists_over_their_preloaded_pages_make_the_state_they_make_alone() -> None:
    services = [svc(i) for i in range(7)] + [svc(7, **{"spec.clusterIP": "None"})]  # headless
    slices = [eps(i) for i in range(7)] + [eps(9)]  # s9: an orphan
    alone = ClusterState(NODE)
    changed_alone = alone.apply(lists(services, slices))

    state = ClusterState(NODE)
    for page in pages(services, 3) + pages(slices, 3):
        state.preload(page)
    changed = state.apply(lists(services, slices))
    assert same(state.snapshot(), alone.snapshot())
    assert changed == changed_alone  # every service reported once, by the lists' apply
    assert state.orphans() == alone.orphans()
    assert state.apply([]) == set()


def test_what_a_restarted_list_no_longer_holds_goes_with_the_lists_apply() -> None:
    """A list restarted from its first page (its continue token expired) hands its pages
    again; what only the first attempt held is removed by the complete list's Replace."""
    state = ClusterState(NODE)
    state.preload([svc(0), svc(1), svc(2)])  # the first attempt's first page
    state.preload([eps(0), eps(1, ip="10.1.0.99")])
    services, slices = [svc(1), svc(2)], [eps(1), eps(2)]  # s0 deleted, s1's endpoint moved
    for page in ([svc(1)], [svc(2)], slices):
        state.preload(page)
    changed = state.apply(lists(services, slices))
    alone = ClusterState(NODE)
    alone.apply(lists(services, slices))
    assert same(state.snapshot(), alone.snapshot())
    assert {key(0), key(1), key(2)} <= changed


def test_an_invalid_object_preloaded_is_named_as_the_lists_name_it() -> None:
    bad = svc(3, **{"spec.ports": [{"port": 70000}]})
    assert isinstance(bad, Invalid)
    state = ClusterState(NODE)
    state.preload([svc(0), bad])
    state.apply(lists([svc(0), bad], [eps(0)]))
    assert list(state.invalid) == [ObjectRef(kind="Service", namespace="default", name="s3")]
    fixed = ClusterState(NODE)
    fixed.preload([svc(0), bad])
    fixed.apply(lists([svc(0), svc(3)], [eps(0)]))  # fixed before the list ended
    assert not fixed.invalid
    assert key(3) in fixed.snapshot().services


def records() -> RestartRecords:
    return RestartRecords(CONFIG, FakeNftables(n.TABLE), structlog.get_logger())


def syncer_on(nft: FakeNftables) -> Syncer:
    return Syncer(CONFIG, SyncKernel(tables=nft.open, readback=nft, flows=FakeConntrack()))


@pytest.mark.parametrize("size", [1, 3, 50])
def test_a_digest_warmed_page_by_page_is_the_digest_of_the_lists(size: int) -> None:
    services = [svc(i) for i in range(12)]
    slices = [eps(i) for i in range(1, 12)] + [eps(20)]  # s0 without, s20 an orphan
    alone = ClusterState(NODE)
    changed = alone.apply(lists(services, slices))
    cold = records()
    cold.take_digest(alone.snapshot(), changed, exact=True)

    state, warm = ClusterState(NODE), records()
    for page in pages(services, size) + pages(slices, size):
        changed = state.preload(page)
        warm.warm(state.snapshot(), changed)
    changed = state.apply(lists(services, slices))
    warm.take_digest(state.snapshot(), changed, exact=True)
    assert warm.digest is not None
    assert warm.digest == cold.digest


def test_warmed_services_are_not_hashed_again_by_the_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    services = [svc(i) for i in range(6)]
    slices = [eps(i) for i in range(6)]
    state, warm = ClusterState(NODE), records()
    for page in pages(services, 2) + pages(slices, 2):
        changed = state.preload(page)
        warm.warm(state.snapshot(), changed)
    hashed: list[bytes] = []
    monkeypatch.setattr("nlproxy.sync.fingerprint._h", lambda data: hashed.append(data) or 0)
    changed = state.apply(lists(services, slices))
    warm.take_digest(state.snapshot(), changed, exact=True)
    assert hashed == []


def test_the_daemons_page_hook_fills_the_state_and_the_syncers_digest() -> None:
    services = [svc(i) for i in range(5)]
    slices = [eps(i) for i in range(5)]
    state = ClusterState(NODE)
    nft = FakeNftables(n.TABLE)
    syncer = syncer_on(nft)
    on_page = preloading(state, syncer)
    for page in pages(services, 2) + pages(slices, 2):
        on_page(page)
    changed = state.apply(lists(services, slices))
    assert changed == {key(i) for i in range(5)}
    syncer.sync(state.snapshot(), changed=changed)

    alone = ClusterState(NODE)
    cold_nft = FakeNftables(n.TABLE)
    cold = syncer_on(cold_nft)
    changed = alone.apply(lists(services, slices))
    cold.sync(alone.snapshot(), changed=changed)
    assert syncer.records.digest == cold.records.digest
    for family in (Family.IP, Family.IP6):
        assert render(nft.dump(family)) == render(cold_nft.dump(family))
