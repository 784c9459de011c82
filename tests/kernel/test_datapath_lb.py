"""Load-balancing choices with real packets: round-robin and consistent hashing.

pod-a, pod-b, pod-c are on node1 (where nlproxy runs), pod-r on node2; the client routes
everything through node1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nlproxy.testbed import Testbed
from nlproxy.testbed_echo import Result, request
from tests.kernel import topo
from tests.kernel.topo import PORTS, SLICE_PORTS, SVC_PORT, apply

testbed = topo.testbed

VIP = "10.96.0.30"
NODE_PORTS = {"tcp": 30081, "udp": 30054}
LB = "nlproxy.io/load-balancing"


def _web(
    tb: Testbed, pods: list[str], annotations: dict[str, str], **spec: Any
) -> list[dict[str, Any]]:
    ports = [{**p, "nodePort": NODE_PORTS[p["name"]]} for p in PORTS]
    svc = topo.service("web", VIP, ports, type="NodePort", **spec)
    svc["metadata"]["annotations"] = annotations
    eps = [topo.endpoint(str(tb.pod(p).ipv4), tb.pod(p).node) for p in pods]
    return [svc, topo.endpoint_slice("web", eps, SLICE_PORTS)]


def _pods(ns: str, addr: str, port: int, proto: str, n: int) -> list[str]:
    """The pod that answered each of ``n`` consecutive new connections, in order."""
    out = []
    for _ in range(n):
        o = request(proto, ns, addr, port)
        assert o.result is Result.ANSWERED, str(o)
        out.append(o.pod)
    return out


PODS = ["pod-b", "pod-c", "pod-r"]


@pytest.mark.parametrize("proto", ["tcp", "udp"])
@pytest.mark.parametrize("frontend", ["cluster-ip", "node-port"])
def test_round_robin_reaches_each_pod_once_per_round(
    testbed: Testbed, tmp_path: Path, proto: str, frontend: str
) -> None:
    apply(testbed, tmp_path, _web(testbed, PODS, {LB: "round-robin"}))
    if frontend == "cluster-ip":
        ns, addr, port = testbed.pod("pod-a").netns, VIP, SVC_PORT[proto]
    else:
        ns, addr, port = testbed.client.netns, str(testbed.node.ipv4), NODE_PORTS[proto]
    seen = _pods(ns, addr, port, proto, 4 * len(PODS))
    rounds = [seen[i : i + len(PODS)] for i in range(0, len(seen), len(PODS))]
    assert all(sorted(r) == PODS for r in rounds), rounds
    assert all(r == rounds[0] for r in rounds), f"not in a fixed order: {rounds}"


def test_round_robin_from_the_node_default(testbed: Testbed, tmp_path: Path) -> None:
    """``--load-balancing round-robin`` applies to Services without the annotation."""
    topo.write_manifests(tmp_path, [testbed.node_manifest(), *_web(testbed, PODS, {})])
    assert topo.run_once(testbed, tmp_path, "--load-balancing", "round-robin") == topo.EXIT_OK
    seen = _pods(testbed.pod("pod-a").netns, VIP, 80, "tcp", 2 * len(PODS))
    assert sorted(seen[:3]) == PODS, seen
    assert seen[3:] == seen[:3], seen


def test_round_robin_follows_an_endpoint_change(testbed: Testbed, tmp_path: Path) -> None:
    apply(testbed, tmp_path, _web(testbed, PODS, {LB: "round-robin"}))
    ns = testbed.pod("pod-a").netns
    assert sorted(_pods(ns, VIP, 80, "tcp", 3)) == PODS
    apply(testbed, tmp_path, _web(testbed, ["pod-c", "pod-r"], {LB: "round-robin"}))
    seen = _pods(ns, VIP, 80, "tcp", 4)
    assert sorted(seen[:2]) == ["pod-c", "pod-r"], seen
    assert seen[2:] == seen[:2], seen
