"""ClientIP affinity's map layout with real packets (``proxy/affinity.py``, ``nft/dynmap.py``).

A ClusterIP-only Service with ``sessionAffinity: ClientIP`` is programmed by ``nlproxy run
--once``: each client keeps one pod (learned after DNAT into the port's clients map), the node's
own connections too; when a client's pod leaves the Service (the pod itself still answers), the
sync forgets that client, which then moves to another pod and stays there.

pod-a, pod-b, pod-c are on node1 (where nlproxy runs), pod-r on node2.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.topo import PORTS, SLICE_PORTS, answers, apply, ask

testbed = topo.testbed

VIP = "10.96.0.10"
STICKY = {"sessionAffinity": "ClientIP"}


def _web(tb: Testbed, pods: list[str]) -> list[dict[str, object]]:
    eps = [topo.endpoint(str(tb.pod(p).ipv4), tb.pod(p).node) for p in pods]
    return [
        topo.service("web", VIP, PORTS, **STICKY),
        topo.endpoint_slice("web", eps, SLICE_PORTS),
    ]


def _clients(tb: Testbed) -> dict[str, str]:
    """client -> endpoint address, over the TCP port's clients map as the kernel holds it."""
    ns = tb.node.netns
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "nft", "-j", "list", "maps", "ip"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    names = [
        m["map"]["name"]
        for m in json.loads(out)["nftables"]
        if "map" in m and m["map"]["name"].startswith("clients-") and "/tcp/" in m["map"]["name"]
    ]
    assert len(names) == 1, names
    listed = subprocess.run(
        ["ip", "netns", "exec", ns, "nft", "-j", "list", "map", "ip", "nlproxy", names[0]],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    held: dict[str, str] = {}
    for item in json.loads(listed)["nftables"]:
        for key, data in item.get("map", {}).get("elem", []):
            client = key["elem"]["val"] if isinstance(key, dict) else key
            held[str(client)] = str(data["concat"][0])
    return held


def test_a_client_keeps_its_pod_and_moves_when_the_pod_leaves(
    testbed: Testbed, tmp_path: Path
) -> None:
    pods = ["pod-b", "pod-c", "pod-r"]
    apply(testbed, tmp_path, _web(testbed, pods))
    a = testbed.pod("pod-a")
    first = answers(ask("tcp", a.netns, VIP, 80))
    assert len(first) == 1, f"one client, one pod: {first}"
    (pod,) = first
    assert _clients(testbed) == {str(a.ipv4): str(testbed.pod(pod).ipv4)}

    # The pod leaves the Service but still answers: only the forgotten client can move.
    apply(testbed, tmp_path, _web(testbed, [p for p in pods if p != pod]))
    assert str(a.ipv4) not in _clients(testbed)
    moved = answers(ask("tcp", a.netns, VIP, 80))
    assert len(moved) == 1, f"one client, one pod: {moved}"
    assert pod not in moved
    assert answers(ask("tcp", a.netns, VIP, 80)) == moved


def test_the_nodes_own_connections_keep_one_pod(testbed: Testbed, tmp_path: Path) -> None:
    apply(testbed, tmp_path, _web(testbed, ["pod-b", "pod-c", "pod-r"]))
    seen = answers(ask("tcp", testbed.node.netns, VIP, 80))
    assert len(seen) == 1, f"the node, one pod: {seen}"
    assert len(_clients(testbed)) == 1
