"""ClusterIP and NodePort traffic (eTP=Cluster) from the outside client, from pods and from the
other node: which pod answered and which source address it saw."""

from __future__ import annotations

import ipaddress
from typing import Any

import cluster
import pytest
from conftest import Vms

TRIES = 40  # 4 endpoints picked at random: all four answer with probability > 0.9999
WEB_PODS = {p for p, _, _ in cluster.endpoints(cluster.WEB)}
NODE1, NODE2 = cluster.nodes()


def gateway(node: cluster.Node) -> str:
    """The node-side address of every pod veth on node."""
    return str(ipaddress.ip_network(node.pod_cidr)[1])


def masqueraded_source(entry: cluster.Node, pod: str) -> str:
    """The source a pod sees when entry masqueraded the packet: the address of the interface the
    packet left entry by (its pod veth, or its node address towards the other node)."""
    return gateway(entry) if cluster.pod_node(pod) == entry else entry.ip


def check_answers(answers: list[dict[str, Any]], expect_src: dict[str, str]) -> None:
    failed = [a for a in answers if not a["ok"]]
    assert not failed, failed
    seen = {a["pod"] for a in answers}
    assert seen == set(expect_src), f"answered: {sorted(seen)}, expected {sorted(expect_src)}"
    wrong = [a for a in answers if a["src"] != expect_src[a["pod"]]]
    assert not wrong, f"unexpected sources: {wrong}, expected {expect_src}"


@pytest.mark.parametrize(("mode", "port"), [("tcp", 80), ("udp", 53)])
def test_cluster_ip_from_the_client_through_node1(vms: Vms, mode: str, port: int) -> None:
    # The client routes the service CIDR via node1; traffic from outside the cluster CIDR is
    # masqueraded so the answer comes back through node1.
    answers = vms.probe("client", mode, cluster.WEB.cluster_ip, port, count=TRIES)
    check_answers(answers, {p: masqueraded_source(NODE1, p) for p in WEB_PODS})


@pytest.mark.parametrize("entry", [NODE1, NODE2], ids=["node1", "node2"])
@pytest.mark.parametrize(("mode", "port"), [("tcp", 30080), ("udp", 30053)])
def test_node_port_from_the_client(vms: Vms, entry: cluster.Node, mode: str, port: int) -> None:
    answers = vms.probe("client", mode, entry.ip, port, count=TRIES)
    check_answers(answers, {p: masqueraded_source(entry, p) for p in WEB_PODS})


@pytest.mark.parametrize(("mode", "port"), [("tcp", 80), ("udp", 53)])
def test_cluster_ip_from_a_pod_reaches_pods_on_both_nodes(vms: Vms, mode: str, port: int) -> None:
    pod, pod_ip = "web-2a", NODE2.pods["web-2a"]
    answers = vms.probe(NODE2.name, mode, cluster.WEB.cluster_ip, port, count=TRIES, pod=pod)
    # Pod-to-pod keeps the pod's address; a pod reaching itself is masqueraded (hairpin).
    check_answers(answers, {p: gateway(NODE2) if p == pod else pod_ip for p in WEB_PODS})


def test_node_port_of_node2_from_node1(vms: Vms) -> None:
    answers = vms.probe(NODE1.name, "tcp", NODE2.ip, 30080, count=TRIES)
    check_answers(answers, {p: masqueraded_source(NODE2, p) for p in WEB_PODS})
