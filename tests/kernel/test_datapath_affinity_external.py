"""ClientIP affinity through NodePort, LoadBalancer and external addresses, with real packets.

Every IPv4 affinity port keeps one clients map (``proxy/affinity.py``) whatever its frontends:
a client that came through one frontend keeps its pod through every other; when its pod leaves
the Service (the pod itself still answers), the sync forgets the client, which then moves to
another pod and stays. With ``externalTrafficPolicy: Local`` external clients reach only this
node's pods, with their own source address, and still keep one; pods reach every endpoint.
IPv6 ports keep the address and the port in a map each, and stick and move the same way.

pod-a, pod-b, pod-c are on node1 (where nlproxy runs), pod-r on node2, the client outside.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.topo import LB_IP, SLICE_PORTS, answers, apply, ask

testbed, testbed6 = topo.testbed, topo.testbed6

VIP, VIP6 = "10.96.0.20", "fd00:10:96::20"
EXTERNAL_IP = "192.168.71.20"
NODE_PORT = 30095
ALL = ["pod-b", "pod-c", "pod-r"]
HERE = {"pod-b", "pod-c"}  # node1's


def _sticky(tb: Testbed, pods: list[str], **spec: Any) -> list[dict[str, Any]]:
    ports = ({"name": "tcp", "port": 80, "targetPort": 8080, "nodePort": NODE_PORT},)
    svc = topo.service(
        "sticky",
        VIP,
        ports,
        type="LoadBalancer",
        sessionAffinity="ClientIP",
        externalIPs=[EXTERNAL_IP],
        status={"loadBalancer": {"ingress": [{"ip": LB_IP}]}},
        **spec,
    )
    eps = [topo.endpoint(str(tb.pod(p).ipv4), tb.pod(p).node) for p in pods]
    return [svc, topo.endpoint_slice("sticky", eps, SLICE_PORTS)]


def _frontends(tb: Testbed) -> list[tuple[str, int]]:
    return [(str(tb.node.ipv4), NODE_PORT), (LB_IP, 80), (EXTERNAL_IP, 80)]


def _one_pod(ns: str, addr: str, port: int, n: int = 8) -> tuple[str, set[str]]:
    seen = answers(ask("tcp", ns, addr, port, n=n))
    assert len(seen) == 1, f"one client, one pod through {addr}:{port}: {seen}"
    ((pod, sources),) = seen.items()
    return pod, sources


def test_a_client_keeps_its_pod_through_every_frontend_and_moves_when_it_leaves(
    testbed: Testbed, tmp_path: Path
) -> None:
    tb = testbed
    apply(tb, tmp_path, _sticky(tb, ALL))
    client = tb.client.netns
    pods = {_one_pod(client, addr, port)[0] for addr, port in _frontends(tb)}
    assert len(pods) == 1, f"one pod for the client whatever the frontend: {pods}"
    (pod,) = pods

    # The pod leaves the Service but still answers: only the forgotten client can move.
    apply(tb, tmp_path, _sticky(tb, [p for p in ALL if p != pod]))
    moved = {_one_pod(client, addr, port)[0] for addr, port in _frontends(tb)}
    assert len(moved) == 1, f"one pod after the move: {moved}"
    assert pod not in moved


def test_local_policy_keeps_an_external_client_on_one_local_pod_with_its_address(
    testbed: Testbed, tmp_path: Path
) -> None:
    tb = testbed
    apply(tb, tmp_path, _sticky(tb, ALL, externalTrafficPolicy="Local"))
    client, source = tb.client.netns, str(tb.client.ipv4[0])
    pods = set()
    for addr, port in _frontends(tb):
        pod, sources = _one_pod(client, addr, port)
        assert pod in HERE, f"external traffic reached {pod}, not one of node1's pods"
        assert sources == {source}, f"the client's address is preserved: {sources}"
        pods.add(pod)
    assert len(pods) == 1, f"one pod for the client whatever the frontend: {pods}"

    # A pod reaching the LoadBalancer address takes the short-circuit to every endpoint: still
    # one pod, and node2's too (once the Service and its clients are gone and back).
    a = tb.pod("pod-a")
    _one_pod(a.netns, LB_IP, 80)
    apply(tb, tmp_path, [])
    apply(tb, tmp_path, _sticky(tb, ["pod-r"], externalTrafficPolicy="Local"))
    assert _one_pod(a.netns, LB_IP, 80)[0] == "pod-r"


def _sticky6(tb: Testbed, pods: list[str]) -> list[dict[str, Any]]:
    ports = ({"name": "tcp", "port": 80, "targetPort": 8080, "nodePort": NODE_PORT},)
    svc = topo.service(
        "sticky6",
        [VIP, VIP6],
        ports,
        type="NodePort",
        ipFamilyPolicy="RequireDualStack",
        sessionAffinity="ClientIP",
    )
    v4 = [topo.endpoint(str(tb.pod(p).ipv4), tb.pod(p).node) for p in ALL]
    v6 = [topo.endpoint(str(tb.pod(p).ipv6), tb.pod(p).node) for p in pods]
    return [
        svc,
        topo.endpoint_slice("sticky6", v4, SLICE_PORTS, family="IPv4"),
        topo.endpoint_slice("sticky6", v6, SLICE_PORTS, family="IPv6"),
    ]


def test_ipv6_clients_keep_one_pod_and_move_when_it_leaves(
    testbed6: Testbed, tmp_path: Path
) -> None:
    tb = testbed6
    apply(tb, tmp_path, _sticky6(tb, ALL))
    node6 = str(tb.node.ipv6)
    pod, _ = _one_pod(tb.client.netns, node6, NODE_PORT)
    _one_pod(tb.pod("pod-a").netns, VIP6, 80)
    _one_pod(tb.client.netns, str(tb.node.ipv4), NODE_PORT)

    apply(tb, tmp_path, _sticky6(tb, [p for p in ALL if p != pod]))
    moved, _ = _one_pod(tb.client.netns, node6, NODE_PORT)
    assert moved != pod
    assert _one_pod(tb.client.netns, node6, NODE_PORT)[0] == moved
