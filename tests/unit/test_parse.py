"""Parsing raw Kubernetes objects: every field, valid and invalid, table-driven."""

from __future__ import annotations

from datetime import UTC, datetime
from ipaddress import ip_address, ip_network
from typing import Any

import pytest

from nlproxy.cluster.model import (
    Endpoint,
    EndpointPort,
    Invalid,
    IPFamily,
    ObjectRef,
    Protocol,
    ServiceKey,
    ServiceType,
    Skip,
    Upsert,
)
from nlproxy.cluster.parse import (
    parse_endpoint_slice,
    parse_node,
    parse_service,
    parse_service_cidr,
    to_change,
)
from nlproxy.cluster.sections import object_ref
from nlproxy.errors import InvalidObject
from tests.objects import DROP
from tests.objects import example_endpoint_slice as endpoint_slice
from tests.objects import example_node as node
from tests.objects import example_service as service
from tests.objects import example_service_cidr as service_cidr


def parse_ok_service(obj: dict[str, Any]) -> Any:
    parsed = parse_service(obj)
    assert parsed is not None
    return parsed


# --- Services -------------------------------------------------------------------------------


def test_service_basic_fields() -> None:
    svc = parse_ok_service(service())
    assert svc.key == ServiceKey(namespace="default", name="web")
    assert svc.type is ServiceType.CLUSTER_IP
    assert svc.cluster_ips == (ip_address("10.96.0.10"),)
    # The resourceVersion is checked, not kept: a new one alone gives an equal Service.
    assert parse_ok_service(service(**{"metadata.resourceVersion": "8"})) == svc
    http, dns = svc.ports
    assert str(http.ref) == "default/web:http/TCP"
    assert (http.port, http.target_port, http.node_port) == (80, 8080, None)
    assert str(dns.ref) == "default/web:dns/UDP"
    assert (dns.port, dns.target_port) == (53, "dns")
    assert (svc.external_ips, svc.load_balancer_ips, svc.load_balancer_source_ranges) == (
        (),
        (),
        (),
    )
    assert svc.affinity_timeout is None
    assert not svc.external_policy_local
    assert not svc.internal_policy_local
    assert svc.health_check_node_port is None
    assert svc.traffic_distribution is None


SERVICE_VALUES = [
    pytest.param(
        {"spec.ports": [{"port": 80}]},
        lambda s: (s.ports[0].ref.port_name, s.ports[0].ref.protocol, s.ports[0].target_port),
        ("", Protocol.TCP, 80),
        id="defaults-protocol-tcp-and-targetport-port",
    ),
    pytest.param(
        {"spec.ports": [{"port": 80, "targetPort": 0}]},
        lambda s: s.ports[0].target_port,
        80,
        id="targetport-zero-means-port",
    ),
    pytest.param(
        {"spec.ports": [{"port": 80, "targetPort": ""}]},
        lambda s: s.ports[0].target_port,
        80,
        id="targetport-empty-string-means-port",
    ),
    pytest.param(
        {"spec.ports[0].protocol": "SCTP"},
        lambda s: s.ports[0].ref.protocol,
        Protocol.SCTP,
        id="protocol-sctp",
    ),
    pytest.param({"spec.type": DROP}, lambda s: s.type, ServiceType.CLUSTER_IP, id="type-default"),
    pytest.param(
        {"spec.type": "NodePort", "spec.ports[0].nodePort": 8081},
        lambda s: (s.type, s.ports[0].node_port),
        (ServiceType.NODE_PORT, 8081),
        id="nodeport-outside-30000-32767-accepted",
    ),
    pytest.param(
        {"spec.ports[0].nodePort": 0}, lambda s: s.ports[0].node_port, None, id="nodeport-zero"
    ),
    pytest.param(
        {"spec.clusterIPs": DROP, "spec.ipFamilies": DROP},
        lambda s: s.cluster_ips,
        (ip_address("10.96.0.10"),),
        id="clusterip-only",
    ),
    pytest.param(
        {
            "spec.clusterIP": "fd00:96::a",
            "spec.clusterIPs": ["fd00:96::a", "10.96.0.10"],
            "spec.ipFamilies": ["IPv6", "IPv4"],
        },
        lambda s: s.cluster_ips,
        (ip_address("fd00:96::a"), ip_address("10.96.0.10")),
        id="dual-stack-ipv6-primary",
    ),
    pytest.param(
        {"spec.externalIPs": ["192.0.2.1", "2001:db8::1"]},
        lambda s: s.external_ips,
        (ip_address("192.0.2.1"), ip_address("2001:db8::1")),
        id="external-ips",
    ),
    pytest.param(
        {
            "status.loadBalancer.ingress": [
                {"ip": "198.51.100.1"},
                {"ip": "198.51.100.2", "ipMode": "Proxy"},
                {"ip": "198.51.100.3", "ipMode": "VIP"},
                {"hostname": "lb.example.com"},
            ]
        },
        lambda s: s.load_balancer_ips,
        (ip_address("198.51.100.1"), ip_address("198.51.100.3")),
        id="lb-ingress-skips-proxy-mode-and-hostnames",
    ),
    pytest.param(
        {"spec.loadBalancerSourceRanges": [" 203.0.113.0/24 ", "10.1.2.3/8", "2001:db8::/32"]},
        lambda s: s.load_balancer_source_ranges,
        (ip_network("203.0.113.0/24"), ip_network("10.0.0.0/8"), ip_network("2001:db8::/32")),
        id="source-ranges-trimmed-host-bits-ignored",
    ),
    pytest.param(
        {
            "metadata.annotations": {
                "service.beta.kubernetes.io/load-balancer-source-ranges": "192.0.2.0/24, 10.0.0.0/8"
            }
        },
        lambda s: s.load_balancer_source_ranges,
        (ip_network("192.0.2.0/24"), ip_network("10.0.0.0/8")),
        id="source-ranges-annotation",
    ),
    pytest.param(
        {
            "spec.loadBalancerSourceRanges": ["192.0.2.0/24"],
            "metadata.annotations": {
                "service.beta.kubernetes.io/load-balancer-source-ranges": "10.0.0.0/8"
            },
        },
        lambda s: s.load_balancer_source_ranges,
        (ip_network("192.0.2.0/24"),),
        id="source-ranges-spec-wins-over-annotation",
    ),
    pytest.param(
        {"spec.type": "NodePort", "spec.externalTrafficPolicy": "Local"},
        lambda s: s.external_policy_local,
        True,
        id="etp-local-nodeport",
    ),
    pytest.param(
        {"spec.externalTrafficPolicy": "Local"},
        lambda s: s.external_policy_local,
        False,
        id="etp-local-ignored-for-clusterip",
    ),
    pytest.param(
        {"spec.externalTrafficPolicy": "Local", "spec.externalIPs": ["192.0.2.10"]},
        lambda s: (s.external_policy_local, s.health_check_node_port),
        (True, None),
        id="etp-local-clusterip-with-external-ips",
    ),
    pytest.param(
        {
            "spec.type": "LoadBalancer",
            "spec.externalTrafficPolicy": "Local",
            "spec.healthCheckNodePort": 32000,
        },
        lambda s: (s.external_policy_local, s.health_check_node_port),
        (True, 32000),
        id="health-check-node-port-lb-local",
    ),
    pytest.param(
        {
            "spec.type": "LoadBalancer",
            "spec.externalTrafficPolicy": "Cluster",
            "spec.healthCheckNodePort": 32000,
        },
        lambda s: s.health_check_node_port,
        None,
        id="health-check-node-port-needs-local",
    ),
    pytest.param(
        {"spec.internalTrafficPolicy": "Local"},
        lambda s: s.internal_policy_local,
        True,
        id="itp-local",
    ),
    pytest.param(
        {"spec.sessionAffinity": "ClientIP"},
        lambda s: s.affinity_timeout,
        10800,
        id="affinity-default-timeout",
    ),
    pytest.param(
        {
            "spec.sessionAffinity": "ClientIP",
            "spec.sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 86400}},
        },
        lambda s: s.affinity_timeout,
        86400,
        id="affinity-max-timeout",
    ),
    pytest.param(
        {"spec.sessionAffinity": "None", "spec.sessionAffinityConfig.clientIP.timeoutSeconds": 5},
        lambda s: s.affinity_timeout,
        None,
        id="affinity-none-ignores-config",
    ),
    pytest.param(
        {"spec.trafficDistribution": "PreferClose"},
        lambda s: s.traffic_distribution,
        "PreferClose",
        id="traffic-distribution",
    ),
    pytest.param(
        {"metadata.namespace": DROP}, lambda s: str(s.key), "default/web", id="namespace-default"
    ),
]


@pytest.mark.parametrize(("fields", "get", "expected"), SERVICE_VALUES)
def test_service_values(fields: dict[str, Any], get: Any, expected: Any) -> None:
    assert get(parse_ok_service(service(**fields))) == expected


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"spec.clusterIP": "None", "spec.clusterIPs": ["None"]}, id="headless"),
        pytest.param({"spec.clusterIP": "None", "spec.clusterIPs": DROP}, id="headless-clusterip"),
        pytest.param({"spec.type": "ExternalName", "spec.clusterIP": ""}, id="externalname"),
        pytest.param(
            {"metadata.labels": {"service.kubernetes.io/service-proxy-name": "other"}},
            id="other-proxy",
        ),
        pytest.param(
            {"metadata.labels": {"service.kubernetes.io/headless": ""}}, id="headless-label"
        ),
    ],
)
def test_service_skipped(fields: dict[str, Any]) -> None:
    obj = service(**fields)
    assert parse_service(obj) is None
    assert to_change(obj) == Skip(ref=ObjectRef(kind="Service", namespace="default", name="web"))


SERVICE_ERRORS = [
    (
        {"spec.ports": [{"port": 80}, {"port": 81}]},
        "spec.ports[0].name: missing (required when a Service has more than one port)",
    ),
    ({"spec.ports[1].port": 70000}, "spec.ports[1].port: 70000 is not in 1..65535"),
    ({"spec.ports[0].port": 0}, "spec.ports[0].port: 0 is not in 1..65535"),
    ({"spec.ports[0].port": DROP}, "spec.ports[0].port: missing"),
    ({"spec.ports[0].port": "80"}, 'spec.ports[0].port: expected an integer, got "80"'),
    ({"spec.ports[0].port": True}, "spec.ports[0].port: expected an integer, got true"),
    (
        {"spec.ports[0].protocol": "HTTP"},
        'spec.ports[0].protocol: "HTTP" is not one of TCP, UDP, SCTP',
    ),
    ({"spec.ports[0].nodePort": 65536}, "spec.ports[0].nodePort: 65536 is not in 1..65535"),
    ({"spec.ports[0].targetPort": -1}, "spec.ports[0].targetPort: -1 is not in 1..65535"),
    (
        {"spec.ports[1].targetPort": "Dns_Port"},
        'spec.ports[1].targetPort: "Dns_Port" is not a valid port name (at most 15 lowercase '
        "letters, digits and single hyphens, with at least one letter)",
    ),
    (
        {"spec.ports[1].targetPort": "8053"},
        'spec.ports[1].targetPort: "8053" is not a valid port name (at most 15 lowercase '
        "letters, digits and single hyphens, with at least one letter)",
    ),
    (
        {"spec.ports[1].name": "http"},
        'spec.ports[1].name: duplicate port name "http" (also spec.ports[0])',
    ),
    (
        {"spec.ports[1].name": DROP},
        "spec.ports[1].name: missing (required when a Service has more than one port)",
    ),
    (
        {"spec.ports[1].name": "DNS"},
        'spec.ports[1].name: "DNS" is not a valid port name (a DNS label)',
    ),
    (
        {"spec.ports[1].port": 80, "spec.ports[1].protocol": "TCP"},
        "spec.ports[1].port: 80/TCP is also spec.ports[0]",
    ),
    (
        {"spec.ports": []},
        "spec.ports: missing (a Service that is not headless needs at least one port)",
    ),
    ({"spec.ports": "80"}, 'spec.ports: expected a list, got "80"'),
    ({"spec.ports[0]": 80}, "spec.ports[0]: expected an object, got 80"),
    ({"spec": ["x"]}, 'spec: expected an object, got ["x"]'),
    (
        {"spec.type": "Ingress"},
        'spec.type: "Ingress" is not one of ClusterIP, NodePort, LoadBalancer, ExternalName',
    ),
    (
        {"spec.clusterIP": DROP, "spec.clusterIPs": DROP},
        "spec.clusterIP: missing (only a headless Service, clusterIP None, has none)",
    ),
    (
        {"spec.clusterIP": "10.96.0.300", "spec.clusterIPs": DROP},
        'spec.clusterIP: "10.96.0.300" is not a valid IP address',
    ),
    (
        {"spec.clusterIP": "10.96.0.300", "spec.clusterIPs": ["10.96.0.300"]},
        'spec.clusterIPs[0]: "10.96.0.300" is not a valid IP address',
    ),
    (
        {"spec.clusterIPs": ["10.96.0.11"]},
        'spec.clusterIPs[0]: "10.96.0.11" differs from spec.clusterIP "10.96.0.10"',
    ),
    (
        {"spec.clusterIPs": ["10.96.0.10", "10.96.0.11"], "spec.ipFamilies": DROP},
        "spec.clusterIPs[1]: 10.96.0.11 is the same family as 10.96.0.10; dual-stack needs one "
        "of each",
    ),
    (
        {"spec.clusterIPs": ["10.96.0.10", "fd00::1", "10.96.0.11"]},
        "spec.clusterIPs: 3 addresses; at most two, one per family",
    ),
    (
        {"spec.ipFamilies": ["IPv6"]},
        "spec.clusterIPs[0]: 10.96.0.10 is not IPv6 (spec.ipFamilies[0])",
    ),
    (
        {"spec.clusterIPs": ["10.96.0.10", "fd00::1"], "spec.ipFamilies": ["IPv4", "IPv4"]},
        "spec.ipFamilies: lists a family twice",
    ),
    (
        {"spec.clusterIPs": ["10.96.0.10", "fd00::1"], "spec.ipFamilies": ["IPv4"]},
        "spec.ipFamilies: lists 1 families for 2 cluster IPs",
    ),
    ({"spec.ipFamilies": ["IPv5"]}, 'spec.ipFamilies[0]: "IPv5" is not one of IPv4, IPv6'),
    (
        {"spec.externalIPs": ["192.0.2.1", "192.0.2"]},
        'spec.externalIPs[1]: "192.0.2" is not a valid IP address',
    ),
    ({"spec.externalIPs": "192.0.2.1"}, 'spec.externalIPs: expected a list, got "192.0.2.1"'),
    (
        {"spec.loadBalancerSourceRanges": ["10.0.0.0/33"]},
        'spec.loadBalancerSourceRanges[0]: "10.0.0.0/33" is not a valid CIDR',
    ),
    (
        {"spec.loadBalancerSourceRanges": ["10.0.0.1"]},
        'spec.loadBalancerSourceRanges[0]: "10.0.0.1" is not a CIDR (address/prefix length)',
    ),
    (
        {
            "metadata.annotations": {
                "service.beta.kubernetes.io/load-balancer-source-ranges": "10.0.0.0/8,bogus/8"
            }
        },
        "metadata.annotations[service.beta.kubernetes.io/load-balancer-source-ranges]: "
        '"bogus/8" is not a valid CIDR',
    ),
    (
        {"spec.externalTrafficPolicy": "Global"},
        'spec.externalTrafficPolicy: "Global" is not one of Cluster, Local',
    ),
    (
        {"spec.internalTrafficPolicy": "local"},
        'spec.internalTrafficPolicy: "local" is not one of Cluster, Local',
    ),
    (
        {"spec.sessionAffinity": "Cookie"},
        'spec.sessionAffinity: "Cookie" is not one of None, ClientIP',
    ),
    (
        {
            "spec.sessionAffinity": "ClientIP",
            "spec.sessionAffinityConfig.clientIP.timeoutSeconds": 86401,
        },
        "spec.sessionAffinityConfig.clientIP.timeoutSeconds: 86401 is not in 1..86400",
    ),
    (
        {
            "spec.sessionAffinity": "ClientIP",
            "spec.sessionAffinityConfig.clientIP.timeoutSeconds": 0,
        },
        "spec.sessionAffinityConfig.clientIP.timeoutSeconds: 0 is not in 1..86400",
    ),
    (
        {"spec.healthCheckNodePort": 70000},
        "spec.healthCheckNodePort: 70000 is not in 1..65535",
    ),
    (
        {"status.loadBalancer.ingress": [{"ip": "198.51.100.300"}]},
        'status.loadBalancer.ingress[0].ip: "198.51.100.300" is not a valid IP address',
    ),
    (
        {"status.loadBalancer.ingress": [{"ip": "198.51.100.1", "ipMode": "Direct"}]},
        'status.loadBalancer.ingress[0].ipMode: "Direct" is not one of VIP, Proxy',
    ),
    ({"spec.trafficDistribution": 1}, "spec.trafficDistribution: expected a string, got 1"),
    ({"metadata.labels": {"app": 1}}, "metadata.labels[app]: expected a string, got 1"),
]


@pytest.mark.parametrize(
    ("fields", "message"),
    [pytest.param(f, m, id=m.split(":")[0] + ":" + m[-24:]) for f, m in SERVICE_ERRORS],
)
def test_service_invalid(fields: dict[str, Any], message: str) -> None:
    obj = service(**fields)
    with pytest.raises(InvalidObject) as info:
        parse_service(obj)
    assert str(info.value) == f"Service default/web: {message}"
    assert info.value.ref == "Service default/web"
    assert info.value.field == message.split(": ")[0]
    change = to_change(obj)
    assert change == Invalid(
        ref=ObjectRef(kind="Service", namespace="default", name="web"), error=str(info.value)
    )


def test_service_missing_name_is_named_clearly() -> None:
    obj = service(**{"metadata.name": DROP})
    change = to_change(obj)
    assert change == Invalid(
        ref=ObjectRef(kind="Service", namespace="default", name="(unnamed)"),
        error="Service default/(unnamed): metadata.name: missing",
    )


def test_service_metadata_wrong_type() -> None:
    change = to_change({"kind": "Service", "metadata": "web"})
    assert isinstance(change, Invalid)
    assert change.error == 'Service default/(unnamed): metadata: expected an object, got "web"'


# --- EndpointSlices -------------------------------------------------------------------------


def test_slice_basic_fields() -> None:
    obj = endpoint_slice(**{"metadata.resourceVersion": "12"})
    es = parse_endpoint_slice(obj)
    assert es is not None
    assert (es.namespace, es.name, es.service) == (
        "default",
        "web-abcde",
        ServiceKey(namespace="default", name="web"),
    )
    assert es.family is IPFamily.IPV4
    assert es.ports == (EndpointPort(name="http", port=8080, protocol=Protocol.TCP),)
    assert es.endpoints == (
        Endpoint(
            ip=ip_address("10.0.1.5"), ready=True, serving=True, terminating=False, node_name="n1"
        ),
    )
    assert es.last_change_trigger_time is None
    assert parse_endpoint_slice(endpoint_slice(**{"metadata.resourceVersion": "13"})) == es


CONDITIONS = [
    pytest.param({}, (True, True, False), id="all-unset"),
    pytest.param({"ready": False}, (False, True, False), id="not-ready-serving-unset"),
    pytest.param(
        {"ready": False, "serving": True, "terminating": True},
        (False, True, True),
        id="terminating-serving",
    ),
    pytest.param(
        {"ready": False, "serving": False, "terminating": True},
        (False, False, True),
        id="terminating-not-serving",
    ),
    pytest.param({"ready": True, "serving": None}, (True, True, False), id="explicit-null"),
]


@pytest.mark.parametrize(("conditions", "expected"), CONDITIONS)
def test_slice_conditions(conditions: dict[str, Any], expected: tuple[bool, bool, bool]) -> None:
    es = parse_endpoint_slice(endpoint_slice(**{"endpoints[0].conditions": conditions}))
    assert es is not None
    ep = es.endpoints[0]
    assert (ep.ready, ep.serving, ep.terminating) == expected


SLICE_VALUES = [
    pytest.param(
        {"endpoints[0].addresses": ["10.0.1.5", "10.0.1.6"]},
        lambda s: [e.ip for e in s.endpoints],
        [ip_address("10.0.1.5")],
        id="only-first-address-proxied",
    ),
    pytest.param(
        {"ports": [{"port": 8080}, {"name": "x", "port": None}, {"name": "y"}]},
        lambda s: s.ports,
        (EndpointPort(name="", port=8080, protocol=Protocol.TCP),),
        id="unnamed-port-and-null-ports-dropped",
    ),
    pytest.param({"ports": DROP}, lambda s: s.ports, (), id="no-ports"),
    pytest.param({"endpoints": DROP}, lambda s: s.endpoints, (), id="no-endpoints"),
    pytest.param(
        {
            "endpoints[0].zone": "zone-a",
            "endpoints[0].hints": {
                "forZones": [{"name": "zone-a"}, {"name": "zone-b"}],
                "forNodes": [{"name": "n1"}],
            },
        },
        lambda s: (s.endpoints[0].zone, s.endpoints[0].hints_zones, s.endpoints[0].hints_nodes),
        ("zone-a", frozenset({"zone-a", "zone-b"}), frozenset({"n1"})),
        id="zone-and-hints",
    ),
    pytest.param(
        {"endpoints[0].hints": {"forZones": []}},
        lambda s: (s.endpoints[0].hints_zones, s.endpoints[0].hints_nodes),
        (None, None),
        id="empty-hints-are-none",
    ),
    pytest.param(
        {"endpoints[0].nodeName": DROP},
        lambda s: s.endpoints[0].node_name,
        None,
        id="no-node-name",
    ),
    pytest.param(
        {
            "metadata.annotations": {
                "endpoints.kubernetes.io/last-change-trigger-time": "2024-05-01T10:20:30Z"
            }
        },
        lambda s: s.last_change_trigger_time,
        datetime(2024, 5, 1, 10, 20, 30, tzinfo=UTC),
        id="trigger-time",
    ),
    pytest.param(
        {
            "metadata.annotations": {
                "endpoints.kubernetes.io/last-change-trigger-time": "2024-05-01T10:20:30.123456789Z"
            }
        },
        lambda s: s.last_change_trigger_time,
        datetime(2024, 5, 1, 10, 20, 30, 123456, tzinfo=UTC),
        id="trigger-time-nanoseconds",
    ),
    pytest.param(
        {"metadata.annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "soon"}},
        lambda s: s.last_change_trigger_time,
        None,
        id="trigger-time-unparsable-ignored",
    ),
    pytest.param(
        {"addressType": "IPv6", "endpoints[0].addresses": ["fd00:10:244::5"]},
        lambda s: (s.family, s.endpoints[0].ip),
        (IPFamily.IPV6, ip_address("fd00:10:244::5")),
        id="ipv6",
    ),
]


@pytest.mark.parametrize(("fields", "get", "expected"), SLICE_VALUES)
def test_slice_values(fields: dict[str, Any], get: Any, expected: Any) -> None:
    es = parse_endpoint_slice(endpoint_slice(**fields))
    assert es is not None
    assert get(es) == expected


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"addressType": "FQDN", "endpoints[0].addresses": ["a.example"]}, id="fqdn"),
        pytest.param({"metadata.labels": {}}, id="no-service-label"),
        pytest.param(
            {
                "metadata.labels": {
                    "kubernetes.io/service-name": "web",
                    "service.kubernetes.io/headless": "",
                }
            },
            id="headless-label",
        ),
        pytest.param(
            {
                "metadata.labels": {
                    "kubernetes.io/service-name": "web",
                    "service.kubernetes.io/service-proxy-name": "other",
                }
            },
            id="other-proxy",
        ),
    ],
)
def test_slice_skipped(fields: dict[str, Any]) -> None:
    obj = endpoint_slice(**fields)
    assert parse_endpoint_slice(obj) is None
    assert isinstance(to_change(obj), Skip)


SLICE_ERRORS = [
    ({"addressType": DROP}, "addressType: missing"),
    ({"addressType": "IPX"}, 'addressType: "IPX" is not one of IPv4, IPv6, FQDN'),
    (
        {
            "endpoints": [
                {"addresses": ["10.0.1.5"]},
                {"addresses": ["10.0.1.6"]},
                {"addresses": ["10.0.1.300"]},
            ]
        },
        'endpoints[2].addresses[0]: "10.0.1.300" is not a valid IP address',
    ),
    (
        {"endpoints[0].addresses": ["10.0.1.5", "fd00::5"]},
        "endpoints[0].addresses[1]: fd00::5 is not an IPv4 address (addressType)",
    ),
    (
        {"endpoints[0].addresses": []},
        "endpoints[0].addresses: missing (an endpoint needs at least one address)",
    ),
    (
        {"endpoints[0].addresses": "10.0.1.5"},
        'endpoints[0].addresses: expected a list, got "10.0.1.5"',
    ),
    (
        {"endpoints[0].conditions.ready": "yes"},
        'endpoints[0].conditions.ready: expected true or false, got "yes"',
    ),
    ({"ports[0].port": 0}, "ports[0].port: 0 is not in 1..65535"),
    ({"ports[0].port": 65536}, "ports[0].port: 65536 is not in 1..65535"),
    ({"ports[0].protocol": "ICMP"}, 'ports[0].protocol: "ICMP" is not one of TCP, UDP, SCTP'),
    (
        {"ports": [{"name": "a", "port": 1}, {"name": "a", "port": 2}]},
        'ports[1].name: duplicate port name "a" (also ports[0])',
    ),
    (
        {"endpoints[0].hints.forZones": [{"name": 3}]},
        "endpoints[0].hints.forZones[0].name: expected a string, got 3",
    ),
    ({"endpoints[0].nodeName": ["n1"]}, 'endpoints[0].nodeName: expected a string, got ["n1"]'),
]


@pytest.mark.parametrize(
    ("fields", "message"), [pytest.param(f, m, id=m.split(":")[0]) for f, m in SLICE_ERRORS]
)
def test_slice_invalid(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidObject) as info:
        parse_endpoint_slice(endpoint_slice(**fields))
    assert str(info.value) == f"EndpointSlice default/web-abcde: {message}"


# --- Nodes and ServiceCIDRs -----------------------------------------------------------------


def test_node_fields() -> None:
    n = parse_node(node())
    assert n.name == "n1"
    assert n.zone == "zone-a"
    assert n.addresses == (
        ip_address("192.168.1.10"),
        ip_address("fd00::10"),
        ip_address("203.0.113.7"),
    )
    assert n.pod_cidrs == (ip_network("10.244.1.0/24"), ip_network("fd00:10:244:1::/64"))
    assert n.labels == (("topology.kubernetes.io/zone", "zone-a"),)


def test_node_single_pod_cidr_and_no_zone() -> None:
    n = parse_node(node(**{"spec": {"podCIDR": "10.244.2.0/24"}, "metadata.labels": {}}))
    assert n.pod_cidrs == (ip_network("10.244.2.0/24"),)
    assert n.zone is None


def test_node_repeated_address_kept_once() -> None:
    addresses = [
        {"type": "InternalIP", "address": "192.168.1.10"},
        {"type": "ExternalIP", "address": "192.168.1.10"},
    ]
    assert parse_node(node(**{"status.addresses": addresses})).addresses == (
        ip_address("192.168.1.10"),
    )


NODE_ERRORS = [
    (
        {"status.addresses[2].address": "192.168.1"},
        'status.addresses[2].address: "192.168.1" is not a valid IP address',
    ),
    ({"status.addresses[2].address": DROP}, "status.addresses[2].address: missing"),
    ({"spec.podCIDRs": ["10.244.1.1/24"]}, 'spec.podCIDRs[0]: "10.244.1.1/24" has host bits set'),
    (
        {"status.addresses": {"type": "InternalIP"}},
        'status.addresses: expected a list, got {"type": "InternalIP"}',
    ),
    ({"metadata.name": ""}, "metadata.name: missing"),
]


@pytest.mark.parametrize(
    ("fields", "message"), [pytest.param(f, m, id=m.split(":")[0]) for f, m in NODE_ERRORS]
)
def test_node_invalid(fields: dict[str, Any], message: str) -> None:
    ref = "Node n1" if "metadata.name" not in fields else "Node (unnamed)"
    with pytest.raises(InvalidObject) as info:
        parse_node(node(**fields))
    assert str(info.value) == f"{ref}: {message}"


def test_service_cidr_fields() -> None:
    sc = parse_service_cidr(service_cidr())
    assert sc.name == "kubernetes"
    assert sc.cidrs == (ip_network("10.96.0.0/16"), ip_network("fd00:96::/108"))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"spec.cidrs": []}, "spec.cidrs: missing"),
        (
            {"spec.cidrs": ["10.96.0.0/16", "10.97.0.0/16"]},
            "spec.cidrs[1]: 10.97.0.0/16 is the same family as 10.96.0.0/16",
        ),
        (
            {"spec.cidrs": ["10.96.0.0"]},
            'spec.cidrs[0]: "10.96.0.0" is not a CIDR (address/prefix length)',
        ),
        ({"spec.cidrs": "10.96.0.0/16"}, 'spec.cidrs: expected a list, got "10.96.0.0/16"'),
    ],
)
def test_service_cidr_invalid(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidObject) as info:
        parse_service_cidr(service_cidr(**fields))
    assert str(info.value) == f"ServiceCIDR kubernetes: {message}"


# --- Refs and dispatch ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "kind", "expected"),
    [
        (service(), None, ObjectRef(kind="Service", namespace="default", name="web")),
        (
            {"metadata": {"name": "s", "namespace": "kube-system"}},
            "EndpointSlice",
            ObjectRef(kind="EndpointSlice", namespace="kube-system", name="s"),
        ),
        (node(), None, ObjectRef(kind="Node", namespace="", name="n1")),
        (
            {"kind": "Node", "metadata": {"name": "n2", "namespace": "x"}},
            None,
            ObjectRef(kind="Node", namespace="", name="n2"),
        ),
        (
            {"metadata": [1]},
            "Service",
            ObjectRef(kind="Service", namespace="default", name="(unnamed)"),
        ),
        ({}, None, ObjectRef(kind="", namespace="", name="(unnamed)")),
    ],
)
def test_object_ref(obj: dict[str, Any], kind: str | None, expected: ObjectRef) -> None:
    assert object_ref(obj, kind) == expected


def test_to_change_dispatch() -> None:
    for obj, kind in [
        (service(), None),
        (endpoint_slice(), None),
        (node(), None),
        (service_cidr(), None),
        ({**service(), "kind": None}, "Service"),
    ]:
        change = to_change(obj, kind)
        assert isinstance(change, Upsert), change
        assert change.ref == object_ref(obj, kind)
    change = to_change({"kind": "Pod", "metadata": {"name": "p"}})
    assert change == Invalid(
        ref=ObjectRef(kind="Pod", namespace="", name="p"),
        error="Pod p: kind: not one of Service, EndpointSlice, Node, ServiceCIDR",
    )


WRONG_VALUES = ["x", 7, -1, 1.5, True, None, [], ["x"], {}, {"a": 1}]


def _paths(obj: Any, prefix: str = "") -> list[str]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for key, value in obj.items():
            if "." not in key:
                out += _paths(value, f"{prefix}.{key}" if prefix else key)
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            out += _paths(value, f"{prefix}[{i}]")
    return out


@pytest.mark.parametrize(
    "builder",
    [
        pytest.param(
            lambda **f: service(
                **{
                    "spec.type": "LoadBalancer",
                    "spec.externalTrafficPolicy": "Local",
                    "spec.healthCheckNodePort": 31000,
                    "spec.sessionAffinity": "ClientIP",
                    "spec.sessionAffinityConfig.clientIP.timeoutSeconds": 60,
                    "spec.externalIPs": ["192.0.2.1"],
                    "spec.loadBalancerSourceRanges": ["10.0.0.0/8"],
                    "status.loadBalancer.ingress": [{"ip": "198.51.100.1", "ipMode": "VIP"}],
                    **f,
                }
            ),
            id="service",
        ),
        pytest.param(
            lambda **f: endpoint_slice(
                **{
                    "endpoints[0].hints": {
                        "forZones": [{"name": "a"}],
                        "forNodes": [{"name": "n"}],
                    },
                    "endpoints[0].conditions": {
                        "ready": True,
                        "serving": True,
                        "terminating": False,
                    },
                    **f,
                }
            ),
            id="endpointslice",
        ),
        pytest.param(node, id="node"),
        pytest.param(service_cidr, id="servicecidr"),
    ],
)
def test_wrong_shapes_never_raise(builder: Any) -> None:
    """Any field replaced by a value of any other JSON type yields a change, never a traceback;
    errors always name the object."""
    base = builder()
    paths = _paths(base)
    assert len(paths) > 5
    for path in paths:
        for value in WRONG_VALUES:
            obj = builder(**{path: value})
            change = to_change(obj)
            assert isinstance(change, Upsert | Skip | Invalid), (path, value)
            if isinstance(change, Invalid):
                assert change.error.startswith(str(change.ref) + ": "), change.error
