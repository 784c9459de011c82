"""An EndpointSlice whose Service does not exist is named, counted and left out; the rest runs.

Such a slice is almost always a typo in its ``kubernetes.io/service-name`` label. ``run --once``
names it and exits 3 with every valid object programmed; the daemon reports it only when a full
verify still finds it (from the API a slice can briefly precede its Service), and forgets it as
soon as the Service comes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nlproxy.demo.testbed import Testbed
from nlproxy.operate.run import EXIT_INVALID_OBJECTS
from tests.kernel import topo
from tests.kernel.daemon import VIP_A, answered_by, daemon, objects, publish, wait_until

testbed = topo.testbed

TYPO_VIP = "10.96.0.30"
MESSAGE = "EndpointSlice default/web-x7k2p: Service default/wbe not found"


def _typo_slice(tb: Testbed) -> dict[str, Any]:
    ep = topo.endpoint(str(tb.pod("pod-b").ipv4), tb.node.name)
    return topo.endpoint_slice("wbe", [ep], name="web-x7k2p")


def _web(tb: Testbed) -> dict[str, Any]:
    return topo.service("web", TYPO_VIP)


def test_run_once_names_the_orphan_and_programs_the_rest(
    testbed: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topo.write_manifests(
        tmp_path, [*objects(testbed, ["pod-a"]), _web(testbed), _typo_slice(testbed)]
    )
    assert topo.run_once(testbed, tmp_path) == EXIT_INVALID_OBJECTS
    err = capsys.readouterr().err
    assert f"left out: {MESSAGE}" in err
    assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
    # The Service whose slice has the typo has no endpoints: rejected, as upstream.
    pod = testbed.pod("pod-a").netns
    assert topo.results(topo.ask("tcp", pod, TYPO_VIP, 80, n=1)) == {topo.Result.REFUSED}


def test_headless_service_slices_are_not_orphans(
    testbed: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    headless = topo.service("db", "None")
    ep = topo.endpoint(str(testbed.pod("pod-b").ipv4), testbed.node.name)
    topo.write_manifests(
        tmp_path, [*objects(testbed, ["pod-a"]), headless, topo.endpoint_slice("db", [ep])]
    )
    assert topo.run_once(testbed, tmp_path) == 0, capsys.readouterr().err


def test_daemon_reports_an_orphan_at_a_verify_and_forgets_it_when_the_service_comes(
    testbed: Testbed, tmp_path: Path
) -> None:
    cluster = [*objects(testbed, ["pod-a"]), _web(testbed), _typo_slice(testbed)]
    d = publish(tmp_path / "m", cluster)
    with daemon(testbed, d, "--sync-period", "1s") as proc:
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        wait_until(lambda: proc.events("object.invalid"), 5.0, "the orphan reported")
        (event,) = proc.events("object.invalid")
        assert event["error"] == MESSAGE
        assert _invalid(proc) == 1
        # The Service appears (the typo was the Service's name): the slice is no orphan now.
        publish(d, [*cluster, topo.service("wbe", "10.96.0.31")])
        wait_until(lambda: _invalid(proc) == 0, 5.0, "the orphan forgotten")
        assert len(proc.events("object.invalid")) == 1


def _invalid(proc: Any) -> float:
    for line in proc.get(proc.metrics, "/metrics")[1].splitlines():
        if line.startswith("nlproxy_invalid_objects "):
            return float(line.split()[1])
    raise AssertionError("nlproxy_invalid_objects missing from /metrics")
