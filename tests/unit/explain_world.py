"""Three Services for the explain and services-list tests: web (two ports, a NodePort, a
load-balancer IP with source ranges), empty (no endpoints) and local (Local policies, its one
endpoint elsewhere), planned on one node."""

from __future__ import annotations

from ipaddress import ip_address, ip_network

from nlproxy.nft.ir import Family, Ruleset
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.planner import plan
from tests.unit.builders import NODE, endpoint, eps_slice, node, port, service, snapshot

LOCAL = [ip_address("192.168.0.2"), ip_address("127.0.0.1")]


LB = "5.5.5.5"


def planned_rulesets() -> dict[Family, Ruleset]:
    p = port
    svcs = [
        service(
            "ns",
            "web",
            "172.30.0.10",
            [p("ns", "web", "http", 80, node_port=30080), p("ns", "web", "dns", 53, "UDP")],
            load_balancer_ips=[LB],
            load_balancer_source_ranges=["203.0.113.0/25"],
        ),
        service("ns", "empty", "172.30.0.11"),
        service(
            "ns",
            "local",
            "172.30.0.12",
            [p("ns", "local", node_port=30081)],
            load_balancer_ips=["5.5.5.6"],
            external_policy_local=True,
            internal_policy_local=True,
        ),
    ]
    slices = [
        eps_slice(
            "ns",
            "web",
            [endpoint("10.0.1.4", NODE), endpoint("10.0.2.4")],
            [("http", 8080, "TCP"), ("dns", 5353, "UDP")],
        ),
        eps_slice("ns", "empty", []),
        eps_slice("ns", "local", [endpoint("10.0.2.5")]),
    ]
    config = ProxyConfig(
        node_name=NODE,
        cluster_cidrs=(ip_network("10.0.0.0/8"),),
        service_cidrs=(ip_network("172.30.0.0/16"),),
    )
    return plan(snapshot(svcs, slices, node=node(["192.168.0.2"])), config).rulesets
