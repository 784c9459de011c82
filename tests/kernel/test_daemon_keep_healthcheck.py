"""A kept ``externalTrafficPolicy: Local`` Service keeps its health-check node port answering.

A file that does not parse when the daemon starts keeps its Services as programmed
(``sync/keep.py``): their traffic flows. A LoadBalancer sends a Local Service's traffic only to
nodes whose health-check node port answers 200, so a kept Service whose port no longer answers
is cut all the same, by the load balancer: the restarted daemon must answer on that port with
the endpoint count the previous one answered with.

The port outlives the process where the kept objects do: in the tables' health-check record
(``sync/health.py``), which the Syncer writes beside its restart record; the Syncer hands the
kept Services' (port, local endpoint count) to the daemon with each sync.
"""

from __future__ import annotations

from pathlib import Path

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import (
    VIP_A,
    answered_by,
    daemon,
    free_node_port,
    hc_get,
    lb_local,
    local_endpoints,
    objects,
    wait_until,
    write_manifests,
)

testbed = topo.testbed


def test_a_kept_local_service_keeps_its_health_check_port(testbed: Testbed, tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    write_manifests(d / "objects.yaml", objects(testbed, ["pod-a"]))
    broken = d / "lb.yaml"
    port = free_node_port()
    write_manifests(broken, lb_local(testbed, port, ["pod-a", "pod-b"]))
    with daemon(testbed, d) as first:
        wait_until(lambda: hc_get(first, port)[0] == 200, 10.0, "the health check")
        code, body = hc_get(first, port)
        assert code == 200
        assert local_endpoints(body) == 2
        assert first.stop() == 0

    broken.write_text(broken.read_text() + "\n---\nkind: Service\nmetadata: {name: [oops\n")
    with daemon(testbed, d) as second:
        wait_until(lambda: bool(second.events("sync.kept")), 10.0, "the Service kept")
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        wait_until(lambda: hc_get(second, port)[0] != 0, 10.0, "the kept health check")
        code, body = hc_get(second, port)
        assert code == 200, body
        assert local_endpoints(body) == 2

        # Fixed with one local endpoint fewer: the port answers for the file's content.
        write_manifests(broken, lb_local(testbed, port, ["pod-a"]))
        wait_until(
            lambda: local_endpoints(hc_get(second, port)[1] or '{"localEndpoints": -1}') == 1,
            10.0,
            "the fixed file's count",
        )
        assert second.stop() == 0
