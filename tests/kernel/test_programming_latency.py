"""kubeproxy_network_programming_duration_seconds counts each slice change once, when it is
programmed, as upstream: not the initial list's old trigger times, not a Service-only edit, not
a re-sync of unchanged slices."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from nlproxy.cli import main
from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import VIP_A, answered_by, daemon, publish, wait_until

testbed = topo.testbed
TRIGGER = "endpoints.kubernetes.io/last-change-trigger-time"


def _cluster(tb: Testbed, pods: list[str], trigger: datetime, port: int = 80) -> list[Any]:
    eps = [topo.endpoint(str(tb.pod(p).ipv4), tb.node.name) for p in pods]
    eps_slice = topo.endpoint_slice("a", eps)
    eps_slice["metadata"]["annotations"] = {TRIGGER: trigger.strftime("%Y-%m-%dT%H:%M:%SZ")}
    svc = topo.service("a", VIP_A, [{"name": "tcp", "port": port, "targetPort": 8080}])
    return [tb.node_manifest(), svc, eps_slice]


def _count(proc: Any) -> float:
    for line in proc.get(proc.metrics, "/metrics")[1].splitlines():
        if line.startswith("kubeproxy_network_programming_duration_seconds_count"):
            return float(line.split()[1])
    raise AssertionError("the programming latency histogram is missing")


def test_each_slice_change_is_observed_once(testbed: Testbed, tmp_path: Path) -> None:
    old = datetime.now(UTC) - timedelta(hours=2)
    d = publish(tmp_path / "m", _cluster(testbed, ["pod-a"], old))
    with daemon(testbed, d) as proc:
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        assert _count(proc) == 0, "the initial list's trigger time predates this process"
        changed = datetime.now(UTC).replace(microsecond=0)
        publish(d, _cluster(testbed, ["pod-b"], changed))
        wait_until(lambda: _count(proc) == 1, 5.0, "the endpoint change observed")
        # A Service-only edit re-plans the service; its slice (and trigger time) did not change.
        publish(d, _cluster(testbed, ["pod-b"], changed, port=81))
        wait_until(lambda: proc.events("sync.applied")[-1].get("ops", 0) > 0, 5.0, "port edit")
        publish(d, _cluster(testbed, ["pod-b"], changed, port=80))
        wait_until(lambda: answered_by(testbed, VIP_A, 3) == {"pod-b"}, 5.0, "port back")
        assert _count(proc) == 1


def _series(proc: Any) -> dict[str, float]:
    """The opt-in nlproxy_service_programming_latency_seconds, by service."""
    out = {}
    for line in proc.get(proc.metrics, "/metrics")[1].splitlines():
        if line.startswith("nlproxy_service_programming_latency_seconds{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('service="', 1)[1].split('"', 1)[0]] = float(value)
    return out


def test_each_services_last_latency_is_shown(
    testbed: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = datetime.now(UTC) - timedelta(hours=2)
    d = publish(tmp_path / "m", _cluster(testbed, ["pod-a"], old))
    with daemon(testbed, d, "--programming-latency-services", "1") as proc:
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        # The initial list's trigger time predates the process: measured from when it was seen.
        first = json.loads(proc.get(proc.metrics, "/programming")[1])["services"]
        assert first["default/a"]["since"] == "seen"
        changed = datetime.now(UTC).replace(microsecond=0)
        publish(d, _cluster(testbed, ["pod-b"], changed))

        def from_trigger() -> bool:
            body = json.loads(proc.get(proc.metrics, "/programming")[1])
            return bool(body["services"]["default/a"]["since"] == "trigger")

        wait_until(from_trigger, 5.0, "the change measured from its trigger time")
        assert list(_series(proc)) == ["default/a"]
        metrics = f"127.0.0.1:{proc.metrics}"
        capsys.readouterr()
        assert (
            main(
                [
                    "--netns",
                    proc.netns,
                    "status",
                    "--json",
                    "--metrics-address",
                    metrics,
                    "--healthz-address",
                    f"127.0.0.1:{proc.healthz}",
                ]
            )
            == 0
        )
        status = json.loads(capsys.readouterr().out)
        assert [p["service"] for p in status["programming"]] == ["default/a"]
        assert status["programming"][0]["since"] == "trigger"
        main(["--netns", proc.netns, "explain", "default/a", "--metrics-address", metrics])
        text = capsys.readouterr().out
        assert "its last change was committed" in text
        assert "after its EndpointSlice's trigger time" in text
    # No daemon: explain says it could not ask, and still explains.
    main(["--netns", testbed.node.netns, "explain", "default/a", "--metrics-address", metrics])
    assert "unknown: no daemon answered /programming" in capsys.readouterr().out
