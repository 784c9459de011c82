"""ClientIP session affinity and conntrack: a removed endpoint's UDP flows go, as for any port.

An affinity port's endpoints live in chains of their own (``affinity.py``), not in the backends
maps the cleanup read, so a UDP socket kept talking to a removed endpoint (kube-proxy deletes
those flows). Both paths: ``run --once`` (full) and the daemon's in-place updates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nlproxy.demo.echo import Result, UdpSession
from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import daemon, publish, wait_until

testbed = topo.testbed

VIP = "10.96.0.50"
PORTS = ({"name": "udp", "port": 53, "targetPort": 8080, "protocol": "UDP"},)
SLICE_PORTS = ({"name": "udp", "port": 8080, "protocol": "UDP"},)


def objects(tb: Testbed, pods: list[str]) -> list[dict[str, Any]]:
    svc = topo.service("u", VIP, PORTS, sessionAffinity="ClientIP")
    eps = [topo.endpoint(str(tb.pod(p).ipv4), tb.pod(p).node) for p in pods]
    return [tb.node_manifest(), svc, topo.endpoint_slice("u", eps, SLICE_PORTS)]


def test_run_once_deletes_the_removed_endpoints_flow(testbed: Testbed, tmp_path: Path) -> None:
    d = topo.write_manifests(tmp_path / "m", objects(testbed, ["pod-a", "pod-b"]))
    assert topo.run_once(testbed, d) == 0
    with UdpSession(testbed.pod("pod-c").netns, VIP, 53) as s:
        first = s.ask().pod
        other = "pod-b" if first == "pod-a" else "pod-a"
        topo.write_manifests(d, objects(testbed, [other]))
        assert topo.run_once(testbed, d) == 0
        moved = s.ask()
        assert moved.result is Result.ANSWERED, str(moved)
        assert moved.pod == other  # the same socket, now on the endpoint that is left


def test_the_daemon_deletes_the_removed_endpoints_flow(testbed: Testbed, tmp_path: Path) -> None:
    d = publish(tmp_path / "m", objects(testbed, ["pod-a", "pod-b"]))
    with daemon(testbed, d), UdpSession(testbed.pod("pod-c").netns, VIP, 53) as s:
        first = s.ask().pod
        other = "pod-b" if first == "pod-a" else "pod-a"
        publish(d, objects(testbed, [other]))
        wait_until(lambda: s.ask().pod == other, 5.0, "the socket on the endpoint left")
