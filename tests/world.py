"""The tracer's world and case table, shared by the unit tracer tests and the kernel tests.

The world has one node (``test-node``, zone-a, 192.168.0.2 / fd00:192::2, also 192.168.1.2) and a
service per behaviour; pods are 10.0.0.0/8 and fd00:10::/64, services 172.30.0.0/16 and
fd00:172:30::/112. Each case: (source, protocol, destination, port) -> (verdict, endpoints,
masquerade), kube-proxy's nftables tracer cases restated; ``tests/unit/test_tracer.py`` traces
them over the planned rulesets, ``tests/kernel/test_planner_kernel.py`` over what the kernel holds
after loading them.
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import ip_address, ip_network
from typing import Any

import pytest

from nlproxy.cluster.model import ClusterSnapshot, Protocol, Service
from nlproxy.nft.ir import Family, Ruleset
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.tracer import TraceResult, trace
from tests.unit.builders import NODE, endpoint, eps_slice, node, port, service, snapshot

POD, EXT, BLOCKED = "10.0.0.2", "203.0.113.2", "203.0.113.130"
NODE_IP, NODE_ALT = "192.168.0.2", "192.168.1.2"
POD6, EXT6, BLOCKED6, NODE6 = "fd00:10::2", "2001:db8:ffff::2", "2001:db8:eeee::2", "fd00:192::2"
LOCAL = (NODE_IP, NODE_ALT, NODE6, "5.5.5.6")
TCP, UDP, SCTP = Protocol.TCP, Protocol.UDP, Protocol.SCTP


def _svc(
    ns: str, name: str, ips: str | list[str], *, node_port: int | None = None, **overrides: Any
) -> Service:
    """A Service of one TCP port p80 (with ``node_port``, that NodePort); ``overrides`` as
    :func:`tests.unit.builders.service` takes them."""
    ports = None if node_port is None else [port(ns, name, node_port=node_port)]
    return service(ns, name, ips, ports, **overrides)


def world() -> ClusterSnapshot:
    s, e, sl, p = _svc, endpoint, eps_slice, port
    here = NODE
    svcs = [
        s("ns1", "svc1", "172.30.0.41"),
        s("ns2", "svc2", "172.30.0.42", node_port=3001, external_policy_local=True,
          external_ips=["192.168.99.22"], health_check_node_port=30000),
        s("ns3", "svc3", "172.30.0.43", node_port=3003, load_balancer_ips=["1.2.3.3"]),
        service("ns4", "svc4", "172.30.0.44", [
            p("ns4", "svc4", "dns", 53, "UDP", target="dns"),
            p("ns4", "svc4", "dns-tcp", 53, target="dns-tcp"),
        ]),
        s("ns5", "svc5", "172.30.0.45", node_port=3005, load_balancer_ips=["5.5.5.5"],
          load_balancer_source_ranges=["203.0.113.0/25"], external_policy_local=True),
        s("ns5", "svc5b", "172.30.0.65", load_balancer_ips=["5.5.5.6"],
          load_balancer_source_ranges=["192.168.0.0/24"]),
        s("ns6", "svc6", "172.30.0.46", node_port=3006, external_ips=["192.168.99.66"]),
        s("ns7", "svc7", "172.30.0.47", node_port=3007, load_balancer_ips=["7.7.7.7"],
          external_ips=["192.168.99.77"], external_policy_local=True),
        s("ns8", "svc8", "172.30.0.48", internal_policy_local=True),
        s("ns8", "svc8b", "172.30.0.58", internal_policy_local=True),
        s("ns9", "svc9", "172.30.0.49", node_port=3009, affinity_timeout=10800),
        s("ns9", "svc9b", "172.30.0.59", node_port=3019, affinity_timeout=60,
          external_policy_local=True),
        # ClusterIP only: the map layout (one clients map for the port, not a set per endpoint).
        s("ns9", "svc9c", "172.30.0.69", affinity_timeout=300),
        # External and LoadBalancer addresses, both policies Local.
        s("ns9", "svc9d", "172.30.0.79", load_balancer_ips=["9.9.9.9"],
          external_ips=["192.168.99.79"], affinity_timeout=120, internal_policy_local=True,
          external_policy_local=True),
        # IPv6 (the per-endpoint layout).
        s("ns65", "v6sticky", "fd00:172:30::65", node_port=3065, affinity_timeout=120),
        s("ns10", "svc10", "172.30.0.50"),
        s("ns10", "svc10b", "172.30.0.60"),
        s("ns11", "svc11", "172.30.0.51", node_port=3011, external_policy_local=True),
        s("ns12", "zones", "172.30.0.52"),
        s("ns12", "partial", "172.30.0.53"),
        s("ns12", "nodes", "172.30.0.54", traffic_distribution="PreferSameNode"),
        service("ns15", "sctp", "172.30.0.55", [p("ns15", "sctp", "diameter", 3868, "SCTP")]),
        s("ns16", "dup", "172.30.0.56"),
        service("ns17", "udp", "172.30.0.57", [p("ns17", "udp", "dns", 53, "UDP")]),
        s("ns61", "dual", ["172.30.0.61", "fd00:172:30::61"]),
        s("ns62", "v6np", "fd00:172:30::62", node_port=3062, external_policy_local=True),
        s("ns63", "v6none", "fd00:172:30::63", load_balancer_ips=["2001:db8:5::5"]),
        s("ns64", "v6fw", "fd00:172:30::64", load_balancer_ips=["2001:db8:5::6"],
          load_balancer_source_ranges=["2001:db8:ffff::/64"]),
    ]  # fmt: skip
    slices = [
        sl("ns1", "svc1", [e("10.180.0.1")]),
        sl("ns2", "svc2", [e("10.180.0.2", here), e("10.180.1.2")]),
        sl("ns3", "svc3", [e("10.180.0.3", here), e("10.180.1.3")]),
        sl("ns4", "svc4", [e("10.180.0.4")], [("dns", 5353, "UDP"), ("dns-tcp", 5354, "TCP")],
           slice_name="a"),
        sl("ns4", "svc4", [e("10.180.2.4")], [("dns", 5300, "UDP")], slice_name="b"),
        sl("ns5", "svc5", [e("10.180.0.5", here)]),
        sl("ns5", "svc5b", [e("10.180.1.55")]),
        sl("ns7", "svc7", [e("10.180.1.7")]),
        sl("ns8", "svc8", [e("10.180.0.8", here), e("10.180.1.8")]),
        sl("ns8", "svc8b", [e("10.180.1.58")]),
        sl("ns9", "svc9", [e("10.180.0.9", here), e("10.180.1.9")]),
        sl("ns9", "svc9b", [e("10.180.0.19", here), e("10.180.1.19")]),
        sl("ns9", "svc9c", [e("10.180.0.29", here), e("10.180.1.29")]),
        sl("ns9", "svc9d", [e("10.180.0.39", here), e("10.180.1.39")]),
        sl("ns65", "v6sticky", [e("fd00:10:180::65", here), e("fd00:10:180::66")]),
        sl("ns10", "svc10", [e("10.180.0.10", ready=False, serving=True, terminating=True),
                             e("10.180.0.11", ready=False, serving=False, terminating=True)]),
        sl("ns10", "svc10b", [e("10.180.0.12"),
                              e("10.180.0.13", ready=False, serving=True, terminating=True)]),
        sl("ns11", "svc11", [e("10.180.1.11"),
                             e("10.180.0.11", here, ready=False, serving=True, terminating=True)]),
        sl("ns12", "zones", [e("10.180.3.1", hints_zones={"zone-a"}),
                             e("10.180.3.2", hints_zones={"zone-b"})]),
        sl("ns12", "partial", [e("10.180.3.3", hints_zones={"zone-a"}), e("10.180.3.4")]),
        sl("ns12", "nodes", [e("10.180.3.5", hints_zones={"zone-b"}, hints_nodes={NODE}),
                             e("10.180.3.6", hints_zones={"zone-a"}, hints_nodes={"other-node"})]),
        sl("ns15", "sctp", [e("10.180.0.15")], [("diameter", 3868, "SCTP")]),
        sl("ns16", "dup", [e("10.180.0.16")], slice_name="dup-a"),
        sl("ns16", "dup", [e("10.180.0.16"), e("10.180.0.17")], slice_name="dup-b"),
        sl("ns61", "dual", [e("10.180.6.1")]),
        sl("ns61", "dual", [e("fd00:10:180::1")]),
        sl("ns62", "v6np", [e("fd00:10:180::2", here), e("fd00:10:180::3")]),
        sl("ns64", "v6fw", [e("fd00:10:180::6")]),
    ]  # fmt: skip
    return snapshot(svcs, slices, node=node((NODE_IP, NODE6, NODE_ALT), zone="zone-a"))


def config(**overrides: object) -> ProxyConfig:
    fields: dict[str, object] = {
        "node_name": NODE,
        "cluster_cidrs": (ip_network("10.0.0.0/8"), ip_network("fd00:10::/64")),
        "service_cidrs": (ip_network("172.30.0.0/16"), ip_network("fd00:172:30::/112")),
    }
    fields.update(overrides)
    return ProxyConfig(**fields)  # type: ignore[arg-type]


def run(rs: dict[Family, Ruleset], src: str, proto: Protocol, dst: str, dport: int) -> TraceResult:
    d = ip_address(dst)
    family = Family.IP if d.version == 4 else Family.IP6
    local = [ip_address(a) for a in LOCAL]
    return trace(rs[family], ip_address(src), proto, d, dport, local_addrs=local)


@dataclass(frozen=True, slots=True)
class Case:
    """One connection and what the rules must do with it."""

    src: str
    proto: Protocol
    dst: str
    dport: int
    endpoints: str  # the endpoints it may reach, space-separated ("" when none)
    masq: bool
    verdict: str

    @property
    def expected(self) -> TraceResult:
        return TraceResult(self.verdict, frozenset(self.endpoints.split()), self.masq)  # type: ignore[arg-type]

    def trace(self, rulesets: dict[Family, Ruleset]) -> TraceResult:
        return run(rulesets, self.src, self.proto, self.dst, self.dport)


def case(
    src: str, proto: Protocol, dst: str, dport: int, endpoints: str = "", *,
    masq: bool = False, verdict: str = "ACCEPT", id: str,
) -> object:  # fmt: skip
    return pytest.param(Case(src, proto, dst, dport, endpoints, masq, verdict), id=id)


CASES = [
    # ClusterIP, masquerade, hairpin, service CIDR checks.
    case(POD, TCP, "172.30.0.41", 80, "10.180.0.1:80", id="clusterip-from-pod"),
    case(EXT, TCP, "172.30.0.41", 80, "10.180.0.1:80", masq=True, id="clusterip-from-outside-masq"),
    case(NODE_IP, TCP, "172.30.0.41", 80, "10.180.0.1:80", masq=True,
         id="clusterip-from-node-masq"),
    case("10.180.0.1", TCP, "172.30.0.41", 80, "10.180.0.1:80", masq=True, id="clusterip-hairpin"),
    case(POD, TCP, "172.30.0.41", 81, verdict="REJECT", id="clusterip-wrong-port-reject"),
    case(POD, UDP, "172.30.0.41", 80, verdict="REJECT", id="clusterip-wrong-proto-reject"),
    case(NODE_IP, TCP, "172.30.0.41", 81, verdict="REJECT", id="clusterip-wrong-port-from-node"),
    case(POD, TCP, "172.30.255.1", 80, verdict="DROP", id="unallocated-clusterip-drop"),
    case(POD, TCP, "172.31.0.1", 80, id="outside-service-cidr-untouched"),
    case(EXT, TCP, "10.180.0.1", 80, id="direct-to-pod-untouched"),
    # Several ports, named target ports resolved per slice, UDP, SCTP.
    case(POD, UDP, "172.30.0.44", 53, "10.180.0.4:5353 10.180.2.4:5300",
         id="named-port-per-slice-udp"),
    case(POD, TCP, "172.30.0.44", 53, "10.180.0.4:5354", id="named-port-second-port-tcp"),
    case(POD, SCTP, "172.30.0.55", 3868, "10.180.0.15:3868", id="sctp"),
    case(POD, TCP, "172.30.0.56", 80, "10.180.0.16:80 10.180.0.17:80", id="dedup-across-slices"),
    # NodePort / LoadBalancer with externalTrafficPolicy Cluster.
    case(EXT, TCP, NODE_IP, 3003, "10.180.0.3:80 10.180.1.3:80", masq=True, id="nodeport-cluster"),
    case(POD, TCP, NODE_IP, 3003, "10.180.0.3:80 10.180.1.3:80", masq=True,
         id="nodeport-cluster-from-pod"),
    case(NODE_IP, TCP, NODE_IP, 3003, "10.180.0.3:80 10.180.1.3:80", masq=True,
         id="nodeport-from-node"),
    case(EXT, TCP, NODE_ALT, 3003, id="nodeport-not-on-secondary-ip"),
    case(NODE_IP, TCP, "127.0.0.1", 3003, id="nodeport-not-on-localhost"),
    case(EXT, UDP, NODE_IP, 3003, id="nodeport-wrong-proto"),
    case(EXT, TCP, "1.2.3.3", 80, "10.180.0.3:80 10.180.1.3:80", masq=True, id="lb-cluster"),
    case(POD, TCP, "1.2.3.3", 80, "10.180.0.3:80 10.180.1.3:80", masq=True,
         id="lb-cluster-from-pod"),
    case(EXT, TCP, "1.2.3.3", 81, id="lb-other-port-untouched"),
    case(EXT, TCP, "172.30.0.43", 80, "10.180.0.3:80 10.180.1.3:80", masq=True, id="lb-clusterip"),
    # externalTrafficPolicy Local.
    case(EXT, TCP, NODE_IP, 3001, "10.180.0.2:80", id="etp-local-nodeport-keeps-source"),
    case(POD, TCP, NODE_IP, 3001, "10.180.0.2:80 10.180.1.2:80",
         id="etp-local-nodeport-pod-shortcut"),
    case(NODE_IP, TCP, NODE_IP, 3001, "10.180.0.2:80 10.180.1.2:80", masq=True,
         id="etp-local-nodeport-node"),
    case(EXT, TCP, "192.168.99.22", 80, "10.180.0.2:80", id="etp-local-externalip"),
    case(POD, TCP, "192.168.99.22", 80, "10.180.0.2:80 10.180.1.2:80",
         id="etp-local-externalip-pod"),
    case(EXT, TCP, "172.30.0.42", 80, "10.180.0.2:80 10.180.1.2:80", masq=True,
         id="etp-local-clusterip-is-cluster"),
    case(EXT, TCP, NODE_IP, 3007, verdict="DROP", id="etp-local-no-local-endpoints-nodeport-drop"),
    case(EXT, TCP, "7.7.7.7", 80, verdict="DROP", id="etp-local-no-local-endpoints-lb-drop"),
    case(EXT, TCP, "192.168.99.77", 80, verdict="DROP",
         id="etp-local-no-local-endpoints-extip-drop"),
    case(POD, TCP, "7.7.7.7", 80, "10.180.1.7:80", id="etp-local-no-local-endpoints-pod-ok"),
    case(POD, TCP, NODE_IP, 3007, "10.180.1.7:80", id="etp-local-no-local-endpoints-pod-nodeport"),
    case(NODE_IP, TCP, NODE_IP, 3007, "10.180.1.7:80", masq=True,
         id="etp-local-no-local-node-nodeport"),
    case(NODE_IP, TCP, "7.7.7.7", 80, verdict="DROP", id="etp-local-no-local-node-lb-drop"),
    case(POD, TCP, "172.30.0.47", 80, "10.180.1.7:80", id="etp-local-no-local-clusterip-ok"),
    case(EXT, TCP, NODE_IP, 3011, "10.180.0.11:80", id="etp-local-terminating-local"),
    case(POD, TCP, "172.30.0.51", 80, "10.180.1.11:80", id="etp-local-cluster-set-ready-only"),
    # internalTrafficPolicy Local.
    case(POD, TCP, "172.30.0.48", 80, "10.180.0.8:80", id="itp-local"),
    case(EXT, TCP, "172.30.0.48", 80, "10.180.0.8:80", masq=True, id="itp-local-from-outside-masq"),
    case(POD, TCP, "172.30.0.58", 80, verdict="DROP", id="itp-local-no-local-drop"),
    # No endpoints.
    case(POD, TCP, "172.30.0.46", 80, verdict="REJECT", id="no-endpoints-clusterip"),
    case(NODE_IP, TCP, "172.30.0.46", 80, verdict="REJECT", id="no-endpoints-from-node"),
    case(EXT, TCP, NODE_IP, 3006, verdict="REJECT", id="no-endpoints-nodeport"),
    case(EXT, TCP, "192.168.99.66", 80, verdict="REJECT", id="no-endpoints-externalip"),
    case(POD, UDP, "172.30.0.57", 53, verdict="REJECT", id="no-endpoints-udp"),
    # loadBalancerSourceRanges.
    case(EXT, TCP, "5.5.5.5", 80, "10.180.0.5:80", id="source-ranges-allowed"),
    case(BLOCKED, TCP, "5.5.5.5", 80, verdict="DROP", id="source-ranges-blocked"),
    case(NODE_IP, TCP, "5.5.5.5", 80, verdict="DROP", id="source-ranges-node-not-in-range"),
    case(BLOCKED, TCP, NODE_IP, 3005, "10.180.0.5:80", id="source-ranges-not-for-nodeport"),
    case(BLOCKED, TCP, "172.30.0.45", 80, "10.180.0.5:80", masq=True,
         id="source-ranges-not-for-clusterip"),
    case(NODE_IP, TCP, "5.5.5.6", 80, "10.180.1.55:80", masq=True,
         id="source-ranges-node-in-range"),
    case("5.5.5.6", TCP, "5.5.5.6", 80, "10.180.1.55:80", masq=True, id="source-ranges-from-vip"),
    case(EXT, TCP, "5.5.5.6", 80, verdict="DROP", id="source-ranges-vip-blocked"),
    # Endpoint conditions and topology.
    case(POD, TCP, "172.30.0.50", 80, "10.180.0.10:80", id="serving-terminating-fallback"),
    case(POD, TCP, "172.30.0.60", 80, "10.180.0.12:80", id="ready-preferred-over-terminating"),
    case(POD, TCP, "172.30.0.52", 80, "10.180.3.1:80", id="topology-zone-hints"),
    case(POD, TCP, "172.30.0.53", 80, "10.180.3.3:80 10.180.3.4:80",
         id="topology-ignored-missing-hint"),
    case(POD, TCP, "172.30.0.54", 80, "10.180.3.5:80", id="topology-node-hints"),
    # ClientIP affinity.
    case(POD, TCP, "172.30.0.49", 80, "10.180.0.9:80 10.180.1.9:80", id="affinity-clusterip"),
    case(EXT, TCP, "172.30.0.49", 80, "10.180.0.9:80 10.180.1.9:80", masq=True,
         id="affinity-outside-masq"),
    case(EXT, TCP, NODE_IP, 3009, "10.180.0.9:80 10.180.1.9:80", masq=True, id="affinity-nodeport"),
    case(EXT, TCP, NODE_IP, 3019, "10.180.0.19:80", id="affinity-etp-local"),
    case(POD, TCP, NODE_IP, 3019, "10.180.0.19:80 10.180.1.19:80", id="affinity-etp-local-pod"),
    case(NODE_IP, TCP, NODE_IP, 3019, "10.180.0.19:80 10.180.1.19:80", masq=True,
         id="affinity-etp-local-node"),
    case("10.180.0.9", TCP, "172.30.0.49", 80, "10.180.0.9:80 10.180.1.9:80", masq=True,
         id="affinity-hairpin"),
    case(POD, TCP, "172.30.0.69", 80, "10.180.0.29:80 10.180.1.29:80", id="affinity-map-pod"),
    case(EXT, TCP, "172.30.0.69", 80, "10.180.0.29:80 10.180.1.29:80", masq=True,
         id="affinity-map-outside-masq"),
    case(NODE_IP, TCP, "172.30.0.69", 80, "10.180.0.29:80 10.180.1.29:80", masq=True,
         id="affinity-map-from-node"),
    case(POD, TCP, "172.30.0.69", 81, verdict="REJECT", id="affinity-map-wrong-port"),
    case(POD, TCP, "172.30.0.79", 80, "10.180.0.39:80", id="affinity-itp-local"),
    case(EXT, TCP, "9.9.9.9", 80, "10.180.0.39:80", id="affinity-lb-etp-local"),
    case(EXT, TCP, "192.168.99.79", 80, "10.180.0.39:80", id="affinity-external-ip-etp-local"),
    case(POD, TCP, "9.9.9.9", 80, "10.180.0.39:80 10.180.1.39:80", id="affinity-lb-etp-local-pod"),
    case(POD6, TCP, "fd00:172:30::65", 80, "[fd00:10:180::65]:80 [fd00:10:180::66]:80",
         id="affinity-v6-clusterip"),
    case(EXT6, TCP, NODE6, 3065, "[fd00:10:180::65]:80 [fd00:10:180::66]:80", masq=True,
         id="affinity-v6-nodeport"),
    # IPv6: the same shape in the ip6 table.
    case(POD6, TCP, "fd00:172:30::61", 80, "[fd00:10:180::1]:80", id="v6-clusterip"),
    case(POD, TCP, "172.30.0.61", 80, "10.180.6.1:80", id="dual-stack-v4-side"),
    case(EXT6, TCP, "fd00:172:30::61", 80, "[fd00:10:180::1]:80", masq=True,
         id="v6-clusterip-outside"),
    case("fd00:10:180::1", TCP, "fd00:172:30::61", 80, "[fd00:10:180::1]:80", masq=True,
         id="v6-hairpin"),
    case(POD6, TCP, "fd00:172:30::61", 81, verdict="REJECT", id="v6-wrong-port"),
    case(POD6, TCP, "fd00:172:30::ffff", 80, verdict="DROP", id="v6-unallocated"),
    case(EXT6, TCP, NODE6, 3062, "[fd00:10:180::2]:80", id="v6-etp-local-nodeport"),
    case(POD6, TCP, NODE6, 3062, "[fd00:10:180::2]:80 [fd00:10:180::3]:80", id="v6-etp-local-pod"),
    case(NODE6, TCP, NODE6, 3062, "[fd00:10:180::2]:80 [fd00:10:180::3]:80", masq=True,
         id="v6-node"),
    case(NODE6, TCP, "::1", 3062, id="v6-nodeport-not-on-localhost"),
    case(POD6, TCP, "fd00:172:30::63", 80, verdict="REJECT", id="v6-no-endpoints"),
    case(EXT6, TCP, "2001:db8:5::5", 80, verdict="REJECT", id="v6-no-endpoints-lb"),
    case(EXT6, TCP, "2001:db8:5::6", 80, "[fd00:10:180::6]:80", masq=True,
         id="v6-source-ranges-ok"),
    case(BLOCKED6, TCP, "2001:db8:5::6", 80, verdict="DROP", id="v6-source-ranges-blocked"),
]  # fmt: skip
