"""externalTrafficPolicy=Local: the health-check node port says which node has local endpoints,
only that node answers on the node port, and the client's source address is preserved."""

from __future__ import annotations

import json

import cluster
from conftest import Vms

NODE1, NODE2 = cluster.nodes()
SVC = cluster.LOCAL
NODE_PORT = SVC.ports[0][3]
CLIENT_IP = cluster.topology()["client"]["ip"]


def health(vms: Vms, node: cluster.Node) -> tuple[int, dict[str, object]]:
    [answer] = vms.probe("client", "http", f"http://{node.ip}:{SVC.health_node_port}/")
    return answer["status"], json.loads(answer["body"]) if answer["body"] else {}


def test_health_check_node_port_200_with_local_endpoints(vms: Vms) -> None:
    assert {n for _, _, n in cluster.endpoints(SVC)} == {NODE1.name}
    status, body = health(vms, NODE1)
    assert status == 200, body
    assert body["service"] == {"namespace": cluster.NAMESPACE, "name": SVC.name}
    assert body["localEndpoints"] == 1


def test_health_check_node_port_503_without_local_endpoints(vms: Vms) -> None:
    status, body = health(vms, NODE2)
    assert status == 503, body
    assert body["localEndpoints"] == 0


def test_node_port_on_the_node_with_the_endpoint_keeps_the_client_address(vms: Vms) -> None:
    answers = vms.probe("client", "tcp", NODE1.ip, NODE_PORT, count=5)
    assert [(a["ok"], a.get("pod"), a.get("src")) for a in answers] == [
        (True, "local-1", CLIENT_IP)
    ] * 5


def test_node_port_on_a_node_without_endpoints_does_not_answer(vms: Vms) -> None:
    answers = vms.probe("client", "tcp", NODE2.ip, NODE_PORT, count=2)
    assert [a["ok"] for a in answers] == [False, False], answers
