"""The daemon on the real kernel: manifests in, rules out, drift repaired, restarts lossless.

Each test runs ``nlproxy run`` as a child process programming the node namespace of a test bed,
and probes services with real TCP connections from a pod and from the outside client.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nlproxy.demo.echo import Result, tcp_request
from nlproxy.demo.testbed import Testbed
from nlproxy.netlink import netns
from tests.kernel import topo
from tests.kernel.daemon import (
    LOADED_MACHINE_BOUND,
    VIP_A,
    VIP_B,
    Daemon,
    Probe,
    answered_by,
    daemon,
    free_node_port,
    hc_get,
    lb_local,
    nft,
    objects,
    publish,
    wait_until,
)

testbed = topo.testbed


def test_manifest_changes_take_effect(testbed: Testbed, tmp_path: Path) -> None:
    """How soon is bench_daemon's to measure; here, that each change takes effect."""
    d = publish(tmp_path / "m", objects(testbed, ["pod-a", "pod-b"]))
    with daemon(testbed, d):
        assert answered_by(testbed, VIP_A) == {"pod-a", "pod-b"}
        publish(d, objects(testbed, ["pod-b"]))
        wait_until(lambda: answered_by(testbed, VIP_A, 6) == {"pod-b"}, 1.0, "removal")
        (d / "99-extra.yaml").write_text("")  # an unrelated file: no harm
        publish(d, objects(testbed, ["pod-a", "pod-b"])[:3])  # service b removed
        wait_until(
            lambda: (
                tcp_request(testbed.pod("pod-a").netns, VIP_B, 80).result is not Result.ANSWERED
            ),
            1.0,
            "service b removed",
        )


def _ip_table(tb: Testbed) -> str:
    """``ip nlproxy`` as nft lists it, empty while it does not exist."""
    return subprocess.run(
        ["ip", "netns", "exec", tb.node.netns, "nft", "list", "table", "ip", "nlproxy"],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip


def test_drift_is_repaired_and_counted(testbed: Testbed, tmp_path: Path) -> None:
    d = publish(tmp_path / "m", objects(testbed, ["pod-a"]))
    with daemon(testbed, d) as proc:
        nft(testbed, "delete", "table", "ip", "nlproxy")
        # Bounds here are loose (a loaded machine); the repair time is measured in bench/.
        wait_until(
            # The ip table itself: ip6 nlproxy was never deleted and has the same names.
            lambda: "service-ips" in _ip_table(testbed),
            5.0,
            "table repaired after nft delete table",
        )
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        # The kernel names a transaction's writer only to members of NFNLGRP_NFTABLES, which
        # the daemon is not (docs/ruleset.md): the drift is known by its generations.
        drifts = [e for e in proc.events("drift.notifications_lost") if not e["own"]]
        assert drifts
        nft(testbed, "flush", "ruleset")
        wait_until(lambda: answered_by(testbed, VIP_A, 2) == {"pod-a"}, 5.0, "after flush ruleset")
        status, body = proc.get(proc.metrics, "/metrics")
        assert status == 200
        assert 'nlproxy_drift_repairs_total{writer="(notifications lost)"}' in body


def test_health_and_metrics_content(testbed: Testbed, tmp_path: Path) -> None:
    d = publish(tmp_path / "m", objects(testbed, ["pod-a"]))
    with daemon(testbed, d) as proc:
        status, body = proc.get(proc.healthz, "/healthz")
        assert status == 200
        assert set(json.loads(body)) >= {"lastUpdated", "currentTime"}
        assert proc.get(proc.healthz, "/livez")[0] == 200
        status, metrics = proc.get(proc.metrics, "/metrics")
        assert status == 200
        for name in (
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "kubeproxy_network_programming_duration_seconds_bucket",
            "kubeproxy_sync_proxy_rules_service_changes_total 2.0",  # services a and b
            "kubeproxy_sync_proxy_rules_endpoint_changes_total 2.0",  # their two slices
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending 0.0",
            "kubeproxy_conntrack_reconciler_deleted_entries_total",
            'nlproxy_kernel_operations_total{family="ip"}',
        ):
            assert name in metrics, name
        assert proc.get(proc.healthz, "/nope")[0] == 404


def test_endpoint_churn_never_breaks_stable_services(testbed: Testbed, tmp_path: Path) -> None:
    d = publish(tmp_path / "m", objects(testbed, ["pod-a"]))
    with (
        daemon(testbed, d) as proc,
        Probe(testbed, VIP_B) as probe_b,
        Probe(testbed, VIP_A) as probe_a,
    ):
        for i in range(100):
            extra = ["pod-b"] if i % 2 else ["pod-b", "pod-r"] if i % 3 else []
            publish(d, objects(testbed, ["pod-a", *extra]))
            time.sleep(0.03)
        time.sleep(0.5)
        assert proc.proc.poll() is None
    assert probe_b.ok > 20
    assert probe_b.failures == []
    assert probe_a.ok > 20
    assert probe_a.failures == []  # pod-a stayed an endpoint of service a throughout


def test_restart_loses_no_probe_and_sends_no_operations(testbed: Testbed, tmp_path: Path) -> None:
    d = publish(tmp_path / "m", objects(testbed, ["pod-a", "pod-b"]))
    first = Daemon(testbed, d)
    try:
        first.wait_ready()
        with Probe(testbed, VIP_A) as probe:
            time.sleep(0.3)
            assert first.stop() == 0
            assert "service-ips" in nft(testbed, "list", "ruleset")  # SIGTERM leaves the rules
            with daemon(testbed, d) as second:
                time.sleep(0.3)
                applied = second.events("sync.applied")
                trusted = second.events("sync.restart_trusted")
                # The restart's first sync planned nothing (the records vouched for the
                # tables); the plan made after it takes the next change in place.
                publish(d, objects(testbed, ["pod-b"]))
                wait_until(
                    lambda: answered_by(testbed, VIP_A, 4) == {"pod-b"}, 60.0, "after the restart"
                )
        assert probe.failures == []
        assert probe.ok > 5
        assert applied
        assert applied[0]["ops"] == 0
        assert trusted  # the tables' records vouched for them: nothing was read back
        assert trusted[0]["planned"] is False
    finally:
        first.kill()


def test_bad_config_exits_2_naming_the_field(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
        "nftables:\n  minSyncPeriod: often\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nlproxy",
            "run",
            "--config",
            str(cfg),
            "--manifests",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "NOTIFY_SOCKET": ""},
    )
    assert proc.returncode == 2
    assert "nftables.minSyncPeriod: 'often' is not a duration" in proc.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signals_stop_promptly_and_keep_rules(
    testbed: Testbed, tmp_path: Path, signum: int
) -> None:
    d = publish(tmp_path / "m", objects(testbed, ["pod-a"]))
    proc = Daemon(testbed, d)
    try:
        proc.wait_ready()
        proc.proc.send_signal(signum)
        # How promptly is test_daemon_stop's (under CPU burners); here: it ends, cleanly.
        assert proc.proc.wait(timeout=LOADED_MACHINE_BOUND) == 0
        assert answered_by(testbed, VIP_A, 2) == {"pod-a"}
    finally:
        proc.kill()


def test_health_check_node_port_answers_for_local_endpoints(
    testbed: Testbed, tmp_path: Path
) -> None:
    hc = free_node_port()
    d = publish(tmp_path / "m", [*objects(testbed, ["pod-a"]), *lb_local(testbed, hc, ["pod-a"])])
    with daemon(testbed, d) as proc:
        wait_until(lambda: hc_get(proc, hc)[0] == 200, 2.0, "health-check port serving")
        # Probed as a load balancer does: from outside, at the node's address.
        with netns.entered(testbed.client.netns):
            conn = http.client.HTTPConnection(str(testbed.node.ipv4), hc, timeout=2)
            conn.connect()
        with contextlib.closing(conn):
            conn.request("GET", "/")
            r = conn.getresponse()
            assert r.headers["X-Load-Balancing-Endpoint-Weight"] == "1"
            assert json.loads(r.read()) == {
                "service": {"namespace": "default", "name": "lb"},
                "localEndpoints": 1,
                "serviceProxyHealthy": True,
            }
        # Only a remote endpoint left: this node must fail the load balancer's probe.
        publish(d, [*objects(testbed, ["pod-a"]), *lb_local(testbed, hc, ["pod-r"])])
        wait_until(lambda: hc_get(proc, hc)[0] == 503, 2.0, "503 without local endpoints")
        # Service gone: the port closes.
        publish(d, objects(testbed, ["pod-a"]))
        wait_until(lambda: hc_get(proc, hc)[0] == 0, 2.0, "health-check port closed")


def link(tb: Testbed, pod: str, state: str) -> None:
    subprocess.run(
        ["ip", "-n", tb.node.netns, "link", "set", tb.pod(pod).host_veth, state], check=True
    )


def test_unreachable_endpoint_is_reported_and_optionally_excluded(
    testbed: Testbed, tmp_path: Path
) -> None:
    d = publish(tmp_path / "m", objects(testbed, ["pod-a", "pod-b"]))
    with daemon(testbed, d, "--exclude-unreachable-endpoints") as proc:
        assert answered_by(testbed, VIP_A) == {"pod-a", "pod-b"}
        link(testbed, "pod-a", "down")
        pod_a = str(testbed.pod("pod-a").ipv4)

        def gauge_has_pod_a() -> bool:
            body = proc.get(proc.metrics, "/metrics")[1]
            return any(
                line.startswith("nlproxy_endpoint_unreachable{")
                and f'endpoint="{pod_a}"' in line
                and 'service="default/a:tcp/TCP"' in line
                for line in body.splitlines()
            )

        wait_until(gauge_has_pod_a, 5.0, "unreachable gauge for pod-a")
        wait_until(
            lambda: any(
                e["endpoint"] == pod_a and e["reachable"] is False
                for e in proc.events("endpoint.reachability")
            ),
            5.0,
            "a log line for pod-a's transition",
        )
        # Excluded from load balancing: new connections from pod-c all land on pod-b.
        wait_until(
            lambda: answered_by_from(testbed, "pod-c", VIP_A, 8) == {"pod-b"},
            10.0,
            "pod-a excluded",
        )
        link(testbed, "pod-a", "up")
        wait_until(
            lambda: answered_by_from(testbed, "pod-c", VIP_A, 16) == {"pod-a", "pod-b"},
            10.0,
            "pod-a back in load balancing",
        )


def answered_by_from(tb: Testbed, pod: str, vip: str, n: int) -> set[str]:
    out = set()
    for _ in range(n):
        r = tcp_request(tb.pod(pod).netns, vip, 80, timeout=0.5)
        out.add(r.pod if r.result is Result.ANSWERED else str(r.result))
    return out
