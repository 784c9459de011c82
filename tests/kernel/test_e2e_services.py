"""Kubernetes' ``[sig-network] Services`` e2e cases, ported to the namespace testbed.

Each test names the upstream test it ports (``test/e2e/network/service.go``), and
``docs/conformance.md`` maps every upstream case to the test that covers it. The objects
change between steps as the API server would change them, and every step is checked with real
packets: pod-a, pod-b, pod-c on node1 (where nlproxy runs), pod-r on node2, the client outside.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from nlproxy.demo.echo import Result
from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import daemon, free_node_port, publish, wait_until
from tests.kernel.topo import PORTS, SLICE_PORTS, answers, apply, ask, results

testbed = topo.testbed

VIP = "10.96.0.50"
NODE_PORT = 30090


def _eps(tb: Testbed, pods: list[str], **conditions: bool) -> list[dict[str, Any]]:
    return [topo.endpoint(str(tb.pod(p).ipv4), tb.pod(p).node, **conditions) for p in pods]


def _svc(
    tb: Testbed,
    pods: list[str],
    ports: tuple[dict[str, Any], ...] = PORTS,
    *,
    name: str = "e2e",
    vip: str = VIP,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> list[dict[str, Any]]:
    svc = topo.service(name, vip, ports, **spec)
    if labels:
        svc["metadata"]["labels"] = labels
    return [svc, topo.endpoint_slice(name, _eps(tb, pods), SLICE_PORTS)]


def _from_a(tb: Testbed, proto: str = "tcp", port: int = 80, n: int = 12) -> set[str]:
    """Pods that answered pod-a through the service (every request must be answered)."""
    return set(answers(ask(proto, tb.pod("pod-a").netns, VIP, port, n=n)))


def _refused_from_a(tb: Testbed, proto: str = "tcp", port: int = 80) -> bool:
    return results(ask(proto, tb.pod("pod-a").netns, VIP, port, n=2)) == {Result.REFUSED}


# -- session affinity ---------------------------------------------------------------------------


def test_switch_session_affinity_cluster_ip(testbed: Testbed, tmp_path: Path) -> None:
    """should be able to switch session affinity for service with type clusterIP [LinuxOnly]"""
    pods = ["pod-b", "pod-c", "pod-r"]
    apply(testbed, tmp_path, _svc(testbed, pods, sessionAffinity="ClientIP"))
    assert len(_from_a(testbed, n=15)) == 1
    apply(testbed, tmp_path, _svc(testbed, pods, sessionAffinity="None"))
    assert len(_from_a(testbed, n=24)) > 1
    apply(testbed, tmp_path, _svc(testbed, pods, sessionAffinity="ClientIP"))
    assert len(_from_a(testbed, n=15)) == 1


def test_switch_session_affinity_node_port(testbed: Testbed, tmp_path: Path) -> None:
    """should have session affinity work for NodePort service [LinuxOnly], and
    should be able to switch session affinity for NodePort service [LinuxOnly]"""
    pods = ["pod-b", "pod-c", "pod-r"]
    ports = ({"name": "tcp", "port": 80, "targetPort": 8080, "nodePort": NODE_PORT},)
    node, client = str(testbed.node.ipv4), testbed.client.netns

    def seen(n: int) -> set[str]:
        return set(answers(ask("tcp", client, node, NODE_PORT, n=n)))

    apply(
        testbed, tmp_path, _svc(testbed, pods, ports, type="NodePort", sessionAffinity="ClientIP")
    )
    assert len(seen(15)) == 1
    apply(testbed, tmp_path, _svc(testbed, pods, ports, type="NodePort"))
    assert len(seen(24)) > 1
    apply(
        testbed, tmp_path, _svc(testbed, pods, ports, type="NodePort", sessionAffinity="ClientIP")
    )
    assert len(seen(15)) == 1


@pytest.mark.parametrize("svc_type", ["ClusterIP", "NodePort"])
def test_session_affinity_timeout(testbed: Testbed, tmp_path: Path, svc_type: str) -> None:
    """should have session affinity timeout work for service with type clusterIP / for NodePort
    service [LinuxOnly]: sticky within the timeout, free to move after it."""
    pods = ["pod-b", "pod-c", "pod-r"]
    ports = ({"name": "tcp", "port": 80, "targetPort": 8080, "nodePort": NODE_PORT},)
    affinity = {
        "sessionAffinity": "ClientIP",
        "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 1}},
    }
    if svc_type == "ClusterIP":
        ports = ({"name": "tcp", "port": 80, "targetPort": 8080},)
    apply(testbed, tmp_path, _svc(testbed, pods, ports, type=svc_type, **affinity))
    if svc_type == "ClusterIP":
        ns, addr, port = testbed.pod("pod-a").netns, VIP, 80
    else:
        ns, addr, port = testbed.client.netns, str(testbed.node.ipv4), NODE_PORT
    assert len(set(answers(ask("tcp", ns, addr, port, n=10)))) == 1, "sticky within the timeout"
    moved: set[str] = set()
    for _ in range(9):  # each after the timeout: a new random choice (1/3 ** 8 to stay)
        time.sleep(1.3)
        moved |= set(answers(ask("tcp", ns, addr, port, n=1)))
    assert len(moved) > 1, f"affinity outlived its 1 s timeout: {moved}"


# -- ports and protocols ------------------------------------------------------------------------

TCP80 = {"name": "tcp-port", "port": 80, "targetPort": 8080, "protocol": "TCP"}
UDP80 = {"name": "udp-port", "port": 80, "targetPort": 8080, "protocol": "UDP"}
SLICE_TCP_UDP = (
    {"name": "tcp-port", "port": 8080, "protocol": "TCP"},
    {"name": "udp-port", "port": 8080, "protocol": "UDP"},
)


def _tcp_udp(tb: Testbed, ports: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return [
        topo.service("e2e", VIP, ports),
        topo.endpoint_slice("e2e", _eps(tb, ["pod-b"]), SLICE_TCP_UDP),
    ]


def test_same_port_different_protocols(testbed: Testbed, tmp_path: Path) -> None:
    """should serve endpoints on same port and different protocols [Conformance]"""
    apply(testbed, tmp_path, _tcp_udp(testbed, (TCP80, UDP80)))
    assert _from_a(testbed, "tcp", n=2) == {"pod-b"}
    assert _from_a(testbed, "udp", n=2) == {"pod-b"}
    apply(testbed, tmp_path, _tcp_udp(testbed, (TCP80,)))
    assert _from_a(testbed, "tcp", n=2) == {"pod-b"}
    assert _refused_from_a(testbed, "udp"), "UDP 80 still forwarded after its port was removed"
    apply(testbed, tmp_path, _tcp_udp(testbed, (UDP80,)))
    assert _from_a(testbed, "udp", n=2) == {"pod-b"}
    assert _refused_from_a(testbed, "tcp"), "TCP 80 still forwarded after its port was removed"


def test_ports_added_and_deleted(testbed: Testbed, tmp_path: Path) -> None:
    """should be updated after adding or deleting ports"""
    one = ({"name": "tcp", "port": 80, "targetPort": 8080},)
    two = (*one, {"name": "tcp2", "port": 81, "targetPort": 8080})
    slice_two = (*SLICE_PORTS[:1], {"name": "tcp2", "port": 8080, "protocol": "TCP"})
    apply(testbed, tmp_path, _svc(testbed, ["pod-b"], one))
    assert _refused_from_a(testbed, port=81)
    svc = topo.service("e2e", VIP, two)
    apply(testbed, tmp_path, [svc, topo.endpoint_slice("e2e", _eps(testbed, ["pod-b"]), slice_two)])
    assert _from_a(testbed, port=80, n=2) == {"pod-b"}
    assert _from_a(testbed, port=81, n=2) == {"pod-b"}
    apply(testbed, tmp_path, _svc(testbed, ["pod-b"], one))
    assert _from_a(testbed, port=80, n=2) == {"pod-b"}
    assert _refused_from_a(testbed, port=81)


def test_update_to_node_port_with_two_protocols(testbed: Testbed, tmp_path: Path) -> None:
    """should be able to update service type to NodePort listening on same port number but
    different protocols"""
    node, client = str(testbed.node.ipv4), testbed.client.netns
    tcp = {**TCP80, "nodePort": 30091}
    udp = {**UDP80, "nodePort": 30092}
    apply(testbed, tmp_path, _tcp_udp(testbed, (TCP80,)))
    objs = _tcp_udp(testbed, (tcp,))
    objs[0]["spec"]["type"] = "NodePort"
    apply(testbed, tmp_path, objs)
    assert set(answers(ask("tcp", client, node, 30091, n=2))) == {"pod-b"}
    objs = _tcp_udp(testbed, (tcp, udp))
    objs[0]["spec"]["type"] = "NodePort"
    apply(testbed, tmp_path, objs)
    assert set(answers(ask("tcp", client, node, 30091, n=2))) == {"pod-b"}
    assert set(answers(ask("udp", client, node, 30092, n=2))) == {"pod-b"}
    assert _from_a(testbed, "udp", n=2) == {"pod-b"}


# -- type changes, up and down ------------------------------------------------------------------


def _external_name(name: str = "e2e") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"type": "ExternalName", "externalName": "foo.example.com"},
    }


def test_type_changes_to_and_from_external_name(testbed: Testbed, tmp_path: Path) -> None:
    """should be able to change the type from ExternalName to ClusterIP / to NodePort, and from
    ClusterIP / NodePort to ExternalName [Conformance] (the proxy's part: rules appear and go)"""
    node, client = str(testbed.node.ipv4), testbed.client.netns
    ports = ({"name": "tcp", "port": 80, "targetPort": 8080, "nodePort": NODE_PORT},)
    topo.decoy(testbed, VIP)
    apply(testbed, tmp_path, [_external_name()])
    assert results(ask("tcp", client, VIP, 80, n=1)) == {Result.REFUSED}, "nothing programmed"
    apply(testbed, tmp_path, _svc(testbed, ["pod-b", "pod-r"]))
    assert _from_a(testbed) == {"pod-b", "pod-r"}
    apply(testbed, tmp_path, [_external_name(), *_svc(testbed, ["pod-b"])[1:]])
    assert not _from_a_answers(testbed), "the ClusterIP still served after the change"
    apply(testbed, tmp_path, _svc(testbed, ["pod-b"], ports, type="NodePort"))
    assert set(answers(ask("tcp", client, node, NODE_PORT, n=2))) == {"pod-b"}
    apply(testbed, tmp_path, [_external_name(), *_svc(testbed, ["pod-b"])[1:]])
    assert results(ask("tcp", client, node, NODE_PORT, n=2)) != {Result.ANSWERED}


def _from_a_answers(tb: Testbed) -> bool:
    return Result.ANSWERED in results(ask("tcp", tb.pod("pod-a").netns, VIP, 80, n=2))


def test_up_and_down_services(testbed: Testbed, tmp_path: Path) -> None:
    """should be able to up and down services, and should work after the service has been
    recreated"""
    one = _svc(testbed, ["pod-b"], name="up-down-1", vip="10.96.0.51")
    two = _svc(testbed, ["pod-c"], name="up-down-2", vip="10.96.0.52")
    three = _svc(testbed, ["pod-r"], name="up-down-3", vip="10.96.0.53")
    a = testbed.pod("pod-a").netns

    def up(vip: str) -> set[str]:
        return set(answers(ask("tcp", a, vip, 80, n=3)))

    apply(testbed, tmp_path, [*one, *two])
    assert (up("10.96.0.51"), up("10.96.0.52")) == ({"pod-b"}, {"pod-c"})
    apply(testbed, tmp_path, two)
    assert Result.ANSWERED not in results(ask("tcp", a, "10.96.0.51", 80, n=2))
    assert up("10.96.0.52") == {"pod-c"}
    apply(testbed, tmp_path, [*two, *three])
    assert (up("10.96.0.52"), up("10.96.0.53")) == ({"pod-c"}, {"pod-r"})
    apply(testbed, tmp_path, [*two, *three, *one])  # recreated
    assert up("10.96.0.51") == {"pod-b"}


@pytest.mark.parametrize(
    "label",
    [
        pytest.param({"service.kubernetes.io/service-proxy-name": "foo-bar"}, id="proxy-name"),
        pytest.param({"service.kubernetes.io/headless": ""}, id="headless"),
    ],
)
def test_label_toggles_proxying(testbed: Testbed, tmp_path: Path, label: dict[str, str]) -> None:
    """should implement service.kubernetes.io/service-proxy-name, and
    should implement service.kubernetes.io/headless: a labelled Service is never proxied, and
    adding or removing the label on a live one takes it down or up."""
    disabled = _svc(testbed, ["pod-c"], name="disabled", vip="10.96.0.54", labels=label)
    toggled = _svc(testbed, ["pod-b"], name="toggled")
    apply(testbed, tmp_path, [*disabled, *toggled])
    a = testbed.pod("pod-a").netns
    assert _from_a(testbed, n=3) == {"pod-b"}
    assert Result.ANSWERED not in results(ask("tcp", a, "10.96.0.54", 80, n=2))
    apply(testbed, tmp_path, [*disabled, *_svc(testbed, ["pod-b"], name="toggled", labels=label)])
    assert not _from_a_answers(testbed)
    apply(testbed, tmp_path, [*disabled, *toggled])
    assert _from_a(testbed, n=3) == {"pod-b"}
    assert Result.ANSWERED not in results(ask("tcp", a, "10.96.0.54", 80, n=2))


# -- endpoints that are not ready ---------------------------------------------------------------


def test_empty_slice_is_rejected(testbed: Testbed, tmp_path: Path) -> None:
    """should be rejected for evicted pods (no endpoints exist): the slice exists and is empty"""
    svc = topo.service("e2e", VIP, PORTS, publishNotReadyAddresses=True)
    apply(testbed, tmp_path, [svc, topo.endpoint_slice("e2e", [], SLICE_PORTS)])
    assert _refused_from_a(testbed)


def test_publish_not_ready_addresses(testbed: Testbed, tmp_path: Path) -> None:
    """should create endpoints for unready pods, and should be able to connect to terminating
    and unready endpoints if PublishNotReadyAddresses is true: the EndpointSlice controller then
    publishes the pod as ready (and terminating once it is deleted), and it is used."""
    eps = _eps(testbed, ["pod-b"], ready=True, terminating=True)
    svc = topo.service("e2e", VIP, PORTS, publishNotReadyAddresses=True)
    apply(testbed, tmp_path, [svc, topo.endpoint_slice("e2e", eps, SLICE_PORTS)])
    assert _from_a(testbed, n=3) == {"pod-b"}


def test_terminating_not_serving_is_not_used(testbed: Testbed, tmp_path: Path) -> None:
    """should not be able to connect to terminating and unready endpoints if
    PublishNotReadyAddresses is false (the controller publishes ready=serving=false)"""
    eps = _eps(testbed, ["pod-b"], ready=False, terminating=False)
    eps[0]["conditions"] = {"ready": False, "serving": False, "terminating": True}
    apply(
        testbed,
        tmp_path,
        [topo.service("e2e", VIP, PORTS), topo.endpoint_slice("e2e", eps, SLICE_PORTS)],
    )
    assert _refused_from_a(testbed)


def test_internal_traffic_policy_local_from_the_node(testbed: Testbed, tmp_path: Path) -> None:
    """should respect internalTrafficPolicy=Local Pod (hostNetwork: true) to Pod: the node
    itself reaches only its local endpoint"""
    apply(testbed, tmp_path, _svc(testbed, ["pod-b", "pod-r"], internalTrafficPolicy="Local"))
    seen = set(answers(ask("tcp", testbed.node.netns, VIP, 80, n=12)))
    assert seen == {"pod-b"}


# -- terminating fallbacks ----------------------------------------------------------------------

TERMINATING = {"ready": False, "terminating": True}  # serving: a pod shutting down gracefully


def test_fallback_to_local_terminating_with_internal_policy_local(
    testbed: Testbed, tmp_path: Path
) -> None:
    """should fallback to local terminating endpoints when there are no ready endpoints with
    internalTrafficPolicy=Local"""
    svc = topo.service("e2e", VIP, PORTS, internalTrafficPolicy="Local")
    eps = _eps(testbed, ["pod-b"], **TERMINATING)
    apply(testbed, tmp_path, [svc, topo.endpoint_slice("e2e", eps, SLICE_PORTS)])
    assert _from_a(testbed, n=3) == {"pod-b"}


@pytest.mark.parametrize("policy", ["Cluster", "Local"])
def test_fallback_to_terminating_node_port(testbed: Testbed, tmp_path: Path, policy: str) -> None:
    """should fallback to terminating endpoints when there are no ready endpoints with
    externallTrafficPolicy=Cluster, and ... to local terminating endpoints ... with
    externalTrafficPolicy=Local: the NodePort still reaches the only, terminating, endpoint"""
    ports = ({"name": "tcp", "port": 80, "targetPort": 8080, "nodePort": NODE_PORT},)
    svc = topo.service("e2e", VIP, ports, type="NodePort", externalTrafficPolicy=policy)
    eps = _eps(testbed, ["pod-b"], **TERMINATING)
    apply(testbed, tmp_path, [svc, topo.endpoint_slice("e2e", eps, SLICE_PORTS)])
    seen = answers(ask("tcp", testbed.client.netns, str(testbed.node.ipv4), NODE_PORT, n=3))
    assert set(seen) == {"pod-b"}


def test_health_check_fails_with_only_terminating_endpoints(
    testbed: Testbed, tmp_path: Path
) -> None:
    """should fail health check node port if there are only terminating endpoints: 503, while
    the terminating endpoint still serves the NodePort"""
    hc = free_node_port()
    ports = [{"name": "tcp", "port": 80, "targetPort": 8080, "nodePort": NODE_PORT}]
    status = {"loadBalancer": {"ingress": [{"ip": "192.168.70.20"}]}}
    svc = topo.service(
        "e2e", VIP, ports, type="LoadBalancer", externalTrafficPolicy="Local",
        healthCheckNodePort=hc, status=status,
    )  # fmt: skip

    def cluster(**conditions: bool) -> list[dict[str, Any]]:
        eps = _eps(testbed, ["pod-b"], **conditions)
        return [testbed.node_manifest(), svc, topo.endpoint_slice("e2e", eps, SLICE_PORTS)]

    d = publish(tmp_path / "m", cluster())
    with daemon(testbed, d) as proc:
        wait_until(lambda: hc_get(proc, hc) == 200, 3.0, "200 with a ready local endpoint")
        publish(d, cluster(**TERMINATING))
        wait_until(lambda: hc_get(proc, hc) == 503, 3.0, "503 with only a terminating one")
        node, client = str(testbed.node.ipv4), testbed.client.netns
        assert set(answers(ask("tcp", client, node, NODE_PORT, n=3))) == {"pod-b"}


def hc_get(proc: Any, port: int) -> int:
    try:
        return int(proc.get(port, "/")[0])
    except OSError:
        return 0


def test_multiport_endpoints(testbed: Testbed, tmp_path: Path) -> None:
    """should serve multiport endpoints from pods [Conformance]: two ports whose named target
    ports resolve to different pods, each in its own EndpointSlice"""
    ports = (
        {"name": "portname1", "port": 80, "targetPort": "svc1"},
        {"name": "portname2", "port": 81, "targetPort": "svc2"},
    )
    b, c = testbed.pod("pod-b"), testbed.pod("pod-c")
    objs = [
        topo.service("e2e", VIP, ports),
        topo.endpoint_slice(
            "e2e", _eps(testbed, ["pod-b"]), ({"name": "portname1", "port": 8080},), name="e2e-1"
        ),
        topo.endpoint_slice(
            "e2e", _eps(testbed, ["pod-c"]), ({"name": "portname2", "port": 8080},), name="e2e-2"
        ),
    ]
    apply(testbed, tmp_path, objs)
    assert _from_a(testbed, port=80, n=6) == {b.name}
    assert _from_a(testbed, port=81, n=6) == {c.name}
    apply(testbed, tmp_path, [objs[0], objs[2]])  # pod-b gone: port 80 has no endpoint
    assert _refused_from_a(testbed, port=80)
    assert _from_a(testbed, port=81, n=3) == {c.name}


def test_check_kube_proxy_urls(testbed: Testbed, tmp_path: Path) -> None:
    """should check kube-proxy urls (networking.go): /healthz on the health port answers 200,
    /proxyMode on the metrics port names the mode."""
    d = publish(tmp_path / "m", [testbed.node_manifest(), *_svc(testbed, ["pod-b"])])
    with daemon(testbed, d) as proc:
        assert proc.get(proc.healthz, "/healthz")[0] == 200
        assert proc.get(proc.metrics, "/proxyMode") == (200, "nftables")
