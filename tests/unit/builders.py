"""Builders for cluster model objects in planner/tracer tests, with overrides.

Like kube-proxy's ``makeTestService``: sensible defaults, and every field can be overridden.
"""

from __future__ import annotations

from collections.abc import Iterable
from ipaddress import ip_address, ip_network
from typing import Any

from nlproxy.cluster.model import (
    ClusterSnapshot,
    Endpoint,
    EndpointPort,
    EndpointSlice,
    IPFamily,
    Node,
    ObjectRef,
    Protocol,
    Service,
    ServiceCIDR,
    ServiceKey,
    ServicePort,
    ServicePortRef,
    ServiceType,
    Upsert,
)

NODE = "test-node"
OTHER_NODE = "other-node"


def port(
    ns: str,
    name: str,
    port_name: str = "p80",
    number: int = 80,
    protocol: str = "TCP",
    *,
    target: int | str | None = None,
    node_port: int | None = None,
) -> ServicePort:
    ref = ServicePortRef(namespace=ns, name=name, port_name=port_name, protocol=Protocol(protocol))
    return ServicePort(
        ref=ref, port=number, target_port=number if target is None else target, node_port=node_port
    )


def service(
    ns: str,
    name: str,
    cluster_ips: str | Iterable[str],
    ports: Iterable[ServicePort] | None = None,
    **overrides: Any,
) -> Service:
    """A Service; ``ports`` defaults to one TCP port ``p80``. String addresses are parsed."""
    ips = [cluster_ips] if isinstance(cluster_ips, str) else list(cluster_ips)
    fields: dict[str, Any] = {
        "key": ServiceKey(namespace=ns, name=name),
        "type": ServiceType.CLUSTER_IP,
        "cluster_ips": tuple(ip_address(ip) for ip in ips),
        "ports": tuple(ports) if ports is not None else (port(ns, name),),
    }
    for key in ("external_ips", "load_balancer_ips"):
        if key in overrides:
            overrides[key] = tuple(ip_address(ip) for ip in overrides[key])
    if "load_balancer_source_ranges" in overrides:
        overrides["load_balancer_source_ranges"] = tuple(
            ip_network(r) for r in overrides["load_balancer_source_ranges"]
        )
    if any(p.node_port for p in fields["ports"]):
        fields["type"] = ServiceType.NODE_PORT
    if overrides.get("load_balancer_ips"):
        fields["type"] = ServiceType.LOAD_BALANCER
    fields.update(overrides)
    return Service(**fields)


def endpoint(ip: str, node: str | None = OTHER_NODE, **overrides: Any) -> Endpoint:
    """A ready endpoint on ``node``; override ``ready``/``serving``/``terminating``/hints."""
    fields: dict[str, Any] = {
        "ip": ip_address(ip),
        "ready": True,
        "serving": True,
        "terminating": False,
        "node_name": node,
    }
    fields.update(overrides)
    for key in ("hints_zones", "hints_nodes"):
        if fields.get(key) is not None:
            fields[key] = frozenset(fields[key])
    return Endpoint(**fields)


def eps_slice(
    ns: str,
    name: str,
    endpoints: Iterable[Endpoint],
    ports: Iterable[tuple[str, int, str]] = (("p80", 80, "TCP"),),
    *,
    slice_name: str | None = None,
) -> EndpointSlice:
    """An EndpointSlice of ``ns/name``; the family follows the first endpoint's address."""
    eps = tuple(endpoints)
    v6 = bool(eps) and eps[0].ip.version == 6
    return EndpointSlice(
        namespace=ns,
        name=slice_name or f"{name}-{'v6' if v6 else 'v4'}",
        service=ServiceKey(namespace=ns, name=name),
        family=IPFamily.IPV6 if v6 else IPFamily.IPV4,
        ports=tuple(EndpointPort(name=n, port=p, protocol=Protocol(pr)) for n, p, pr in ports),
        endpoints=eps,
    )


def snapshot(
    services: Iterable[Service],
    slices: Iterable[EndpointSlice] = (),
    *,
    node: Node | None = None,
    service_cidrs: Iterable[str] = (),
) -> ClusterSnapshot:
    grouped: dict[ServiceKey, tuple[EndpointSlice, ...]] = {}
    for sl in slices:
        grouped[sl.service] = (*grouped.get(sl.service, ()), sl)
    return ClusterSnapshot(
        services={s.key: s for s in services},
        slices=grouped,
        node=node,
        service_cidrs=(
            ServiceCIDR(name="extra", cidrs=tuple(ip_network(c) for c in service_cidrs)),
        )
        if service_cidrs
        else (),
    )


def node(
    addresses: Iterable[str] = ("192.168.0.2", "fd00:192::2"), zone: str | None = None
) -> Node:
    return Node(name=NODE, zone=zone, addresses=tuple(ip_address(a) for a in addresses))


def upsert(obj: Service | EndpointSlice) -> Upsert:
    """The change that adds or updates ``obj`` in a ``ClusterState``."""
    if isinstance(obj, Service):
        ref = ObjectRef(kind="Service", namespace=obj.key.namespace, name=obj.key.name)
    else:
        ref = ObjectRef(kind="EndpointSlice", namespace=obj.namespace, name=obj.name)
    return Upsert(ref=ref, obj=obj)
