"""Builders for raw Kubernetes objects as the API server stores them, with overrides."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


def service(
    name: str,
    *,
    namespace: str = "default",
    ip: str = "10.96.0.10",
    port: int = 80,
    labels: dict[str, str] | None = None,
) -> Obj:
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": ip,
            "clusterIPs": [ip],
            "ports": [{"name": "http", "protocol": "TCP", "port": port, "targetPort": 8080}],
        },
    }


def endpoint_slice(
    name: str,
    *,
    service: str | None,
    namespace: str = "default",
    ips: tuple[str, ...] = ("10.0.0.1",),
    labels: dict[str, str] | None = None,
) -> Obj:
    all_labels = dict(labels or {})
    if service is not None:
        all_labels["kubernetes.io/service-name"] = service
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": all_labels},
        "addressType": "IPv4",
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
        "endpoints": [
            {"addresses": [ip], "conditions": {"ready": True}, "nodeName": "node-a"} for ip in ips
        ],
    }


def node(name: str, *, ip: str = "192.0.2.1", zone: str = "zone-a") -> Obj:
    return {
        "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}},
        "spec": {"podCIDRs": ["10.244.0.0/24"]},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
    }


def service_cidr(name: str, cidr: str = "10.96.0.0/16") -> Obj:
    return {"metadata": {"name": name}, "spec": {"cidrs": [cidr]}}
