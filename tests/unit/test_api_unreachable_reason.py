"""An API server that does not answer, as ``/healthz`` and the client report it: the reason
reaches ``HealthState`` while an outage lasts and is cleared when the server answers again;
it is shown only while ``/healthz`` fails; the client makes no retries of its own."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from nlproxy.cluster import in_cluster
from nlproxy.cluster.kube import api_client_from_config
from nlproxy.cluster.kube_http import Unreachable
from nlproxy.cluster.kube_link import ApiLink
from nlproxy.serve.health import HealthState, healthz
from tests.unit.test_kube_link import FakeProbe


async def test_an_outage_is_reported_with_its_reason_and_cleared(autojump_clock: object) -> None:
    probe = FakeProbe(down=3)
    told: list[str | None] = []
    reason = in_cluster.unreachable("https://10.96.0.1:443")
    link = ApiLink(probe, rng=random.Random(3), on_down=told.append, unreachable=reason)
    await link.wait_until_back("Service", Unreachable("Service /api/v1/services", "timed out"))
    assert told == [reason, None]  # once when warned of, once when back: not per probe


async def test_without_a_known_cause_the_error_is_the_reason(autojump_clock: object) -> None:
    probe = FakeProbe(down=1)
    told: list[str | None] = []
    link = ApiLink(probe, rng=random.Random(3), on_down=told.append)
    await link.wait_until_back("Node", Unreachable("Node /api/v1/nodes", "refused"))
    assert told[0] is not None
    assert "connection refused" in told[0]
    assert told[1:] == [None]


async def test_a_dropped_connection_answered_at_once_reports_nothing(
    autojump_clock: object,
) -> None:
    told: list[str | None] = []
    link = ApiLink(FakeProbe(down=0), on_down=told.append, unreachable="x")
    await link.wait_until_back("Node", Unreachable("Node /api/v1/nodes", "reset"))
    assert told == []


def test_the_reason_is_shown_while_healthz_fails_only() -> None:
    state = HealthState(grace_seconds=60)
    state.unreachable = in_cluster.unreachable("https://10.96.0.1:443")
    code, body = healthz(state, 0.0)
    assert code == 503
    reason = json.loads(body)["reason"]
    assert "KUBERNETES_SERVICE_HOST" in reason
    assert "api-server key" in reason
    code, body = healthz(state, 0.0, live=True)
    assert code == 200  # not synced yet, not blocked: alive; a restart would not help
    state.synced(1.0)  # synced (through rules left from before): an outage alone is not unhealthy
    code, body = healthz(state, 2.0)
    assert code == 200
    assert "reason" not in json.loads(body)
    state.blocked = "Service: list forbidden (no)"
    state.last_updated = None
    assert json.loads(healthz(state, 2.0)[1])["reason"] == f"{state.blocked}; {state.unreachable}"


def test_requests_make_no_retries_of_their_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    kubeconfig = (
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://192.0.2.1:6443'}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
    )
    path = tmp_path / "kubeconfig"
    path.write_text(kubeconfig)
    client = api_client_from_config(str(path))
    assert client.configuration.retries is False
    assert client.rest_client.pool_manager.connection_pool_kw["retries"].total is False


def test_the_fallback_address_and_its_fix() -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
        mp.setenv("KUBERNETES_SERVICE_PORT", "443")
        assert in_cluster.server() == "https://[fd00::1]:443"
    text = in_cluster.warning("https://10.96.0.1:443")
    assert "NLPROXY_API_SERVER" in text
    assert "docs/migrating.md" in text
