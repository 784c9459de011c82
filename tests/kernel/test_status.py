"""``nlproxy status`` against a real daemon running inside a node namespace.

The daemon is started with ``nlproxy --netns NODE run`` (its health and metrics ports, kube-proxy's
defaults, listen inside the namespace where it programs, where no other test's ports can
collide) on a manifests
directory holding two services and one invalid object. ``nlproxy --netns NODE status`` must
report it up and ready, its sync, the invalid object, a drift repair after ``nft`` deletes the
table, an endpoint made unreachable by taking its veth down, and exit 1 (without a traceback)
once the daemon is gone.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nlproxy.cli import main
from nlproxy.demo.testbed import Testbed
from nlproxy.log import configure
from tests.kernel import topo
from tests.kernel.daemon import publish

testbed = topo.testbed


@pytest.fixture(autouse=True)
def _log_to_this_tests_stderr() -> None:
    """``cli.main`` binds structlog to the stderr of the test that called it; rebind it here."""
    configure(level="warning")


def _objects(tb: Testbed) -> list[dict[str, Any]]:
    ep = lambda name: topo.endpoint(str(tb.pod(name).ipv4), tb.node.name)  # noqa: E731
    bad = topo.service("bad", "10.96.0.12", ports=({"name": "tcp", "port": 70000},))
    return [
        tb.node_manifest(),
        topo.service("a", "10.96.0.10"),
        topo.endpoint_slice("a", [ep("pod-a"), ep("pod-b")]),
        topo.service("c", "10.96.0.11"),
        topo.endpoint_slice("c", [ep("pod-c")]),
        bad,
    ]


@contextlib.contextmanager
def daemon_in(tb: Testbed, manifests: Path) -> Iterator[subprocess.Popen[str]]:
    """``nlproxy --netns NODE run`` on the default ports (served in the node namespace)."""
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "nlproxy", "--netns", tb.node.netns),
            *("--log-format", "json", "run"),
            *("--manifests", str(manifests), "--node-name", tb.node.name),
            *("--cluster-cidr", tb.cluster_cidr(), "--service-cidr", tb.service_cidr()),
            *("--min-sync-period", "50ms"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def status(
    capsys: pytest.CaptureFixture[str], netns: str, *extra: str
) -> tuple[int, dict[str, Any]]:
    code = main(["--netns", netns, "status", "--json", "--timeout", "2", *extra])
    return code, json.loads(capsys.readouterr().out)


def until(
    capsys: pytest.CaptureFixture[str],
    netns: str,
    check: Callable[[dict[str, Any]], bool],
    what: str,
    timeout: float = 20,
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        code, got = status(capsys, netns)
        if code == 0 and check(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s; last status {code}: {got}")
        time.sleep(0.1)


def test_status_of_a_running_daemon(
    testbed: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = testbed.node.netns
    manifests = publish(tmp_path / "m", _objects(testbed))
    with daemon_in(testbed, manifests) as proc:
        started = time.time()
        got = until(capsys, ns, lambda s: s["ready"], "daemon ready")
        assert got["up"] is True
        assert got["problem"] is None
        assert got["healthz"]["code"] == 200
        assert got["healthz"]["address"] == "127.0.0.1:10256"
        assert got["metrics"]["address"] == "127.0.0.1:10249"
        assert got["healthz"]["body"]["lastUpdated"]
        assert got["syncs"] >= 1
        assert got["sync_duration_mean_seconds"] > 0
        last = got["last_sync"]
        assert last is not None
        assert started - 5 < _epoch(last) < time.time() + 1
        assert got["pending_changes"] == {"services": 0, "endpoints": 0}
        assert got["invalid_objects"] == 1  # Service default/bad: port 70000
        assert got["rejected_services"] == 0
        assert got["unreachable_endpoints"] == 0
        assert got["drift_repairs"] == {}
        assert got["nodeport_addresses_missing"] == []

        topo.sh(ns, "nft", "delete", "table", "ip", "nlproxy")
        got = until(capsys, ns, lambda s: bool(s["drift_repairs"]), "drift repair counted")
        assert got["drift_repairs"] == {"(notifications lost)": 1}  # writer unknown

        topo.sh(ns, "ip", "link", "set", testbed.pod("pod-c").host_veth, "down")
        got = until(capsys, ns, lambda s: s["unreachable_endpoints"] == 1, "unreachable seen")
        (row,) = got["unreachable"]
        assert row["service"] == "default/c:tcp/TCP"
        assert row["endpoint"].startswith(str(testbed.pod("pod-c").ipv4))

        assert main(["--netns", ns, "status"]) == 0
        text = capsys.readouterr().out
        assert "ready" in text
        assert "invalid objects        1" in text
        assert "drift repairs          1 ((notifications lost): 1)" in text
        assert f"default/c:tcp/TCP  {row['endpoint']}" in text

        proc.terminate()
        assert proc.wait(timeout=15) == 0
    code, got = status(capsys, ns)
    assert code == 1
    assert got["up"] is False
    assert got["problem"].startswith("not reachable")
    assert "Connection refused" in got["metrics"]["error"]


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


def _cli(*argv: str, stdout: int | None = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nlproxy", *argv],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=30,
        check=False,
    )


def test_nothing_listening_is_exit_1_without_traceback(
    make_netns: Callable[[str], str],
) -> None:
    ns = make_netns("stdown")
    proc = _cli("--netns", ns, "status")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("nlproxy is not reachable")
    assert "--healthz-address 127.0.0.1:10256/healthz: Connection refused" in proc.stdout


def test_missing_namespace_is_exit_2_naming_it() -> None:
    proc = _cli("--netns", "nlp-no-such-namespace", "status")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        "nlproxy: netns nlp-no-such-namespace: cannot open "
        "/var/run/netns/nlp-no-such-namespace: No such file or directory"
    )


def test_closed_stdout_ends_without_traceback(make_netns: Callable[[str], str]) -> None:
    ns = make_netns("stpipe")
    proc = subprocess.Popen(
        [sys.executable, "-m", "nlproxy", "--netns", ns, "status"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    proc.stdout.close()  # the reader went away before anything was written
    _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err
