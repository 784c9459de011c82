"""Cluster state: which services each kind of change marks, Replace, invalid keeps last good."""

from __future__ import annotations

import random
from typing import Any

import pytest

from nlproxy.cluster.model import (
    Change,
    Delete,
    Invalid,
    ObjectRef,
    Replace,
    ServiceKey,
    Skip,
    Upsert,
)
from nlproxy.cluster.parse import KINDS, to_change
from nlproxy.cluster.state import ClusterState
from tests.objects import DROP
from tests.objects import example_endpoint_slice as endpoint_slice
from tests.objects import example_node as node
from tests.objects import example_service as service
from tests.objects import example_service_cidr as service_cidr

WEB = ServiceKey(namespace="default", name="web")
DB = ServiceKey(namespace="default", name="db")


def up(obj: dict[str, Any]) -> Upsert:
    change = to_change(obj)
    assert isinstance(change, Upsert), change
    return change


def svc(name: str = "web", **fields: Any) -> dict[str, Any]:
    """A Service with a ClusterIP of its own (two Services never share one in a real cluster;
    the state would leave the younger out)."""
    ip = f"10.96.{len(name)}.{sum(map(ord, name)) % 250 + 1}"
    return service(
        **{"metadata.name": name, "spec.clusterIP": ip, "spec.clusterIPs": [ip], **fields}
    )


def eps(name: str = "web-1", service_name: str = "web", **fields: Any) -> dict[str, Any]:
    return endpoint_slice(
        **{
            "metadata.name": name,
            "metadata.labels": {"kubernetes.io/service-name": service_name},
            **fields,
        }
    )


def ref(kind: str, name: str, namespace: str = "default") -> ObjectRef:
    return ObjectRef(kind=kind, namespace=namespace, name=name)


def state_with_two_services() -> ClusterState:
    state = ClusterState("n1")
    state.apply([up(svc("web")), up(eps("web-1")), up(svc("db")), up(eps("db-1", "db"))])
    return state


# Each case: changes applied to a state holding web (+ slice web-1) and db (+ slice db-1).
CASES = [
    pytest.param([up(svc("web", **{"spec.ports[0].port": 81}))], {WEB}, id="service-modified"),
    pytest.param([up(svc("web"))], set(), id="service-unchanged"),
    pytest.param(
        [up(svc("web", **{"metadata.resourceVersion": "99"}))], set(), id="resource-version-only"
    ),
    pytest.param([Delete(ref=ref("Service", "web"))], {WEB}, id="service-deleted"),
    pytest.param([Delete(ref=ref("Service", "nope"))], set(), id="unknown-deleted"),
    pytest.param([up(svc("new"))], {ServiceKey(namespace="default", name="new")}, id="added"),
    pytest.param(
        [to_change(svc("web", **{"spec.clusterIP": "None", "spec.clusterIPs": ["None"]}))],
        {WEB},
        id="service-became-headless",
    ),
    pytest.param(
        [up(eps("web-1", **{"endpoints[0].addresses": ["10.0.1.9"]}))],
        {WEB},
        id="slice-modified",
    ),
    pytest.param([up(eps("web-2"))], {WEB}, id="second-slice-added"),
    pytest.param([Delete(ref=ref("EndpointSlice", "db-1"))], {DB}, id="slice-deleted"),
    pytest.param([up(eps("web-1", "db"))], {WEB, DB}, id="slice-moved-to-other-service"),
    pytest.param(
        [to_change(eps("web-1", addressType="FQDN", endpoints=[]))],
        {WEB},
        id="slice-became-fqdn",
    ),
    pytest.param(
        [to_change(svc("web", **{"spec.ports[0].port": 70000}))], set(), id="service-invalid"
    ),
    pytest.param(
        [to_change(eps("web-1", **{"endpoints[0].addresses": ["x"]}))], set(), id="slice-invalid"
    ),
    pytest.param([up(node())], {WEB, DB}, id="node-added"),
    pytest.param([up(node(**{"metadata.name": "n2"}))], set(), id="other-node-ignored"),
    pytest.param([up(service_cidr())], {WEB, DB}, id="servicecidr-added"),
    pytest.param(
        [up(svc("web", **{"spec.ports[0].port": 81})), up(service_cidr())],
        {WEB, DB},
        id="mixed",
    ),
    pytest.param([], set(), id="nothing"),
]


@pytest.mark.parametrize(("changes", "expected"), CASES)
def test_changed_services(changes: list[Change], expected: set[ServiceKey]) -> None:
    state = state_with_two_services()
    assert state.apply(changes) == expected


def test_node_changes() -> None:
    state = ClusterState("n1")
    state.apply([up(svc("web"))])
    assert state.apply([up(node())]) == {WEB}
    assert state.apply([up(node())]) == set()
    zone_b = node(**{"metadata.labels": {"topology.kubernetes.io/zone": "zone-b"}})
    assert state.apply([up(zone_b)]) == {WEB}
    assert state.snapshot().node is not None
    assert state.snapshot().node.zone == "zone-b"  # type: ignore[union-attr]
    addresses = node(**{"status.addresses": [{"type": "InternalIP", "address": "192.168.1.11"}]})
    assert state.apply([up(addresses)]) == {WEB}
    assert state.apply([Delete(ref=ref("Node", "n2", ""))]) == set()
    assert state.apply([Delete(ref=ref("Node", "n1", ""))]) == {WEB}
    assert state.snapshot().node is None


def test_node_labels_taints_and_deletion_change_no_service() -> None:
    state = state_with_two_services()
    assert state.apply([up(node())]) == {WEB, DB}
    tainted = node(**{"spec.taints": [{"key": "ToBeDeletedByClusterAutoscaler"}]})
    assert state.apply([up(tainted)]) == set()
    assert state.snapshot().node is not None
    assert state.snapshot().node.taint_keys == ("ToBeDeletedByClusterAutoscaler",)  # type: ignore[union-attr]
    labelled = node(**{"metadata.labels": {"topology.kubernetes.io/zone": "zone-a", "x": "y"}})
    assert state.apply([up(labelled)]) == set()
    assert ("x", "y") in state.snapshot().node.labels  # type: ignore[union-attr]
    deleting = node(**{"metadata.deletionTimestamp": "2026-11-28T12:00:00Z"})
    assert state.apply([up(deleting)]) == set()
    assert state.snapshot().node.deleting  # type: ignore[union-attr]
    # What planning reads still marks every service: the zone, the addresses.
    zone_b = node(**{"metadata.labels": {"topology.kubernetes.io/zone": "zone-b"}})
    assert state.apply([up(zone_b)]) == {WEB, DB}
    pods = node(**{"metadata.labels": {"topology.kubernetes.io/zone": "zone-b"},
                   "spec.podCIDRs": ["10.244.9.0/24"]})  # fmt: skip
    assert state.apply([up(pods)]) == {WEB, DB}


def test_service_cidr_changes() -> None:
    state = ClusterState("n1")
    state.apply([up(svc("web")), up(service_cidr())])
    assert state.apply([up(service_cidr())]) == set()
    narrower = service_cidr(**{"spec.cidrs": ["10.96.0.0/20"]})
    assert state.apply([up(narrower)]) == {WEB}
    assert [str(c) for c in state.snapshot().service_cidrs[0].cidrs] == ["10.96.0.0/20"]
    assert state.apply([Delete(ref=ref("ServiceCIDR", "kubernetes", ""))]) == {WEB}
    assert state.snapshot().service_cidrs == ()


def test_slices_grouped_by_service_sorted_by_name() -> None:
    state = ClusterState("n1")
    state.apply([up(eps("web-b")), up(eps("web-a")), up(eps("db-1", "db")), up(svc("web"))])
    snap = state.snapshot()
    assert [s.name for s in snap.slices[WEB]] == ["web-a", "web-b"]
    assert [s.name for s in snap.slices[DB]] == ["db-1"]
    assert set(snap.services) == {WEB}
    state.apply([up(eps("web-a", "db"))])
    snap = state.snapshot()
    assert [s.name for s in snap.slices[WEB]] == ["web-b"]
    assert [s.name for s in snap.slices[DB]] == ["db-1", "web-a"]
    state.apply([Delete(ref=ref("EndpointSlice", "web-b"))])
    assert WEB not in state.snapshot().slices


def test_invalid_keeps_last_good_version() -> None:
    state = ClusterState("n1")
    state.apply([up(svc("web"))])
    good = state.snapshot().services[WEB]
    bad = to_change(svc("web", **{"spec.ports[0].port": 70000}))
    assert isinstance(bad, Invalid)
    assert state.apply([bad]) == set()
    assert state.snapshot().services[WEB] is good
    assert state.invalid == {ref("Service", "web"): bad.error}
    assert bad.error == "Service default/web: spec.ports[0].port: 70000 is not in 1..65535"
    # A fixed version replaces the good one and clears the error.
    assert state.apply([up(svc("web", **{"spec.ports[0].port": 82}))]) == {WEB}
    assert state.invalid == {}
    assert state.snapshot().services[WEB].ports[0].port == 82


def test_invalid_without_good_version_is_only_reported() -> None:
    state = ClusterState("n1")
    bad = to_change(svc("web", **{"spec.clusterIP": "bogus", "spec.clusterIPs": DROP}))
    assert state.apply([bad]) == set()
    assert WEB not in state.snapshot().services
    assert list(state.invalid) == [ref("Service", "web")]
    assert state.apply([Delete(ref=ref("Service", "web"))]) == set()
    assert state.invalid == {}


def test_skip_removes_object_and_error() -> None:
    state = ClusterState("n1")
    state.apply([up(svc("web")), to_change(svc("web", **{"spec.ports[0].port": 0}))])
    assert state.invalid
    assert state.apply([Skip(ref=ref("Service", "web"))]) == {WEB}
    assert state.invalid == {}
    assert WEB not in state.snapshot().services


def test_invalid_other_node_not_reported() -> None:
    state = ClusterState("n1")
    other = to_change(node(**{"metadata.name": "n2", "status.addresses[1].address": "x"}))
    mine = to_change(node(**{"status.addresses[1].address": "x"}))
    assert isinstance(other, Invalid)
    assert isinstance(mine, Invalid)
    state.apply([other, mine])
    assert list(state.invalid) == [ref("Node", "n1", "")]


def test_replace_deletes_unlisted_objects_of_its_kind_only() -> None:
    state = state_with_two_services()
    state.apply([up(node()), up(service_cidr())])
    changed = state.apply([Replace(kind="Service", changes=(up(svc("web")),))])
    assert changed == {DB}
    snap = state.snapshot()
    assert set(snap.services) == {WEB}
    assert set(snap.slices) == {WEB, DB}  # slices are another kind: untouched
    assert snap.node is not None
    assert len(snap.service_cidrs) == 1


def test_replace_slices_and_errors() -> None:
    state = state_with_two_services()
    bad_db = to_change(svc("db", **{"spec.ports[0].protocol": "ICMP"}))
    bad_web_slice = to_change(eps("web-1", **{"ports[0].port": 0}))
    state.apply([bad_db])
    assert ref("Service", "db") in state.invalid
    # The relist no longer has db at all: its object and its stale error both go.
    changed = state.apply([Replace(kind="Service", changes=(up(svc("web")),))])
    assert changed == {DB}
    assert state.invalid == {}
    # A slice relist with web-1 invalid keeps the good web-1 and drops db-1.
    changed = state.apply([Replace(kind="EndpointSlice", changes=(bad_web_slice,))])
    assert changed == {DB}
    assert [s.name for s in state.snapshot().slices[WEB]] == ["web-1"]
    assert DB not in state.snapshot().slices
    assert list(state.invalid) == [ref("EndpointSlice", "web-1")]


def test_replace_nodes_and_cidrs_mark_everything() -> None:
    state = state_with_two_services()
    state.apply([up(node()), up(service_cidr())])
    assert state.apply([Replace(kind="Node", changes=(up(node()),))]) == set()
    other = up(node(**{"metadata.name": "n2"}))
    assert state.apply([Replace(kind="Node", changes=(other,))]) == {WEB, DB}
    assert state.snapshot().node is None
    assert state.apply([Replace(kind="ServiceCIDR", changes=())]) == {WEB, DB}
    assert state.apply([Replace(kind="ServiceCIDR", changes=())]) == set()


def test_snapshot_reused_until_something_changes() -> None:
    state = state_with_two_services()
    first = state.snapshot()
    assert state.snapshot() is first
    state.apply([up(svc("web"))])  # identical: nothing to plan, but the same objects
    second = state.snapshot()
    assert second.services == first.services
    state.apply([up(eps("db-1", "db", **{"endpoints[0].conditions.ready": False}))])
    third = state.snapshot()
    assert third is not second
    assert third.services is second.services  # no Service changed: mapping reused
    assert third.slices[WEB] is second.slices[WEB]  # untouched group reused
    assert third.slices[DB] != second.slices[DB]
    assert not third.slices[DB][0].endpoints[0].ready
    # Snapshots are immutable views: later changes do not leak into earlier ones.
    state.apply([Delete(ref=ref("Service", "web"))])
    assert WEB in third.services
    assert WEB not in state.snapshot().services
    with pytest.raises(TypeError):
        third.services[WEB] = third.services[WEB]  # type: ignore[index]


ORPHAN = ref("EndpointSlice", "wbe-1")


@pytest.mark.parametrize(
    ("changes", "orphans"),
    [
        pytest.param([], {ORPHAN}, id="typo-in-service-name"),
        pytest.param([up(svc("wbe"))], set(), id="service-arrives"),
        pytest.param([Skip(ref=ref("Service", "wbe"))], set(), id="service-skipped-headless"),
        pytest.param(
            [Invalid(ref=ref("Service", "wbe"), error="Service default/wbe: bad")],
            set(),
            id="service-invalid-is-known",
        ),
        pytest.param([Delete(ref=ORPHAN)], set(), id="slice-deleted"),
        pytest.param(
            [
                Skip(ref=ref("Service", "wbe")),
                Replace(kind="Service", changes=(up(svc("web")), up(svc("db")))),
            ],
            {ORPHAN},
            id="skipped-service-gone-after-relist",
        ),
    ],
)
def test_orphans(changes: list[Change], orphans: set[ObjectRef]) -> None:
    state = state_with_two_services()
    state.apply([up(eps("wbe-1", "wbe")), *changes])
    found = state.orphans()
    assert set(found) == orphans
    if orphans:
        assert found[ORPHAN] == "EndpointSlice default/wbe-1: Service default/wbe not found"
        assert state.orphans([ORPHAN, ref("EndpointSlice", "web-1")]) == found


def test_a_relist_of_equal_objects_keeps_the_snapshot_and_its_objects() -> None:
    """A relist (after an API server restart, or a manifests reload) brings new copies of the
    same objects: nothing changed, the snapshot is the same one and holds the same objects,
    so what is cached by identity (the restart fingerprint, per-service plans) stays valid."""
    state = ClusterState("n1")
    listed = [up(svc("web")), up(eps("web-1")), up(svc("db")), up(eps("db-1", "db"))]
    state.apply(
        [Replace(kind=k, changes=tuple(c for c in listed if c.ref.kind == k)) for k in KINDS]
    )
    before = state.snapshot()
    copies = [up(svc("web")), up(eps("web-1")), up(svc("db")), up(eps("db-1", "db"))]
    again = [Replace(kind=k, changes=tuple(c for c in copies if c.ref.kind == k)) for k in KINDS]
    assert state.apply(again) == set()
    after = state.snapshot()
    assert after is before
    assert after.services[WEB] is listed[0].obj
    assert after.slices[WEB][0] is listed[1].obj
    # A new resourceVersion alone is no change: the model does not hold it, so the new
    # object equals the old one, which stays (with the snapshot).
    bumped = up(svc("web", **{"metadata.resourceVersion": "77"}))
    assert bumped.obj == listed[0].obj
    assert state.apply([bumped]) == set()
    assert state.snapshot() is before
    assert state.snapshot().services[WEB] is listed[0].obj


@pytest.mark.parametrize("seed", range(5))
def test_slices_coming_going_and_moving_group_as_in_a_fresh_state(seed: int) -> None:
    """Slices added, deleted and moved between Services at random, one to four per Service:
    each snapshot groups them as a state given only the current slices does."""
    rng = random.Random(seed)
    services = [f"s{i}" for i in range(4)]
    current: dict[str, str] = {}  # slice name -> its Service
    state = ClusterState("n1")
    state.apply([up(svc(name)) for name in services])
    for _ in range(300):
        name = f"e{rng.randrange(10)}"
        if name in current and rng.random() < 0.4:
            del current[name]
            state.apply([Delete(ref=ref("EndpointSlice", name))])
        else:
            current[name] = rng.choice(services)
            state.apply([up(eps(name, current[name]))])
        fresh = ClusterState("n1")
        fresh.apply([up(svc(s)) for s in services])
        fresh.apply([up(eps(n, s)) for n, s in current.items()])
        got, want = state.snapshot().slices, fresh.snapshot().slices
        assert {k: [s.name for s in v] for k, v in got.items()} == {
            k: [s.name for s in v] for k, v in want.items()
        }
