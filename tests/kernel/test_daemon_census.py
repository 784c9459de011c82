"""The daemon's heap census (``nlproxy/daemon/census.py``) as the benchmarks use it: written
after the first sync, and again on SIGUSR1, which then neither stops the daemon nor its
rules."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import VIP_A, answered_by, daemon, objects, publish, wait_until

testbed = topo.testbed


def test_census_after_the_first_sync_and_on_sigusr1(
    testbed: Testbed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = tmp_path / "census"
    monkeypatch.setenv("NLPROXY_CENSUS", str(prefix))
    monkeypatch.setenv("NLPROXY_CENSUS_FRAMES", "2")
    manifests = publish(tmp_path / "m", objects(testbed, ["pod-a"]))
    with daemon(testbed, manifests) as proc:
        first = Path(f"{prefix}.first_sync.json")
        wait_until(first.exists, 10, "the census after the first sync")
        wait_until(lambda: proc.events("daemon.census"), 10, "its log line")
        data = json.loads(first.read_text())
        assert data["status_kb"]["VmRSS"] > 0
        assert data["traced_mb"] > 0
        assert any("nlproxy" in f for f, _ in data["by_file"])
        proc.proc.send_signal(signal.SIGUSR1)
        again = Path(f"{prefix}.1.json")
        wait_until(again.exists, 10, "the census on SIGUSR1")
        wait_until(lambda: len(proc.events("daemon.census")) == 2, 10, "its log line")
        assert json.loads(again.read_text())["gc_objects"] > 0
        assert proc.proc.poll() is None
        assert answered_by(testbed, VIP_A, 4) == {"pod-a"}


def test_a_census_that_cannot_be_written_is_logged_and_the_daemon_goes_on(
    testbed: Testbed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NLPROXY_CENSUS", str(tmp_path / "no-such-dir" / "census"))
    monkeypatch.setenv("NLPROXY_CENSUS_FRAMES", "lots")  # not a number: one frame
    manifests = publish(tmp_path / "m", objects(testbed, ["pod-a"]))
    with daemon(testbed, manifests) as proc:
        wait_until(lambda: proc.events("daemon.census_failed"), 10, "the failed census logged")
        (failed,) = proc.events("daemon.census_failed")
        assert failed["name"] == "first_sync"
        assert "no-such-dir" in failed["error"]
        proc.proc.send_signal(signal.SIGUSR1)
        wait_until(lambda: len(proc.events("daemon.census_failed")) == 2, 10, "on SIGUSR1 too")
        assert proc.proc.poll() is None
        assert answered_by(testbed, VIP_A, 4) == {"pod-a"}
