"""ClusterIP traffic through rules programmed by ``nlproxy run --once``: real packets, real pods.

pod-a, pod-b, pod-c are on node1 (where nlproxy runs), pod-r on node2.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nlproxy.demo.echo import Result, UdpSession, request
from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.topo import PORTS, SLICE_PORTS, SVC_PORT, answers, apply, ask, results

testbed = topo.testbed

VIP = "10.96.0.10"


def _web(tb: Testbed, pods: list[str], **spec: object) -> list[dict[str, object]]:
    eps = [topo.endpoint(str(tb.pod(p).ipv4), tb.pod(p).node) for p in pods]
    return [
        topo.service("web", VIP, PORTS, **spec),
        topo.endpoint_slice("web", eps, SLICE_PORTS),
    ]


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_from_pod_spreads_and_keeps_source(testbed: Testbed, tmp_path: Path, proto: str) -> None:
    apply(testbed, tmp_path, _web(testbed, ["pod-b", "pod-r"]))
    a = testbed.pod("pod-a")
    seen = answers(ask(proto, a.netns, VIP, SVC_PORT[proto]))
    assert seen == {"pod-b": {str(a.ipv4)}, "pod-r": {str(a.ipv4)}}


def test_from_node_is_masqueraded(testbed: Testbed, tmp_path: Path) -> None:
    # The node's own source (192.168.50.1, from its default route) is outside the cluster CIDR,
    # so it is masqueraded to the address of whichever link leads to the endpoint.
    apply(testbed, tmp_path, _web(testbed, ["pod-b", "pod-r"]))
    seen = answers(ask("tcp", testbed.node.netns, VIP, 80))
    assert seen == {"pod-b": {str(testbed.node.gateway_v4)}, "pod-r": {str(testbed.node.ipv4)}}


def test_internal_traffic_policy_local(testbed: Testbed, tmp_path: Path) -> None:
    apply(testbed, tmp_path, _web(testbed, ["pod-b", "pod-r"], internalTrafficPolicy="Local"))
    a = testbed.pod("pod-a")
    assert answers(ask("tcp", a.netns, VIP, 80)) == {"pod-b": {str(a.ipv4)}}


def test_internal_traffic_policy_local_without_local_endpoint_drops(
    testbed: Testbed, tmp_path: Path
) -> None:
    topo.decoy(testbed, VIP)
    a = testbed.pod("pod-a")
    assert results(ask("tcp", a.netns, VIP, 80, n=1)) == {Result.REFUSED}
    apply(testbed, tmp_path, _web(testbed, ["pod-r"], internalTrafficPolicy="Local"))
    assert results(ask("tcp", a.netns, VIP, 80, n=2)) == {Result.TIMEOUT}


def test_session_affinity_client_ip(testbed: Testbed, tmp_path: Path) -> None:
    affinity = {"sessionAffinity": "ClientIP"}
    objs = _web(testbed, ["pod-b", "pod-c", "pod-r"], **affinity)
    apply(testbed, tmp_path, objs)
    a, b = testbed.pod("pod-a"), testbed.pod("pod-b")
    first = answers(ask("tcp", a.netns, VIP, 80))
    assert len(first) == 1, f"one client, one pod: {first}"
    # Another client gets a pod too, and keeps it (its own affinity entry).
    second = answers(ask("udp", b.netns, VIP, 53))
    assert len(second) == 1, f"one client, one pod: {second}"


def test_terminating_endpoint_used_when_nothing_is_ready(testbed: Testbed, tmp_path: Path) -> None:
    b, c = testbed.pod("pod-b"), testbed.pod("pod-c")
    eps = [
        topo.endpoint(str(b.ipv4), b.node, ready=False, terminating=True),  # serving
        {  # terminating and not serving: never used
            "addresses": [str(c.ipv4)],
            "nodeName": c.node,
            "conditions": {"ready": False, "serving": False, "terminating": True},
        },
    ]
    objs = [topo.service("web", VIP, PORTS), topo.endpoint_slice("web", eps, SLICE_PORTS)]
    apply(testbed, tmp_path, objs)
    a = testbed.pod("pod-a")
    assert answers(ask("tcp", a.netns, VIP, 80)) == {"pod-b": {str(a.ipv4)}}


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_no_endpoints_is_rejected(testbed: Testbed, tmp_path: Path, proto: str) -> None:
    objs = [topo.service("web", VIP, PORTS), topo.endpoint_slice("web", [], SLICE_PORTS)]
    apply(testbed, tmp_path, objs)
    a = testbed.pod("pod-a")
    assert results(ask(proto, a.netns, VIP, SVC_PORT[proto], n=2)) == {Result.REFUSED}


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_cluster_ip_on_a_port_it_does_not_have_is_rejected(
    testbed: Testbed, tmp_path: Path, proto: str
) -> None:
    apply(testbed, tmp_path, _web(testbed, ["pod-b"]))
    a = testbed.pod("pod-a")
    assert results(ask(proto, a.netns, VIP, 8081, n=2)) == {Result.REFUSED}


def test_unallocated_service_address_is_dropped(testbed: Testbed, tmp_path: Path) -> None:
    unallocated = "10.96.200.200"
    topo.decoy(testbed, unallocated)
    a = testbed.pod("pod-a")
    assert results(ask("tcp", a.netns, unallocated, 80, n=1)) == {Result.REFUSED}
    apply(testbed, tmp_path, _web(testbed, ["pod-b"]))
    assert results(ask("tcp", a.netns, unallocated, 80, n=2)) == {Result.TIMEOUT}
    assert answers(ask("tcp", a.netns, VIP, 80, n=2)) == {"pod-b": {str(a.ipv4)}}


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_hairpin_pod_reaches_itself(testbed: Testbed, tmp_path: Path, proto: str) -> None:
    apply(testbed, tmp_path, _web(testbed, ["pod-a"]))
    a = testbed.pod("pod-a")
    seen = answers(ask(proto, a.netns, VIP, SVC_PORT[proto], n=4))
    assert seen == {"pod-a": {str(testbed.node.gateway_v4)}}


def test_convergence_old_endpoint_gone(testbed: Testbed, tmp_path: Path) -> None:
    a = testbed.pod("pod-a")
    topo.decoy(testbed, VIP)
    apply(testbed, tmp_path, _web(testbed, ["pod-b", "pod-c"]))
    assert set(answers(ask("tcp", a.netns, VIP, 80))) == {"pod-b", "pod-c"}
    apply(testbed, tmp_path, _web(testbed, ["pod-c", "pod-r"]))
    assert set(answers(ask("tcp", a.netns, VIP, 80))) == {"pod-c", "pod-r"}
    apply(testbed, tmp_path, [])  # the Service is gone: its address is unallocated now
    assert results(ask("tcp", a.netns, VIP, 80, n=2)) == {Result.TIMEOUT}


def test_udp_flow_moves_off_a_removed_endpoint(testbed: Testbed, tmp_path: Path) -> None:
    """One UDP socket keeps its conntrack entry; removing its endpoint must move the flow."""
    a = testbed.pod("pod-a")
    apply(testbed, tmp_path, _web(testbed, ["pod-b"]))
    with UdpSession(a.netns, VIP, 53) as session:
        assert session.ask().pod == "pod-b"
        apply(testbed, tmp_path, _web(testbed, ["pod-c"]))
        after = [session.ask() for _ in range(3)]
    assert {o.pod for o in after} == {"pod-c"}, [str(o) for o in after]


def test_other_services_unaffected_by_a_change(testbed: Testbed, tmp_path: Path) -> None:
    other_vip = "10.96.0.11"
    b, c = testbed.pod("pod-b"), testbed.pod("pod-c")
    other = [
        topo.service("other", other_vip, PORTS),
        topo.endpoint_slice("other", [topo.endpoint(str(c.ipv4), c.node)], SLICE_PORTS),
    ]
    apply(testbed, tmp_path, [*_web(testbed, ["pod-b"]), *other])
    a = testbed.pod("pod-a")
    with UdpSession(a.netns, other_vip, 53) as session:
        assert session.ask().pod == "pod-c"
        apply(testbed, tmp_path, [*_web(testbed, [b.name, "pod-r"]), *other])
        assert session.ask().pod == "pod-c"
    assert request("tcp", a.netns, other_vip, 80).pod == "pod-c"


def test_invalid_service_is_left_out_and_the_rest_programmed(
    testbed: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = topo.service("bad", "10.96.0.12", [{"name": "tcp", "port": 70000, "targetPort": 8080}])
    topo.write_manifests(tmp_path, [testbed.node_manifest(), *_web(testbed, ["pod-b"]), bad])
    assert topo.run_once(testbed, tmp_path) == topo.EXIT_INVALID
    err = capsys.readouterr().err
    assert "Service default/bad" in err
    assert "70000" in err
    a = testbed.pod("pod-a")
    assert answers(ask("tcp", a.netns, VIP, 80, n=4)) == {"pod-b": {str(a.ipv4)}}


def test_udp_flow_rejected_while_empty_reaches_a_new_endpoint(
    testbed: Testbed, tmp_path: Path
) -> None:
    """The same UDP socket, rejected while the service had no endpoints, is answered once one
    appears (the rejected packets never got a confirmed conntrack entry to get stuck on)."""
    a = testbed.pod("pod-a")
    apply(testbed, tmp_path, _web(testbed, []))
    with UdpSession(a.netns, VIP, 53) as session:
        assert session.ask().result is Result.REFUSED
        apply(testbed, tmp_path, _web(testbed, ["pod-c"]))
        after = [session.ask() for _ in range(3)]
    assert {o.pod for o in after} == {"pod-c"}, [str(o) for o in after]
