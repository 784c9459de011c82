"""Raw Kubernetes objects for tests, as the API server and manifests hold them: one set of builders.

The builders take what a test cares about as arguments (``service("web", "10.96.0.10")``); any
other field is a keyword of the spec, or a dotted path through :func:`with_fields`. The
``example_*`` objects are fully populated ones for the parser's tests, to be overridden field by
field (``example_service(**{"spec.ports[1].port": 70000})``). Model objects (already parsed) are
``tests/unit/builders.py``'s.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

Obj = dict[str, Any]

DROP = object()
"""A value for :func:`with_fields`: remove the field."""

SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def with_fields(obj: Obj, **fields: Any) -> Obj:
    """A deep copy of ``obj`` with dotted paths set, e.g. ``{"spec.ports[1].port": 70000}``."""
    out = copy.deepcopy(obj)
    for path, value in fields.items():
        parts = [int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", path)]
        node: Any = out
        for part in parts[:-1]:
            if isinstance(part, str) and part not in node:
                node[part] = {}
            node = node[part]
        if value is DROP:
            del node[parts[-1]]
        else:
            node[parts[-1]] = value
    return out


def _metadata(name: str, namespace: str | None, labels: dict[str, str] | None) -> Obj:
    meta: Obj = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    if labels is not None:
        meta["labels"] = dict(labels)
    return meta


def service(
    name: str = "web",
    cluster_ip: str | Sequence[str] = "10.96.0.10",
    ports: Sequence[Obj] = ({"name": "tcp", "port": 80, "targetPort": 8080},),
    *,
    namespace: str = "default",
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> Obj:
    """A v1 Service; ``spec`` adds fields (``type``, ``externalIPs``, ``status`` ...) as in the
    API. Ports default to TCP; give ``protocol`` per port for UDP."""
    if misplaced := {"ip", "ips", "port", "service"} & spec.keys():
        raise TypeError(f"service(): {sorted(misplaced)} are not spec fields (cluster_ip, ports?)")
    ips = [cluster_ip] if isinstance(cluster_ip, str) else list(cluster_ip)
    status = spec.pop("status", {})
    body: Obj = {
        "type": "ClusterIP",
        "clusterIP": ips[0],
        "clusterIPs": ips,
        "ipFamilies": ["IPv6" if ":" in ip else "IPv4" for ip in ips],
        "ports": [{"protocol": "TCP", **p} for p in ports],
        **spec,
    }
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(name, namespace, labels),
        "spec": body,
        "status": status,
    }


def endpoint(ip: str, node: str, *, ready: bool = True, terminating: bool = False) -> Obj:
    """One EndpointSlice endpoint; ``serving`` follows ``ready`` unless terminating."""
    return {
        "addresses": [ip],
        "nodeName": node,
        "conditions": {"ready": ready, "serving": ready or terminating, "terminating": terminating},
    }


def endpoint_slice(
    service_name: str | None,
    endpoints: Sequence[Obj] = (),
    ports: Sequence[Obj] = ({"name": "tcp", "port": 8080},),
    *,
    family: str = "IPv4",
    namespace: str = "default",
    name: str | None = None,
    labels: dict[str, str] | None = None,
) -> Obj:
    """A discovery.k8s.io/v1 EndpointSlice of ``service_name`` (``None``: an orphan, no label;
    then ``name`` is required)."""
    all_labels = dict(labels or {})
    if service_name is not None:
        all_labels[SERVICE_NAME_LABEL] = service_name
    if name is None:
        assert service_name is not None, "an orphan slice needs a name"
        name = f"{service_name}-{family.lower()}"
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": _metadata(name, namespace, all_labels),
        "addressType": family,
        "endpoints": list(endpoints),
        "ports": [{"protocol": "TCP", **p} for p in ports],
    }


def node(
    name: str = "n1",
    *,
    ip: str | Sequence[str] = "192.0.2.1",
    zone: str | None = "zone-a",
    pod_cidrs: Sequence[str] = ("10.244.0.0/24",),
    addresses: Sequence[Obj] = (),
) -> Obj:
    """A v1 Node with its InternalIP address(es) (``addresses`` adds others first)."""
    ips = [ip] if isinstance(ip, str) else list(ip)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": _metadata(
            name, None, {"topology.kubernetes.io/zone": zone} if zone is not None else None
        ),
        "spec": {"podCIDRs": list(pod_cidrs)},
        "status": {"addresses": [*addresses, *({"type": "InternalIP", "address": a} for a in ips)]},
    }


def service_cidr(name: str = "kubernetes", *cidrs: str) -> Obj:
    """A networking.k8s.io/v1 ServiceCIDR (default range 10.96.0.0/16)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "ServiceCIDR",
        "metadata": {"name": name},
        "spec": {"cidrs": list(cidrs or ("10.96.0.0/16",))},
    }


_EXAMPLE_SERVICE = with_fields(
    service(
        "web",
        "10.96.0.10",
        [
            {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
            {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": "dns"},
        ],
    ),
    **{"metadata.resourceVersion": "7", "status": DROP},
)
_EXAMPLE_SLICE = endpoint_slice(
    "web",
    [{"addresses": ["10.0.1.5"], "conditions": {"ready": True}, "nodeName": "n1"}],
    [{"name": "http", "port": 8080}],
    name="web-abcde",
)
_EXAMPLE_NODE = node(
    "n1",
    ip=("192.168.1.10", "fd00::10"),
    pod_cidrs=("10.244.1.0/24", "fd00:10:244:1::/64"),
    addresses=(
        {"type": "Hostname", "address": "n1"},
        {"type": "ExternalIP", "address": "203.0.113.7"},
    ),
)
_EXAMPLE_SERVICE_CIDR = service_cidr("kubernetes", "10.96.0.0/16", "fd00:96::/108")


def example_service(**fields: Any) -> Obj:
    """A dual-port (TCP http, UDP dns) ClusterIP Service ``default/web``, with ``fields`` set."""
    return with_fields(_EXAMPLE_SERVICE, **fields)


def example_endpoint_slice(**fields: Any) -> Obj:
    """``default/web-abcde`` of Service web: one ready endpoint 10.0.1.5 on n1, port http 8080."""
    return with_fields(_EXAMPLE_SLICE, **fields)


def example_node(**fields: Any) -> Obj:
    """Node n1 in zone-a: dual-stack InternalIPs, a Hostname and an ExternalIP, two pod CIDRs."""
    return with_fields(_EXAMPLE_NODE, **fields)


def example_service_cidr(**fields: Any) -> Obj:
    """The dual-stack ServiceCIDR ``kubernetes``."""
    return with_fields(_EXAMPLE_SERVICE_CIDR, **fields)
