"""The packet tracer against the kernel: one table of cases, each traced and really sent.

The ruleset is read back from the node after ``run --once`` and traced; the same connection is
then made with real packets. Verdict, endpoints and masquerading must agree with each other and
with the expectation in the table, which keeps the tracer honest (and the datapath too).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import ip_address
from typing import Any

import pytest

from nlproxy.cluster.model import Protocol
from nlproxy.demo.echo import Outcome, Result, request
from nlproxy.demo.testbed import OUTSIDE_NET_V4, OUTSIDE_NET_V6, Testbed
from nlproxy.nft.ir import FAMILIES, Family
from nlproxy.nft.readback import read_ruleset
from nlproxy.proxy.naming import TABLE as TABLE_NAME
from nlproxy.proxy.tracer import TraceResult, trace
from tests.kernel import topo
from tests.kernel.topo import PORTS, SLICE_PORTS

LB_IP, EXTERNAL_IP = "192.168.70.10", "192.168.60.10"
# The node's source towards service IPs: its address on the link of its default route.
NODE_SOURCE, NODE_SOURCE6 = OUTSIDE_NET_V4[1], OUTSIDE_NET_V6[1]
_VERDICT = {Result.ANSWERED: "ACCEPT", Result.TIMEOUT: "DROP", Result.REFUSED: "REJECT"}


def _svc(tb: Testbed, name: str, vip: str, pods: list[str], **spec: Any) -> list[dict[str, Any]]:
    """A Service with its slice; ``vip6=`` makes it dual stack (and adds an IPv6 slice)."""
    node_ports = spec.pop("node_ports", None)
    vip6 = spec.pop("vip6", None)
    ports = [dict(p) for p in PORTS]
    if node_ports:
        for p, np in zip(ports, node_ports, strict=True):
            p["nodePort"] = np
    eps = [topo.endpoint(str(tb.pod(p).ipv4), tb.pod(p).node) for p in pods]
    objs = [
        topo.service(name, [vip, vip6] if vip6 else vip, ports, **spec),
        topo.endpoint_slice(name, eps, SLICE_PORTS),
    ]
    if vip6:
        eps6 = [topo.endpoint(str(tb.pod(p).ipv6), tb.pod(p).node) for p in pods]
        objs.append(topo.endpoint_slice(name, eps6, SLICE_PORTS, family="IPv6"))
    return objs


def _objects(tb: Testbed) -> list[dict[str, Any]]:
    lb_status = {"loadBalancer": {"ingress": [{"ip": LB_IP}]}}
    allowed = f"{tb.client.ipv4[0]}/32"
    return [
        tb.node_manifest(),
        *_svc(tb, "web", "10.96.0.10", ["pod-b", "pod-r"], vip6="fd00:10:96::10"),
        *_svc(
            tb,
            "np",
            "10.96.0.20",
            ["pod-a", "pod-r"],
            type="NodePort",
            node_ports=[30080, 30053],
            vip6="fd00:10:96::20",
        ),
        *_svc(
            tb,
            "np-local",
            "10.96.0.21",
            ["pod-a", "pod-r"],
            type="NodePort",
            externalTrafficPolicy="Local",
            node_ports=[30081, 30054],
        ),
        *_svc(
            tb,
            "np-remote",
            "10.96.0.22",
            ["pod-r"],
            type="NodePort",
            externalTrafficPolicy="Local",
            node_ports=[30082, 30055],
        ),
        *_svc(tb, "empty", "10.96.0.30", [], vip6="fd00:10:96::30"),
        *_svc(tb, "self", "10.96.0.40", ["pod-a"], vip6="fd00:10:96::40"),
        *_svc(
            tb,
            "lb",
            "10.96.0.50",
            ["pod-b", "pod-c"],
            type="LoadBalancer",
            node_ports=[30090, 30091],
            loadBalancerSourceRanges=[allowed],
            status=lb_status,
        ),
        *_svc(tb, "ext", "10.96.0.60", ["pod-c"], externalIPs=[EXTERNAL_IP]),
    ]


@dataclass(frozen=True)
class Case:
    sender: str  # a pod name, "node", "client" or "client-alt" (the second client address)
    proto: str
    dst: str  # an address, or "node" for node1's InternalIP
    port: int
    verdict: str
    pods: frozenset[str] = frozenset()
    masquerade: bool = False


def case(
    ident: str,
    sender: str,
    proto: str,
    dst: str,
    port: int,
    verdict: str,
    pods: tuple[str, ...] = (),
    *,
    masquerade: bool = False,
) -> Any:
    return pytest.param(
        Case(sender, proto, dst, port, verdict, frozenset(pods), masquerade), id=ident
    )


CASES = [
    case("clusterip-from-pod", "pod-a", "tcp", "10.96.0.10", 80, "ACCEPT", ("pod-b", "pod-r")),
    case("clusterip-udp-from-pod", "pod-c", "udp", "10.96.0.10", 53, "ACCEPT", ("pod-b", "pod-r")),
    case(
        "clusterip-from-node",
        "node",
        "tcp",
        "10.96.0.10",
        80,
        "ACCEPT",
        ("pod-b", "pod-r"),
        masquerade=True,
    ),
    case("clusterip-wrong-port", "pod-a", "tcp", "10.96.0.10", 81, "REJECT"),
    case("no-endpoints", "pod-a", "udp", "10.96.0.30", 53, "REJECT"),
    case("unallocated", "pod-a", "tcp", "10.96.9.9", 80, "DROP"),
    case("hairpin", "pod-a", "tcp", "10.96.0.40", 80, "ACCEPT", ("pod-a",), masquerade=True),
    case(
        "nodeport-cluster",
        "client",
        "tcp",
        "node",
        30080,
        "ACCEPT",
        ("pod-a", "pod-r"),
        masquerade=True,
    ),
    case("nodeport-local", "client", "udp", "node", 30054, "ACCEPT", ("pod-a",)),
    case("nodeport-local-none-here", "client", "tcp", "node", 30082, "DROP"),
    case("lb-allowed", "client", "tcp", LB_IP, 80, "ACCEPT", ("pod-b", "pod-c"), masquerade=True),
    case("lb-denied", "client-alt", "tcp", LB_IP, 80, "DROP"),
    case("external-ip", "client", "udp", EXTERNAL_IP, 53, "ACCEPT", ("pod-c",), masquerade=True),
    case(
        "v6-clusterip-from-pod", "pod-a", "udp", "fd00:10:96::10", 53, "ACCEPT", ("pod-b", "pod-r")
    ),
    case(
        "v6-clusterip-from-node",
        "node",
        "tcp",
        "fd00:10:96::10",
        80,
        "ACCEPT",
        ("pod-b", "pod-r"),
        masquerade=True,
    ),
    case("v6-clusterip-wrong-port", "pod-a", "tcp", "fd00:10:96::10", 81, "REJECT"),
    case("v6-no-endpoints", "pod-a", "tcp", "fd00:10:96::30", 80, "REJECT"),
    case("v6-unallocated", "pod-a", "udp", "fd00:10:96::99", 53, "DROP"),
    case("v6-hairpin", "pod-a", "udp", "fd00:10:96::40", 53, "ACCEPT", ("pod-a",), masquerade=True),
    case(
        "v6-nodeport-cluster",
        "client",
        "udp",
        "node6",
        30053,
        "ACCEPT",
        ("pod-a", "pod-r"),
        masquerade=True,
    ),
]


@dataclass
class Programmed:
    tb: Testbed
    rulesets: dict[Family, Any]


@pytest.fixture(scope="module")
def programmed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Programmed]:
    with Testbed(tag="tkt", ipv6=True) as tb:
        directory = tmp_path_factory.mktemp("manifests")
        topo.write_manifests(directory, _objects(tb))
        assert topo.run_once(tb, directory) == topo.EXIT_OK
        rulesets = {f: read_ruleset(f, TABLE_NAME, netns=tb.node.netns) for f in FAMILIES}
        assert None not in rulesets.values(), f"a table is missing: {list(rulesets)}"
        yield Programmed(tb, rulesets)


def _sender(tb: Testbed, name: str, v6: bool) -> tuple[str, str, str | None]:
    """(netns, source address, address to bind or None) of a sender, in dst's family."""
    if name == "node":
        return tb.node.netns, str(NODE_SOURCE6 if v6 else NODE_SOURCE), None
    if name in ("client", "client-alt"):
        addrs = tb.client.ipv6 if v6 else tb.client.ipv4
        addr = str(addrs[0 if name == "client" else 1])
        return tb.client.netns, addr, addr if name == "client-alt" else None
    pod = tb.pod(name)
    return pod.netns, str(pod.ipv6 if v6 else pod.ipv4), None


def _send(ns: str, c: Case, dst: str, src: str | None) -> list[Outcome]:
    first = request(c.proto, ns, dst, c.port, src=src)
    if first.result is not Result.ANSWERED:  # confirm once; a failure repeats itself
        return [first, request(c.proto, ns, dst, c.port, src=src)]
    return [first, *topo.ask(c.proto, ns, dst, c.port, src=src)]


@pytest.mark.parametrize("c", CASES)
def test_tracer_agrees_with_the_kernel(programmed: Programmed, c: Case) -> None:
    tb = programmed.tb
    assert tb.node.ipv6 is not None
    assert tb.node.gateway_v6 is not None
    dst = {"node": str(tb.node.ipv4), "node6": str(tb.node.ipv6)}.get(c.dst, c.dst)
    v6 = ip_address(dst).version == 6
    ns, src, bind = _sender(tb, c.sender, v6)
    local = [tb.node.ipv4, tb.node.gateway_v4, NODE_SOURCE]
    local += [tb.node.ipv6, tb.node.gateway_v6, NODE_SOURCE6]
    traced: TraceResult = trace(
        programmed.rulesets[Family.IP6 if v6 else Family.IP],
        ip_address(src),
        Protocol(c.proto.upper()),
        ip_address(dst),
        c.port,
        local_addrs=local,
    )
    outcomes = _send(ns, c, dst, bind)
    kernel = {_VERDICT.get(o.result, o.result.value) for o in outcomes}
    assert kernel == {traced.verdict} == {c.verdict}, [str(o) for o in outcomes]
    if c.verdict != "ACCEPT":
        return
    by_ip = {str(p.ipv6 if v6 else p.ipv4): p.name for p in tb.pods.values()}
    assert {by_ip[e.rsplit(":", 1)[0].strip("[]")] for e in traced.endpoints} == c.pods
    assert {o.pod for o in outcomes} == c.pods
    assert traced.masquerade is c.masquerade
    assert ({str(o.src) for o in outcomes} != {src}) is c.masquerade
