"""A cluster at scale in the in-repo API server: S Services x E endpoints with realistic bodies,
and bursts of EndpointSlice updates, for the scale tests and ``bench/bench_kube_cold.py``.

Service ``i`` is ``ns-{i % 50}/svc-{i:05}`` on ClusterIP ``10.96.0.0 + i + 1`` (inside
``SERVICE_CIDR``), port 80 to 8080, with one EndpointSlice of E ready endpoints spread over 50
nodes (``node-0`` is this node); pod IPs are ``10.128.0.0 + i * E + e``. An update ``u`` of a burst
moves one endpoint of service ``u % S`` to a fresh pod IP, so every update is a real change.
"""

from __future__ import annotations

from collections.abc import Iterator
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from tests.kube.apiserver import ApiServer
from tests.kube.realistic import dress_service, dress_slice
from tests.objects import endpoint, endpoint_slice, node, service, service_cidr

Obj = dict[str, Any]

SERVICE_CIDR = IPv4Network("10.96.0.0/16")
CLUSTER_CIDR = IPv4Network("10.128.0.0/9")
NODE = "node-0"
NODES = 50


def name(i: int) -> tuple[str, str]:
    return f"ns-{i % 50}", f"svc-{i:05}"


def vip(i: int) -> str:
    return str(SERVICE_CIDR.network_address + i + 1)


def pod_ip(n: int) -> str:
    return str(IPv4Address(int(CLUSTER_CIDR.network_address) + n))


def service_obj(i: int) -> Obj:
    ns, svc = name(i)
    return dress_service(service(svc, vip(i), namespace=ns))


def slice_obj(i: int, ips: tuple[str, ...]) -> Obj:
    ns, svc = name(i)
    obj = endpoint_slice(
        svc, [endpoint(ip, "node-a") for ip in ips], name=f"{svc}-x7k2p", namespace=ns
    )
    for k, ep in enumerate(obj["endpoints"]):
        ep["nodeName"] = f"node-{(i + k) % NODES}"
    return dress_slice(obj, zone=f"zone-{i % 3}")


def endpoint_ips(i: int, endpoints: int) -> tuple[str, ...]:
    return tuple(pod_ip(i * endpoints + e) for e in range(endpoints))


def populate(server: ApiServer, services: int, endpoints: int) -> None:
    """This node, a ServiceCIDR, and ``services`` Services each with one EndpointSlice."""
    server.store.put("nodes", node(NODE, ip="192.168.77.1"))
    server.store.put("servicecidrs", service_cidr("kubernetes", str(SERVICE_CIDR)))
    server.store.put_many("services", (service_obj(i) for i in range(services)))
    slices = (slice_obj(i, endpoint_ips(i, endpoints)) for i in range(services))
    server.store.put_many("endpointslices", slices)


def burst_updates(services: int, endpoints: int, count: int, first: int = 0) -> Iterator[Obj]:
    """``count`` EndpointSlice updates, numbered from ``first``; update ``u`` gives service
    ``u % services`` a fresh IP for its last endpoint (after every initial one, never reused:
    start a later burst where the previous one ended)."""
    fresh = services * endpoints
    for u in range(first, first + count):
        i = u % services
        ips = (*endpoint_ips(i, endpoints)[:-1], pod_ip(fresh + u))
        yield slice_obj(i, ips)


def burst(server: ApiServer, services: int, endpoints: int, count: int, first: int = 0) -> int:
    """Replay ``count`` slice updates at once; returns the resourceVersion of the last."""
    updates = burst_updates(services, endpoints, count, first)
    return server.store.put_many("endpointslices", updates)
