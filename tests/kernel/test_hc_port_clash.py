"""A Service whose ``healthCheckNodePort`` is a port the daemon already serves on.

The API server would not allocate it, but manifests (and a hand-written Service) can name any port.
The daemon must not die of EADDRINUSE (every restart would die the same way while the rules stay
frozen): that one health check is reported by name and tried again; /healthz, the other Services
and later changes go on.
"""

from __future__ import annotations

from pathlib import Path

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import (
    VIP_A,
    Daemon,
    answered_by,
    free_node_port,
    hc_get,
    lb_local,
    objects,
    publish,
    wait_until,
)

testbed = topo.testbed


def test_health_check_port_equal_to_healthz_port_is_named_and_the_daemon_serves_on(
    testbed: Testbed, tmp_path: Path
) -> None:
    port = free_node_port()
    d = publish(tmp_path / "m", [*objects(testbed, ["pod-a"]), *lb_local(testbed, port, ["pod-a"])])
    proc = Daemon(testbed, d, "--healthz-bind-address", f"0.0.0.0:{port}")
    proc.healthz = port  # the flag given last wins
    try:
        proc.wait_ready()
        wait_until(lambda: proc.events("healthcheck.bind_failed"), 5, "the bind failure")
        (failed,) = proc.events("healthcheck.bind_failed")
        assert failed["port"] == port
        assert failed["service"] == "default/lb"
        assert "in use" in failed["error"]
        assert proc.proc.poll() is None
        code, body = proc.get(port, "/healthz")  # still nlproxy's /healthz on that port
        assert code == 200
        assert "lastUpdated" in body
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        # Later changes are still programmed.
        publish(d, [*objects(testbed, ["pod-b"]), *lb_local(testbed, port, ["pod-a"])])
        wait_until(lambda: answered_by(testbed, VIP_A, 3) == {"pod-b"}, 5, "the change")
        # The Service moves to a free port: its health check answers there.
        hc = free_node_port()
        publish(d, [*objects(testbed, ["pod-b"]), *lb_local(testbed, hc, ["pod-a"])])
        wait_until(lambda: hc_get(proc, hc)[0] == 200, 5, "the health check on its new port")
        assert proc.proc.poll() is None
    finally:
        proc.kill()
