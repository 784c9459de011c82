"""A log line that cannot be written never ends the proxy.

stderr is ``/dev/full`` here (every write fails with ENOSPC, as with a full disk behind a
redirection; journald gone or a closed pipe fail the same way). Before, the first log line killed
the daemon and made ``run --once`` exit 1 after it had applied the rules.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import (
    VIP_A,
    answered_by,
    free_port,
    http_get,
    objects,
    publish,
    wait_until,
)

testbed = topo.testbed


def _bad_service() -> dict[str, object]:
    return topo.service("bad", "10.96.0.99", ({"name": "tcp", "port": 70000},))


def test_run_once_applies_and_exits_as_usual_with_stderr_failing(
    testbed: Testbed, tmp_path: Path
) -> None:
    d = topo.write_manifests(tmp_path / "m", [*objects(testbed, ["pod-a"]), _bad_service()])
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "nlproxy", "--netns", testbed.node.netns, "run",
             "--manifests", str(d), "--node-name", testbed.node.name,
             "--cluster-cidr", testbed.cluster_cidr(), "--once"],
            stderr=full, stdout=subprocess.DEVNULL, timeout=60, check=False,
        )  # fmt: skip
    assert proc.returncode == 3  # applied, one object left out: as with a working stderr
    assert answered_by(testbed, VIP_A, 3) == {"pod-a"}


def test_the_daemon_serves_and_syncs_with_stderr_failing(testbed: Testbed, tmp_path: Path) -> None:
    d = publish(tmp_path / "m", objects(testbed, ["pod-a"]))
    healthz = free_port()
    with open("/dev/full", "w") as full:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nlproxy", "--netns", testbed.node.netns,
             "--log-format", "json", "run", "--manifests", str(d),
             "--node-name", testbed.node.name, "--cluster-cidr", testbed.cluster_cidr(),
             "--min-sync-period", "50ms", "--healthz-bind-address", f"127.0.0.1:{healthz}",
             "--metrics-bind-address", ""],
            stderr=full, stdout=subprocess.DEVNULL,
        )  # fmt: skip
    try:

        def ready() -> bool:
            assert proc.poll() is None, f"the daemon exited {proc.returncode}"
            try:
                return http_get(testbed.node.netns, healthz, "/healthz")[0] == 200
            except OSError:
                return False

        wait_until(ready, 20, "the daemon ready")
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        publish(d, [*objects(testbed, ["pod-b"]), _bad_service()])  # logs a warning too
        wait_until(lambda: answered_by(testbed, VIP_A, 3) == {"pod-b"}, 5, "the change")
        time.sleep(0.5)
        assert proc.poll() is None
        assert ready()
    finally:
        proc.kill()
        proc.wait(timeout=10)
