"""Health semantics (kube-proxy's): healthy after a first sync while nothing waits too long."""

import json

from nlproxy.serve.health import HealthState, healthz, service_health


def test_unhealthy_until_first_sync() -> None:
    h = HealthState(grace_seconds=60)
    assert healthz(h, 0.0)[0] == 503
    h.synced(1.0)
    code, body = healthz(h, 1.0)
    assert code == 200
    assert set(json.loads(body)) == {"lastUpdated", "currentTime", "nodeEligible"}


def test_pending_change_older_than_grace_is_unhealthy() -> None:
    h = HealthState(grace_seconds=60)
    h.synced(0.0)
    h.queued(10.0)
    assert h.healthy(70.0)
    assert not h.healthy(70.5)
    h.synced(71.0)
    assert h.healthy(200.0)


def test_service_health_body_and_status() -> None:
    code, body = service_health("default", "web", 2)
    assert code == 200
    assert json.loads(body) == {
        "service": {"namespace": "default", "name": "web"},
        "localEndpoints": 2,
        "serviceProxyHealthy": True,
    }
    assert service_health("default", "web", 0)[0] == 503


def test_livez_is_alive_while_starting_but_healthz_is_not_ready() -> None:
    from nlproxy.serve.health import HealthState, healthz

    state = HealthState(grace_seconds=120)
    assert healthz(state, 0.0)[0] == 503
    assert healthz(state, 0.0, live=True)[0] == 200
    state.blocked = "EndpointSlice: list forbidden"
    assert healthz(state, 0.0, live=True)[0] == 503
    state.blocked = ""
    state.synced(1.0)
    assert healthz(state, 2.0)[0] == healthz(state, 2.0, live=True)[0] == 200
