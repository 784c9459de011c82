"""nlproxy as a systemd service in the node VMs: readiness, JSON logs, user and capabilities,
health and metrics endpoints."""

from __future__ import annotations

import cluster
import pytest
from conftest import Vms

NODES = [n.name for n in cluster.nodes()]
# CAP_NET_ADMIN is 12, CAP_NET_RAW is 13: the unit grants these two and nothing else.
TWO_CAPS = f"{(1 << 12) | (1 << 13):016x}"


@pytest.mark.parametrize("node", NODES)
def test_unit_is_active_after_notify_readiness(vms: Vms, node: str) -> None:
    props = dict(
        line.split("=", 1)
        for line in vms.out(
            node, "systemctl show -p Type -p ActiveState -p SubState -p NRestarts nlproxy"
        ).splitlines()
    )
    # A Type=notify unit is "active (running)" only after the service sent READY=1.
    assert props == {
        "Type": "notify",
        "ActiveState": "active",
        "SubState": "running",
        "NRestarts": "0",
    }


@pytest.mark.parametrize("node", NODES)
def test_journal_lines_are_json_events(vms: Vms, node: str) -> None:
    lines = vms.journal(node)
    assert lines, f"{node}: nlproxy wrote nothing to the journal"
    assert all("event" in line and "level" in line for line in lines), lines
    events = {line["event"] for line in lines}
    assert {"sync.applied", "daemon.ready"} <= events, events


@pytest.mark.parametrize("node", NODES)
def test_runs_as_nlproxy_with_only_net_admin_and_net_raw(vms: Vms, node: str) -> None:
    pid = vms.main_pid(node)
    status = dict(
        line.split(":", 1) for line in vms.out(node, f"cat /proc/{pid}/status").splitlines()
    )
    uid = vms.out(node, "id -u nlproxy")
    assert status["Uid"].split() == [uid] * 4
    for field in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
        assert status[field].strip() == TWO_CAPS, f"{node}: {field} {status[field].strip()}"
    assert vms.out(node, f"ps -o user= -p {pid}") == "nlproxy"


@pytest.mark.parametrize("node", cluster.nodes(), ids=NODES)
def test_healthz_from_the_client_and_metrics_on_loopback_only(vms: Vms, node: cluster.Node) -> None:
    [health] = vms.probe("client", "http", f"http://{node.ip}:10256/healthz")
    assert health["status"] == 200, health
    [metrics] = vms.probe(node.name, "http", "http://127.0.0.1:10249/metrics")
    assert metrics["status"] == 200, metrics
    assert "kubeproxy_sync_proxy_rules" in metrics["body"]
    [outside] = vms.probe("client", "http", f"http://{node.ip}:10249/metrics")
    assert outside["status"] == 0, f"metrics reachable from outside {node.name}: {outside}"
