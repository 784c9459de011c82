"""Per-Service programming latency (``sync/latency.py``) and what shows it: the reporter's
opt-in metric of the slowest Services, ``status`` and ``explain``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from ipaddress import ip_network

import msgspec
from prometheus_client import CollectorRegistry

from nlproxy.cluster.model import Delete, EndpointSlice, ObjectRef, ServiceKey
from nlproxy.cluster.state import ClusterState
from nlproxy.log import get_logger
from nlproxy.operate.status import Port, parse_programming
from nlproxy.proxy.config import ProxyConfig
from nlproxy.serve.health import HealthState
from nlproxy.serve.metrics import Metrics
from nlproxy.sync.latency import ANSWERED, SEEN, TRIGGER, ProgrammingLatency
from nlproxy.sync.report import SyncReporter
from nlproxy.sync.result import SyncResult
from tests.unit.builders import NODE, endpoint, eps_slice, service, snapshot, upsert

CONFIG = ProxyConfig(node_name=NODE, cluster_cidrs=(ip_network("10.0.0.0/8"),))
START = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
WEB = ServiceKey(namespace="a", name="web")


def triggered(name: str, at: datetime | None, ip: str = "10.1.0.1") -> EndpointSlice:
    sl = eps_slice("a", name, [endpoint(ip)])
    return msgspec.structs.replace(sl, last_change_trigger_time=at)


def test_a_new_trigger_time_is_measured_from() -> None:
    lat = ProgrammingLatency(START)
    trigger = START + timedelta(seconds=10)
    snap = snapshot([service("a", "web", "172.30.0.1")], [triggered("web", trigger)])
    lat.seen([WEB], START + timedelta(seconds=11))
    observed = lat.programmed([WEB], snap, START + timedelta(seconds=12.5))
    assert [s for _, s in observed] == [2.5]
    assert (lat.last[WEB].seconds, lat.last[WEB].since) == (2.5, TRIGGER)


def test_without_a_new_trigger_time_from_when_it_was_seen() -> None:
    lat = ProgrammingLatency(START)
    old = START - timedelta(hours=1)  # before the process: a wait it did not cause
    snap = snapshot([service("a", "web", "172.30.0.1")], [triggered("web", old)])
    lat.seen([WEB], START + timedelta(seconds=1))
    lat.seen([WEB], START + timedelta(seconds=3))  # a later change waits since the first
    assert lat.programmed([WEB], snap, START + timedelta(seconds=5)) == []
    assert (lat.last[WEB].seconds, lat.last[WEB].since) == (4.0, SEEN)

    # A Service-only edit: the slice's trigger time was counted already.
    fresh = START + timedelta(seconds=20)
    snap = snapshot([service("a", "web", "172.30.0.1")], [triggered("web", fresh)])
    lat.programmed([WEB], snap, START + timedelta(seconds=21))
    lat.seen([WEB], START + timedelta(seconds=30))
    lat.programmed([WEB], snap, START + timedelta(seconds=30.25))
    assert (lat.last[WEB].seconds, lat.last[WEB].since) == (0.25, SEEN)


def test_a_deleted_service_is_forgotten_and_the_slowest_come_first() -> None:
    lat = ProgrammingLatency(START)
    keys = [ServiceKey(namespace="a", name=f"s{i}") for i in range(4)]
    snap = snapshot([service("a", f"s{i}", f"172.30.0.{i + 1}") for i in range(4)])
    for i, key in enumerate(keys):
        lat.seen([key], START + timedelta(seconds=i))
    lat.programmed(keys, snap, START + timedelta(seconds=10))
    assert [k.name for k, _ in lat.slowest(2)] == ["s0", "s1"]
    lat.seen([keys[0]], START + timedelta(seconds=11))
    lat.programmed([keys[0]], snapshot([]), START + timedelta(seconds=12))
    assert keys[0] not in lat.last
    assert [k.name for k, _ in lat.slowest(2)] == ["s1", "s2"]
    assert list(lat.to_json()["services"]) == ["a/s1", "a/s2", "a/s3"]  # type: ignore[call-overload]
    assert lat.to_json(keys[2]) == {"services": {"a/s2": lat.last[keys[2]].to_json()}, "count": 3}
    assert lat.to_json(keys[0]) == {"services": {}, "count": 3}


def test_the_answer_names_only_the_slowest() -> None:
    """Any client of the metrics port may ask: the answer is bounded, not the whole table."""
    lat = ProgrammingLatency(START)
    keys = [ServiceKey(namespace="a", name=f"s{i}") for i in range(ANSWERED + 30)]
    snap = snapshot(
        [service("a", k.name, f"172.30.{i // 250}.{i % 250 + 1}") for i, k in enumerate(keys)]
    )
    for i, key in enumerate(keys):
        lat.seen([key], START + timedelta(seconds=i))
    lat.programmed(keys, snap, START + timedelta(seconds=1000))
    answer = lat.to_json()
    assert answer["count"] == ANSWERED + 30
    assert list(answer["services"]) == [str(k) for k in keys[:ANSWERED]]  # type: ignore[call-overload]


def _reporter(slowest: int) -> tuple[SyncReporter, ClusterState, Metrics]:
    state = ClusterState(NODE)
    metrics = Metrics(CollectorRegistry(), slowest_services=slowest)
    report = SyncReporter(
        state, health=HealthState(grace_seconds=120), metrics=metrics, log=get_logger("sync")
    )
    return report, state, metrics


def _series(metrics: Metrics) -> dict[str, float]:
    return {
        s.labels["service"]: s.value
        for fam in metrics.registry.collect()
        if fam.name == "nlproxy_service_programming_latency_seconds"
        for s in fam.samples
    }


async def test_the_metric_is_opt_in_and_names_only_the_slowest() -> None:
    report, state, metrics = _reporter(0)
    pending = state.apply([upsert(service("a", "web", "172.30.0.1"))])
    report.changed(pending)
    report.synced(SyncResult(), pending, state.snapshot(), verify=False, exact=True)
    assert metrics.service_programming is None
    assert _series(metrics) == {}
    assert report.latency.last[WEB].since == SEEN

    report, state, metrics = _reporter(2)
    for i in range(5):
        pending = state.apply([upsert(service("a", f"s{i}", f"172.30.0.{i + 1}"))])
        report.changed(pending)
        report.synced(SyncResult(), pending, state.snapshot(), verify=False, exact=True)
        assert len(_series(metrics)) == min(i + 1, 2)
    slowest = {str(k) for k, _ in report.latency.slowest(2)}
    assert set(_series(metrics)) == slowest
    # A service deleted leaves the series with it.
    gone = next(iter(slowest))
    ns, name = gone.split("/")
    deleted = Delete(ref=ObjectRef(kind="Service", namespace=ns, name=name))
    pending = state.apply([upsert(service("a", "other", "172.30.1.1")), deleted])
    report.synced(SyncResult(), pending, state.snapshot(), verify=False, exact=True)
    assert gone not in _series(metrics)
    assert len(_series(metrics)) == 2


def test_status_and_explain_read_the_daemons_answer() -> None:
    text = (
        '{"services": {"a/fast": {"seconds": 0.01, "since": "seen", "at": "x"},'
        ' "a/slow": {"seconds": 2.5, "since": "trigger", "at": "x"}}}'
    )
    got = parse_programming(text)
    assert got is not None
    assert [(p.service, p.seconds, p.since) for p in got] == [
        ("a/slow", 2.5, "trigger"),
        ("a/fast", 0.01, "seen"),
    ]
    assert parse_programming("not json") is None
    odd = '{"services": {"a/big": {"seconds": 1e999}, "a/huge": {"seconds": 1%s}}}' % ("0" * 400)
    assert parse_programming(odd) == ()  # not a float a daemon writes: left out, no traceback
    assert parse_programming('{"services": []}') is None


def test_status_lists_the_slowest() -> None:
    from nlproxy.operate.status import DaemonStatus, Programming
    from nlproxy.operate.status_render import render_text, to_json

    port = Port(flag="--metrics-address", bind="127.0.0.1:1", host="127.0.0.1", port=1)
    st = DaemonStatus(
        metrics_port=port,
        healthz_port=port,
        healthz_code=200,
        programming=(Programming(seconds=2.5, service="a/slow", since="trigger"),),
    )
    text = render_text(st, START)
    assert "a/slow  2.500 s  (from its EndpointSlice's trigger time)" in text
    assert to_json(st)["programming"] == [{"service": "a/slow", "seconds": 2.5, "since": "trigger"}]
    unknown = DaemonStatus(metrics_port=port, healthz_port=port, healthz_code=200)
    assert to_json(unknown)["programming"] is None
    assert "slowest programmed" not in render_text(unknown, START)


def test_services_seen_at_one_moment_share_a_wait_and_a_later_change_is_their_own() -> None:
    """Three Services seen together (and one a second later) programmed in one commit: the
    three share one Latency, the fourth has its own; a later change of one gives it a new
    Latency and leaves the others' as they were."""
    lat = ProgrammingLatency(START)
    names = ("web", "api", "db", "late")
    keys = [ServiceKey(namespace="a", name=name) for name in names]
    snap = snapshot(
        [service("a", name, f"172.30.0.{i + 1}") for i, name in enumerate(names)],
        [triggered(name, None, ip=f"10.1.0.{i + 1}") for i, name in enumerate(names)],
    )
    lat.seen(keys[:3], START + timedelta(seconds=1))
    lat.seen(keys[3:], START + timedelta(seconds=2))
    lat.programmed(keys, snap, START + timedelta(seconds=5))
    web, api, db, late = (lat.last[k] for k in keys)
    assert web is api
    assert api is db
    assert (web.seconds, web.since) == (4.0, SEEN)
    assert late is not web
    assert late.seconds == 3.0
    lat.seen(keys[:1], START + timedelta(seconds=10))
    lat.programmed(keys[:1], snap, START + timedelta(seconds=10.5))
    assert lat.last[keys[0]].seconds == 0.5
    assert lat.last[keys[1]] is api
    assert lat.last[keys[2]] is db
    assert (api.seconds, api.at) == (4.0, START + timedelta(seconds=5))
    assert lat.last[keys[3]] is late
