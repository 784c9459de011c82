"""The sync loop's reporter on its own (``sync/report.py``): pending change events, the
programming latency observed once per trigger time, and problems logged once, not per sync."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from ipaddress import ip_network

import msgspec
import pytest
import structlog.testing
from prometheus_client import CollectorRegistry

from nlproxy.cluster.model import Change, Delete, EndpointSlice, Invalid, ObjectRef, Replace, Skip
from nlproxy.cluster.state import ClusterState
from nlproxy.log import get_logger
from nlproxy.nft.ir import Family
from nlproxy.proxy.config import ProxyConfig
from nlproxy.serve.health import HealthState
from nlproxy.serve.metrics import Metrics
from nlproxy.sync.report import SyncReporter
from nlproxy.sync.result import SyncResult
from tests.unit.builders import NODE, endpoint, eps_slice, service, upsert

CONFIG = ProxyConfig(node_name=NODE, cluster_cidrs=(ip_network("10.0.0.0/8"),))


def reporter() -> tuple[SyncReporter, ClusterState, Metrics]:
    state, metrics = ClusterState(NODE), Metrics(CollectorRegistry())
    report = SyncReporter(
        state, health=HealthState(grace_seconds=120), metrics=metrics, log=get_logger("sync")
    )
    return report, state, metrics


def value(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def triggered(ips: list[str], at: datetime | None) -> EndpointSlice:
    sl = eps_slice("a", "web", [endpoint(ip) for ip in ips])
    return msgspec.structs.replace(sl, last_change_trigger_time=at)


async def test_pending_change_events_count_until_a_sync_succeeds() -> None:
    report, state, metrics = reporter()
    changes = [upsert(service("a", "web", "172.30.0.1")), upsert(triggered(["10.1.0.1"], None))]
    pending = state.apply(changes)
    report.queued(changes)
    report.queued(changes[1:])
    assert value(metrics, "kubeproxy_sync_proxy_rules_service_changes_pending") == 1
    assert value(metrics, "kubeproxy_sync_proxy_rules_endpoint_changes_pending") == 2

    report.synced(SyncResult(), pending, state.snapshot(), verify=False, exact=True)

    assert value(metrics, "kubeproxy_sync_proxy_rules_service_changes_pending") == 0
    assert value(metrics, "kubeproxy_sync_proxy_rules_endpoint_changes_pending") == 0
    assert value(metrics, "kubeproxy_sync_proxy_rules_endpoint_changes_total") == 2


async def test_a_trigger_time_is_observed_once_and_never_one_older_than_the_process() -> None:
    report, state, metrics = reporter()
    count = "kubeproxy_network_programming_duration_seconds_count"
    old = datetime.now(UTC) - timedelta(hours=1)  # the initial list's: a wait nlproxy did not cause
    pending = state.apply(
        [upsert(service("a", "web", "172.30.0.1")), upsert(triggered(["10.1.0.1"], old))]
    )
    report.synced(SyncResult(), pending, state.snapshot(), verify=False, exact=True)
    assert value(metrics, count, ip_family="IPv4") == 0

    fresh = datetime.now(UTC) + timedelta(seconds=2)
    pending = state.apply([upsert(triggered(["10.1.0.2"], fresh))])
    report.synced(SyncResult(), pending, state.snapshot(), verify=False, exact=True)
    assert value(metrics, count, ip_family="IPv4") == 1
    report.synced(
        SyncResult(), pending, state.snapshot(), verify=True, exact=False
    )  # the same trigger again
    assert value(metrics, count, ip_family="IPv4") == 1


async def test_a_problem_is_logged_once_and_counted_while_it_lasts() -> None:
    report, state, metrics = reporter()
    snap = state.snapshot()
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            report.objects(snap, CONFIG, ["manifests/a.yaml: not YAML"], verify=False)
        assert value(metrics, "nlproxy_invalid_objects") == 1
        report.objects(snap, CONFIG, [], verify=True)
    invalid = [e for e in logs if e["event"] == "object.invalid"]
    assert [e["error"] for e in invalid] == ["manifests/a.yaml: not YAML"]
    assert value(metrics, "nlproxy_invalid_objects") == 0


async def test_an_idle_verify_is_not_an_info_line_every_period() -> None:
    report, state, _ = reporter()
    pending = state.apply([upsert(service("a", "web", "172.30.0.1"))])
    ops = {Family.IP: 0, Family.IP6: 0}
    snap = state.snapshot()
    with structlog.testing.capture_logs() as logs:
        report.synced(SyncResult(ops=dict(ops)), pending, snap, verify=False, exact=True)
        report.synced(SyncResult(ops=dict(ops)), set(), snap, verify=True, exact=False)  # idle
        report.synced(SyncResult(ops=dict(ops)), set(), snap, verify=False, exact=True)  # nothing
        report.synced(SyncResult(ops={Family.IP: 3}), set(), snap, verify=True, exact=False)
        report.synced(
            SyncResult(ops=dict(ops)), set(), snap, verify=True, exact=False, repaired=True
        )
        report.synced(
            SyncResult(ops=dict(ops)), set(), snap, verify=True, exact=False, readback_ms=1.0
        )
    applied = [
        (e["log_level"], e["ops"], e["verify"]) for e in logs if e["event"] == "sync.applied"
    ]
    assert applied == [
        ("info", 0, False),  # the change of a Service, even when it sent nothing
        ("debug", 0, True),
        ("info", 3, True),
        ("info", 0, True),
        ("info", 0, True),
    ]


async def test_a_change_received_during_the_sync_is_not_taken_for_programmed() -> None:
    """The sync programmed the snapshot it was given: a newer trigger time that arrived while
    it ran is measured when a later sync programs it, and a Service the kernel refused is not
    programmed at all."""
    report, state, metrics = reporter()
    count = "kubeproxy_network_programming_duration_seconds_count"
    pending = state.apply([upsert(service("a", "web", "172.30.0.1"))])
    synced = state.snapshot()
    fresh = datetime.now(UTC) + timedelta(seconds=2)
    pending |= state.apply([upsert(triggered(["10.1.0.2"], fresh))])  # during the sync
    report.synced(SyncResult(), pending, synced, verify=False, exact=True)
    assert value(metrics, count, ip_family="IPv4") == 0
    report.synced(SyncResult(), pending, state.snapshot(), verify=False, exact=True)
    assert value(metrics, count, ip_family="IPv4") == 1

    later = fresh + timedelta(seconds=1)
    pending = state.apply([upsert(triggered(["10.1.0.3"], later))])
    (key,) = pending
    refused = SyncResult(excluded={key: "the kernel refused it"})
    report.synced(refused, pending, state.snapshot(), verify=False, exact=True)
    assert value(metrics, count, ip_family="IPv4") == 1
    report.synced(SyncResult(), pending, state.snapshot(), verify=False, exact=True)
    assert value(metrics, count, ip_family="IPv4") == 2


class CountingState(ClusterState):
    """The state, counting the walks over every slice that look for orphans."""

    walks = 0

    def orphans(self, among: Iterable[ObjectRef] | None = None) -> dict[ObjectRef, str]:
        if among is None:
            self.walks += 1
        return super().orphans(among)


def changed(state: ClusterState, report: SyncReporter, changes: list[Change]) -> None:
    """As the loop applies changes: the state's changed Services go to the reporter."""
    report.changed(state.apply(changes))
    report.queued(changes)


async def test_orphans_are_found_among_the_changed_services_without_walking_every_slice() -> None:
    """An orphan slice is reported at the first verify that still finds it and stays
    reported; it is found among the slices of the Services that changed, at the sync that
    follows the change: no sync or verify walks every slice (an idle node's verify costs
    nothing for it)."""
    state, metrics = CountingState(NODE), Metrics(CollectorRegistry())
    report = SyncReporter(
        state, health=HealthState(grace_seconds=120), metrics=metrics, log=get_logger("sync")
    )
    invalid = "nlproxy_invalid_objects"
    changed(state, report, [upsert(service("a", "web", "172.30.0.1"))])
    changed(state, report, [upsert(eps_slice("a", "web", [endpoint("10.1.0.1")]))])
    changed(state, report, [upsert(eps_slice("a", "ghost", [endpoint("10.1.0.9")]))])
    report.objects(state.snapshot(), CONFIG, [], verify=False)
    assert value(metrics, invalid) == 0  # its Service may still come: a verify decides
    for _ in range(3):
        report.objects(state.snapshot(), CONFIG, [], verify=True)
        assert value(metrics, invalid) == 1
    changed(state, report, [upsert(service("a", "ghost", "172.30.0.9"))])  # its Service comes
    report.objects(state.snapshot(), CONFIG, [], verify=False)
    assert value(metrics, invalid) == 0
    report.objects(state.snapshot(), CONFIG, [], verify=True)
    assert value(metrics, invalid) == 0
    ref = ObjectRef(kind="Service", namespace="a", name="web")
    changed(state, report, [Delete(ref=ref)])  # a slice's Service goes: an orphan at the verify
    report.objects(state.snapshot(), CONFIG, [], verify=False)
    assert value(metrics, invalid) == 0
    report.objects(state.snapshot(), CONFIG, [], verify=True)
    assert value(metrics, invalid) == 1
    assert state.walks == 0


async def test_a_slice_whose_service_comes_before_the_verify_is_never_an_orphan() -> None:
    report, state, metrics = reporter()
    changed(state, report, [upsert(eps_slice("a", "late", [endpoint("10.1.0.2")]))])
    report.objects(state.snapshot(), CONFIG, [], verify=False)
    changed(state, report, [upsert(service("a", "late", "172.30.0.2"))])
    report.objects(state.snapshot(), CONFIG, [], verify=True)
    assert value(metrics, "nlproxy_invalid_objects") == 0


DB = ObjectRef(kind="Service", namespace="a", name="db")
DB_SLICE = upsert(eps_slice("a", "db", [endpoint("10.1.0.9")]))
DB_VALID = upsert(service("a", "db", "172.30.0.9"))
DB_INVALID = Invalid(ref=DB, error="Service a/db: spec.clusterIP: not an address")


@pytest.mark.parametrize(
    "steps",
    [
        [[DB_INVALID, DB_SLICE], [Delete(ref=DB)]],
        [[DB_INVALID, DB_SLICE], [Replace(kind="Service", changes=())]],
        [[Skip(ref=DB), DB_SLICE], [Delete(ref=DB)]],
        [[Skip(ref=DB), DB_SLICE], [Replace(kind="Service", changes=())]],
        [[DB_VALID, DB_SLICE], [Skip(ref=DB)], [Delete(ref=DB)]],
        [[DB_VALID, DB_SLICE], [Delete(ref=DB)]],
    ],
    ids=[
        "invalid-deleted",
        "invalid-gone-at-relist",
        "skipped-deleted",
        "skipped-gone-at-relist",
        "skipped-then-deleted",
        "valid-deleted",
    ],
)
async def test_a_slice_left_by_a_service_the_state_did_not_proxy_is_an_orphan_too(
    steps: list[list[Change]],
) -> None:
    """A skipped or invalid Service's removal (deleted, or absent from a relist) changes no
    proxied Service, yet leaves its slices orphans: the verifies after it report them, as the
    state's own full check finds them."""
    report, state, metrics = reporter()
    for step in steps:
        changed(state, report, step)
        report.objects(state.snapshot(), CONFIG, [], verify=False)  # the sync after it
    for _ in range(2):
        report.objects(state.snapshot(), CONFIG, [], verify=True)
    assert len(state.orphans()) == 1
    assert value(metrics, "nlproxy_invalid_objects") == 1
