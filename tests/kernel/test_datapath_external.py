"""Traffic from outside the cluster: NodePorts, externalIPs, LoadBalancer IPs and source ranges.

The client (192.168.50.2, and .3 when bound) routes everything through node1, where nlproxy
runs; pod-a, pod-b, pod-c are on node1, pod-r on node2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nlproxy.demo.echo import Result
from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.topo import PORTS, SLICE_PORTS, answers, apply, ask, results

testbed = topo.testbed

VIP = "10.96.0.20"
NODE_PORTS = {"tcp": 30080, "udp": 30053}
EXTERNAL_IP = "192.168.60.10"
LB_IP = "192.168.70.10"


def _objects(tb: Testbed, pods: list[str], svc_type: str, **spec: Any) -> list[dict[str, Any]]:
    ports = [{**p, "nodePort": NODE_PORTS[p["name"]]} for p in PORTS]
    eps = [topo.endpoint(str(tb.pod(p).ipv4), tb.pod(p).node) for p in pods]
    return [
        topo.service("edge", VIP, ports, type=svc_type, **spec),
        topo.endpoint_slice("edge", eps, SLICE_PORTS),
    ]


def _client_sees_refused_before(tb: Testbed, addr: str, port: int) -> None:
    """Without rules the address answers with a reset, so a later timeout means a drop."""
    assert results(ask("tcp", tb.client.netns, addr, port, n=1)) == {Result.REFUSED}


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_nodeport_cluster_policy_masquerades(testbed: Testbed, tmp_path: Path, proto: str) -> None:
    apply(testbed, tmp_path, _objects(testbed, ["pod-a", "pod-r"], "NodePort"))
    node = str(testbed.node.ipv4)
    seen = answers(ask(proto, testbed.client.netns, node, NODE_PORTS[proto]))
    # Masqueraded to the address of the link that leads to the endpoint.
    assert seen == {"pod-a": {str(testbed.node.gateway_v4)}, "pod-r": {node}}


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_nodeport_local_policy_keeps_client_source(
    testbed: Testbed, tmp_path: Path, proto: str
) -> None:
    objs = _objects(testbed, ["pod-a", "pod-r"], "NodePort", externalTrafficPolicy="Local")
    apply(testbed, tmp_path, objs)
    node = str(testbed.node.ipv4)
    seen = answers(ask(proto, testbed.client.netns, node, NODE_PORTS[proto]))
    assert seen == {"pod-a": {str(testbed.client.ipv4[0])}}


def test_nodeport_local_policy_without_local_endpoint_drops(
    testbed: Testbed, tmp_path: Path
) -> None:
    node = str(testbed.node.ipv4)
    _client_sees_refused_before(testbed, node, NODE_PORTS["tcp"])
    objs = _objects(testbed, ["pod-r"], "NodePort", externalTrafficPolicy="Local")
    apply(testbed, tmp_path, objs)
    assert results(ask("tcp", testbed.client.netns, node, NODE_PORTS["tcp"], n=2)) == {
        Result.TIMEOUT
    }
    # Inside the cluster the ClusterIP still reaches the remote endpoint.
    a = testbed.pod("pod-a")
    assert answers(ask("tcp", a.netns, VIP, 80, n=4)) == {"pod-r": {str(a.ipv4)}}


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_external_ip(testbed: Testbed, tmp_path: Path, proto: str) -> None:
    objs = _objects(testbed, ["pod-b"], "ClusterIP", externalIPs=[EXTERNAL_IP])
    objs[0]["spec"]["ports"] = list(PORTS)  # a ClusterIP service has no node ports
    apply(testbed, tmp_path, objs)
    port = 80 if proto == "tcp" else 53
    seen = answers(ask(proto, testbed.client.netns, EXTERNAL_IP, port))
    assert seen == {"pod-b": {str(testbed.node.gateway_v4)}}


def test_external_ip_local_policy_on_a_cluster_ip_service(testbed: Testbed, tmp_path: Path) -> None:
    """A ClusterIP Service with externalIPs is externally accessible, so eTP=Local applies to it
    (upstream's ExternalPolicyLocal): outside clients reach only local endpoints with their own
    source; pods and the node itself are short-circuited to every endpoint."""
    objs = _objects(
        testbed, ["pod-b", "pod-r"], "ClusterIP", externalIPs=[EXTERNAL_IP],
        externalTrafficPolicy="Local",
    )  # fmt: skip
    objs[0]["spec"]["ports"] = list(PORTS)
    apply(testbed, tmp_path, objs)
    client = str(testbed.client.ipv4[0])
    for proto, port in (("tcp", 80), ("udp", 53)):
        seen = answers(ask(proto, testbed.client.netns, EXTERNAL_IP, port))
        assert seen == {"pod-b": {client}}, proto
    a = testbed.pod("pod-a")
    assert set(answers(ask("tcp", a.netns, EXTERNAL_IP, 80, n=12))) == {"pod-b", "pod-r"}
    from_node = answers(ask("tcp", testbed.node.netns, EXTERNAL_IP, 80, n=12))
    assert set(from_node) == {"pod-b", "pod-r"}


def test_external_ip_local_policy_without_local_endpoint_drops(
    testbed: Testbed, tmp_path: Path
) -> None:
    objs = _objects(testbed, ["pod-r"], "ClusterIP", externalIPs=[EXTERNAL_IP])
    objs[0]["spec"]["ports"] = list(PORTS)
    apply(testbed, tmp_path, objs)
    # With the Cluster policy the client reaches the remote endpoint: a later timeout is the drop.
    assert set(answers(ask("tcp", testbed.client.netns, EXTERNAL_IP, 80, n=2))) == {"pod-r"}
    objs[0]["spec"]["externalTrafficPolicy"] = "Local"
    apply(testbed, tmp_path, objs)
    assert results(ask("tcp", testbed.client.netns, EXTERNAL_IP, 80, n=2)) == {Result.TIMEOUT}
    a = testbed.pod("pod-a")
    assert answers(ask("tcp", a.netns, EXTERNAL_IP, 80, n=4)) == {"pod-r": {str(a.ipv4)}}


def _load_balancer(tb: Testbed, **spec: Any) -> list[dict[str, Any]]:
    status = {"loadBalancer": {"ingress": [{"ip": LB_IP}]}}
    return _objects(tb, ["pod-b", "pod-c"], "LoadBalancer", status=status, **spec)


def test_load_balancer_ip(testbed: Testbed, tmp_path: Path) -> None:
    apply(testbed, tmp_path, _load_balancer(testbed))
    gw = str(testbed.node.gateway_v4)
    seen = answers(ask("tcp", testbed.client.netns, LB_IP, 80))
    assert seen == {"pod-b": {gw}, "pod-c": {gw}}


def test_load_balancer_source_ranges(testbed: Testbed, tmp_path: Path) -> None:
    allowed, denied = (str(a) for a in testbed.client.ipv4)
    ranges = {"loadBalancerSourceRanges": [f"{allowed}/32"]}
    apply(testbed, tmp_path, _load_balancer(testbed, **ranges))
    ns = testbed.client.netns
    # Both addresses go through the same DNAT; only the firewall tells them apart.
    assert set(answers(ask("tcp", ns, LB_IP, 80, src=allowed))) <= {"pod-b", "pod-c"}
    assert results(ask("tcp", ns, LB_IP, 80, src=denied, n=2)) == {Result.TIMEOUT}
    assert results(ask("udp", ns, LB_IP, 53, src=denied, n=2)) == {Result.TIMEOUT}
    # The NodePort of the same service is not behind the firewall (as upstream).
    node = str(testbed.node.ipv4)
    assert set(answers(ask("tcp", ns, node, NODE_PORTS["tcp"], src=denied, n=4))) <= {
        "pod-b",
        "pod-c",
    }


def test_load_balancer_local_policy_keeps_client_source(testbed: Testbed, tmp_path: Path) -> None:
    objs = _objects(
        testbed,
        ["pod-b", "pod-r"],
        "LoadBalancer",
        externalTrafficPolicy="Local",
        status={"loadBalancer": {"ingress": [{"ip": LB_IP}]}},
    )
    apply(testbed, tmp_path, objs)
    client = str(testbed.client.ipv4[0])
    assert answers(ask("udp", testbed.client.netns, LB_IP, 53)) == {"pod-b": {client}}
