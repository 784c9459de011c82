"""SIGTERM ends the daemon promptly on a busy machine, even while a worker thread is in the middle
of a large sync: the stop has a deadline, after which the process ends with its logs flushed
and its rules in place (daemon/run.py).

The machine is made busy by CPU burners (twice as many as CPUs) and the daemon by a cluster of
thousands of Services arriving at once. The bound is generous (a shared machine); the measured
figure is printed (``pytest -s``) for the record.
"""

from __future__ import annotations

import array
import fcntl
import json
import os
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import (
    LOADED_MACHINE_BOUND,
    VIP_A,
    Daemon,
    free_port,
    http_get,
    objects,
    publish,
    put_service,
    scrape,
    wait_until,
)
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import TOKEN, write_kubeconfig

testbed = topo.testbed

SERVICES = 4000
ENDPOINTS = 10
STOP_BOUND = 60.0
"""Seconds from SIGTERM to exit after which the stop counts as hung: a bound for a hang, not a
timing (the deadline is 0.25 s, ``daemon/stop.py``; how long a stop takes is
``bench/bench_shutdown.py``'s figure). What each test asserts is that the process ended itself,
with the stop's status, and said so."""


@pytest.fixture
def burners() -> Iterator[None]:
    """Busy processes, two per CPU, for the test's duration."""
    n = 2 * (os.cpu_count() or 1)
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(max(n, 4))]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=10)


def _big_cluster(tb: Testbed) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for i in range(SERVICES):
        name = f"big-{i}"
        vip = f"10.96.{100 + i // 250}.{i % 250 + 1}"
        eps = [
            topo.endpoint(f"10.200.{i // 250}.{(i % 250) * ENDPOINTS // 10 + j}", "node-x")
            for j in range(ENDPOINTS)
        ]
        items.append(topo.service(name, vip, topo.PORTS))
        items.append(topo.endpoint_slice(name, eps, topo.SLICE_PORTS))
    return {"apiVersion": "v1", "kind": "List", "items": items}


def _pending(d: Daemon) -> float:
    families = scrape(d)
    family = families.get("kubeproxy_sync_proxy_rules_service_changes_pending")
    if family is None:
        return 0.0
    return sum(s.value for s in family.samples)


@pytest.mark.parametrize("moment", ["loading", "syncing"])
def test_sigterm_mid_sync_on_a_busy_machine_exits_promptly(
    testbed: Testbed, tmp_path: Path, burners: None, moment: str
) -> None:
    """``loading``: at once after the file appears (the source parses it, the state takes in
    the burst on the event loop's thread); ``syncing``: once the loop is on it."""
    d = publish(tmp_path / "m", objects(testbed, ["pod-a"]))
    daemon = Daemon(testbed, d)
    try:
        daemon.wait_ready(timeout=60)
        applied = len(daemon.events("sync.applied"))
        tmp = d / ".big.json.tmp"
        tmp.write_text(json.dumps(_big_cluster(testbed)))
        tmp.rename(d / "big.json")
        if moment == "syncing":
            # The source has delivered the big cluster: the loop is planning or committing it.
            wait_until(lambda: _pending(daemon) > 0, 30, "the big cluster is being synced")
        # Whether the big sync had been applied when the signal went (recorded, not asserted:
        # on a quiet machine it may be done already).
        pending = len(daemon.events("sync.applied")) == applied
        start = time.monotonic()
        status = daemon.stop(timeout=STOP_BOUND)
        took = time.monotonic() - start
    finally:
        daemon.kill()
    print(
        f"SIGTERM to exit, {moment} {SERVICES} Services (not yet applied: {pending}), "
        f"machine busy: {took:.2f} s"
    )
    assert status == 0, daemon.lines[-5:]
    assert daemon.events("daemon.stopping")


def _changing(d: Path, testbed: Testbed, stop: threading.Event) -> None:
    """Service a's endpoint moves between two pods every 0.1 s until ``stop``."""
    pods = ("pod-a", "pod-b")
    n = 0
    while not stop.is_set():
        n += 1
        publish(d, objects(testbed, [pods[n % 2]]))
        stop.wait(0.1)


@pytest.mark.parametrize("moment", ["idle", "changing"])
def test_sigterm_after_a_big_sync_on_a_busy_machine_exits(
    testbed: Testbed, tmp_path: Path, burners: None, moment: str
) -> None:
    """Once thousands of Services are programmed, the work after each sync on the trio thread
    (the inspector's index, the state's claims, the metrics) stretches on a busy machine; a
    stop while idle, or while one Service changes every 0.1 s, still ends the process."""
    d = publish(tmp_path / "m", objects(testbed, ["pod-a"]))
    tmp = d / ".big.json.tmp"
    tmp.write_text(json.dumps(_big_cluster(testbed)))
    tmp.rename(d / "big.json")
    daemon = Daemon(testbed, d)
    stop = threading.Event()
    writer = threading.Thread(target=_changing, args=(d, testbed, stop))
    try:
        daemon.wait_ready(timeout=LOADED_MACHINE_BOUND)
        wait_until(lambda: _pending(daemon) == 0, 60, "the big cluster synced")
        if moment == "changing":
            writer.start()
            syncs = len(daemon.events("sync.applied"))
            wait_until(lambda: len(daemon.events("sync.applied")) > syncs + 2, 30, "changes")
        start = time.monotonic()
        status = daemon.stop(timeout=STOP_BOUND)
        took = time.monotonic() - start
    finally:
        stop.set()
        if writer.is_alive():
            writer.join()
        daemon.kill()
    print(f"SIGTERM to exit, {moment} after {SERVICES} Services, machine busy: {took:.2f} s")
    assert status == 0, daemon.lines[-5:]
    assert daemon.events("daemon.stopping")


@pytest.mark.parametrize("api_up", [True, False], ids=["api-up", "api-gone"])
def test_sigterm_on_the_api_source_on_a_busy_machine_exits_promptly(
    testbed: Testbed, tmp_path: Path, burners: None, api_up: bool
) -> None:
    """The API source's watch threads (and, with the API gone, its reconnecting client) do not
    hold a stop."""
    api = ApiServer(token=TOKEN)
    api.start()
    try:
        api.store.put("nodes", testbed.node_manifest())
        put_service(api, testbed, "a", VIP_A, ["pod-a"])
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api)
        daemon = Daemon(testbed, None, "--kubeconfig", str(kubeconfig))
        try:
            daemon.wait_ready(timeout=60)
            if not api_up:
                api.stop()
                wait_until(lambda: daemon.get(daemon.healthz, "/livez")[0] == 200, 5, "alive")
            start = time.monotonic()
            status = daemon.stop(timeout=STOP_BOUND)
            took = time.monotonic() - start
        finally:
            daemon.kill()
    finally:
        api.stop()
    print(f"SIGTERM to exit, API source ({'up' if api_up else 'gone'}), machine busy: {took:.2f} s")
    assert status == 0, daemon.lines[-5:]


def _invalid_services(n: int) -> list[dict[str, Any]]:
    """``n`` Services the daemon refuses, each named in a warning line of its own."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": f"bad-{i}", "namespace": "default"},
            "spec": {"clusterIP": "10.96.250.1", "ports": [{"port": 70000, "protocol": "TCP"}]},
        }
        for i in range(n)
    ]


def test_sigterm_with_stderr_stalled_on_a_busy_machine_exits(
    testbed: Testbed, tmp_path: Path, burners: None
) -> None:
    """stderr is a pipe no one reads (a stalled log collector) and full: the event loop blocks
    writing a log line, and so does the stop's own line; the stop still ends the process, with
    the status of a SIGTERM."""
    d = publish(tmp_path / "m", objects(testbed, ["pod-a"]))
    healthz = free_port()
    r, w = os.pipe()
    argv = [
        sys.executable, "-m", "nlproxy", "--netns", testbed.node.netns, "--log-format", "json",
        "run", "--manifests", str(d), *testbed.run_args(), "--min-sync-period", "50ms",
        "--healthz-bind-address", f"127.0.0.1:{healthz}", "--metrics-bind-address", "",
    ]  # fmt: skip
    try:
        with subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=w) as proc:
            os.close(w)
            w = -1
            try:
                wait_until(lambda: _ok(testbed, healthz), LOADED_MACHINE_BOUND, "ready")
                # A line per refused Service: far more than the pipe holds.
                publish(d, [*objects(testbed, ["pod-a"]), *_invalid_services(2000)])
                wait_until(lambda: _queued(r) >= 60_000, 60, "stderr's pipe full")
                proc.send_signal(signal.SIGTERM)
                status = proc.wait(timeout=60)  # generous: the machine is busy
            finally:
                proc.kill()
    finally:
        os.close(r)
        if w != -1:
            os.close(w)
    assert status == 0


def _ok(testbed: Testbed, port: int) -> bool:
    try:
        return http_get(testbed.node.netns, port, "/healthz")[0] == 200
    except OSError:  # not listening yet
        return False


def _queued(fd: int) -> int:
    """Bytes waiting in the pipe whose read end is ``fd``."""
    buf = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, buf)
    return buf[0]
