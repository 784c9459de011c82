"""Dual-stack Services: the ``ip6 nlproxy`` table carries IPv6 the way ``ip nlproxy`` does IPv4."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nlproxy.demo.echo import Result
from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.topo import PORTS, SLICE_PORTS, SVC_PORT, answers, apply, ask, results

testbed6 = topo.testbed6

VIP4, VIP6 = "10.96.0.30", "fd00:10:96::30"
NODE_PORT = 30080


def _dual(tb: Testbed, pods: list[str], name: str = "dual") -> list[dict[str, Any]]:
    ports = [{**p, "nodePort": NODE_PORT + i} for i, p in enumerate(PORTS)]
    svc = topo.service(
        name, [VIP4, VIP6], ports, type="NodePort", ipFamilyPolicy="RequireDualStack"
    )
    if name != "dual":
        svc["spec"].update(clusterIP="10.96.0.31", clusterIPs=["10.96.0.31", "fd00:10:96::31"])
        for p in svc["spec"]["ports"]:
            p["nodePort"] += 100
    v4 = [topo.endpoint(str(tb.pod(p).ipv4), tb.pod(p).node) for p in pods]
    v6 = [topo.endpoint(str(tb.pod(p).ipv6), tb.pod(p).node) for p in pods]
    return [
        svc,
        topo.endpoint_slice(name, v4, SLICE_PORTS, family="IPv4"),
        topo.endpoint_slice(name, v6, SLICE_PORTS, family="IPv6"),
    ]


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_cluster_ip_both_families_from_pod(testbed6: Testbed, tmp_path: Path, proto: str) -> None:
    tb = testbed6
    apply(tb, tmp_path, _dual(tb, ["pod-b", "pod-r"]))
    a = tb.pod("pod-a")
    seen6 = answers(ask(proto, a.netns, VIP6, SVC_PORT[proto]))
    assert seen6 == {"pod-b": {str(a.ipv6)}, "pod-r": {str(a.ipv6)}}
    seen4 = answers(ask(proto, a.netns, VIP4, SVC_PORT[proto]))
    assert seen4 == {"pod-b": {str(a.ipv4)}, "pod-r": {str(a.ipv4)}}


def test_nodeport_ipv6_from_client_masquerades(testbed6: Testbed, tmp_path: Path) -> None:
    tb = testbed6
    apply(tb, tmp_path, _dual(tb, ["pod-b", "pod-r"]))
    seen = answers(ask("tcp", tb.client.netns, str(tb.node.ipv6), NODE_PORT))
    assert seen == {"pod-b": {str(tb.node.gateway_v6)}, "pod-r": {str(tb.node.ipv6)}}


def test_ipv6_hairpin(testbed6: Testbed, tmp_path: Path) -> None:
    tb = testbed6
    apply(tb, tmp_path, _dual(tb, ["pod-a"]))
    a = tb.pod("pod-a")
    assert answers(ask("tcp", a.netns, VIP6, 80, n=4)) == {"pod-a": {str(tb.node.gateway_v6)}}


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_ipv6_no_endpoints_rejected(testbed6: Testbed, tmp_path: Path, proto: str) -> None:
    tb = testbed6
    apply(tb, tmp_path, [*_dual(tb, ["pod-b"]), *_dual(tb, [], name="empty")])
    a = tb.pod("pod-a")
    outcomes = ask(proto, a.netns, "fd00:10:96::31", SVC_PORT[proto], n=2)
    assert results(outcomes) == {Result.REFUSED}
    # The other service in the same table still works.
    assert set(answers(ask(proto, a.netns, VIP6, SVC_PORT[proto], n=2))) == {"pod-b"}
