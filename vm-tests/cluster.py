"""The VM test cluster: topology, Kubernetes manifests and pod lists, from vm-tests/topology.json.

One source for the provisioning scripts (run inside the VMs with the system python3, so standard
library only) and for the host-side tests, which rewrite the manifests to change endpoints. It
describes the cluster; it must not talk to VMs or run programs.

    python3 cluster.py manifests DIR [--without POD,...]   write the manifests into DIR
    python3 cluster.py pods NODE                            "name ip" per pod on NODE
    python3 cluster.py routes NODE                          "pod-cidr via-ip" per other node
    python3 cluster.py get KEY                              a top-level value (cluster_cidr, ...)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOPOLOGY = Path(__file__).with_name("topology.json")
ECHO_PORT = 8080


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    name: str
    ip: str
    pod_cidr: str
    pods: dict[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceDef:
    """A Service of the test cluster; its endpoints are the pods whose names start with prefix."""

    name: str
    cluster_ip: str
    prefix: str
    ports: tuple[tuple[str, str, int, int], ...]  # (name, protocol, port, nodePort)
    local: bool = False  # externalTrafficPolicy: Local, as a LoadBalancer
    health_node_port: int = 0


NAMESPACE = "default"
WEB = ServiceDef(
    name="web",
    cluster_ip="10.96.0.10",
    prefix="web-",
    ports=(("tcp", "TCP", 80, 30080), ("udp", "UDP", 53, 30053)),
)
LOCAL = ServiceDef(
    name="local",
    cluster_ip="10.96.0.20",
    prefix="local-",
    ports=(("tcp", "TCP", 80, 30081),),
    local=True,
    health_node_port=30256,
)
SERVICES = (WEB, LOCAL)


def topology() -> dict[str, Any]:
    with TOPOLOGY.open() as f:
        data: dict[str, Any] = json.load(f)
    return data


def nodes() -> list[Node]:
    return [Node(**n) for n in topology()["nodes"]]


def node(name: str) -> Node:
    for n in nodes():
        if n.name == name:
            return n
    raise SystemExit(f"cluster.py: no node {name!r} in {TOPOLOGY}")


def pod_node(pod: str) -> Node:
    """The node a pod runs on."""
    for n in nodes():
        if pod in n.pods:
            return n
    raise KeyError(f"pod {pod!r} is not in {TOPOLOGY}")


def endpoints(svc: ServiceDef, without: frozenset[str] = frozenset()) -> list[tuple[str, str, str]]:
    """(pod, ip, node) for every pod of svc, minus the ones named in without."""
    return [
        (pod, ip, n.name)
        for n in nodes()
        for pod, ip in sorted(n.pods.items())
        if pod.startswith(svc.prefix) and pod not in without
    ]


def _node_object(n: Node) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": n.name, "labels": {"kubernetes.io/hostname": n.name}},
        "spec": {"podCIDR": n.pod_cidr, "podCIDRs": [n.pod_cidr]},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": n.ip},
                {"type": "Hostname", "address": n.name},
            ]
        },
    }


def _service_object(svc: ServiceDef) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "type": "LoadBalancer" if svc.local else "NodePort",
        "selector": {"app": svc.name},
        "clusterIP": svc.cluster_ip,
        "clusterIPs": [svc.cluster_ip],
        "ipFamilies": ["IPv4"],
        "ipFamilyPolicy": "SingleStack",
        "externalTrafficPolicy": "Local" if svc.local else "Cluster",
        "ports": [
            {"name": n, "protocol": p, "port": port, "targetPort": ECHO_PORT, "nodePort": np}
            for n, p, port, np in svc.ports
        ],
    }
    if svc.health_node_port:
        spec["healthCheckNodePort"] = svc.health_node_port
    meta = {"name": svc.name, "namespace": NAMESPACE}
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}


def _slice_object(svc: ServiceDef, without: frozenset[str]) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{svc.name}-vm",
            "namespace": NAMESPACE,
            "labels": {"kubernetes.io/service-name": svc.name},
        },
        "addressType": "IPv4",
        "ports": [{"name": n, "protocol": p, "port": ECHO_PORT} for n, p, _, _ in svc.ports],
        "endpoints": [
            {
                "addresses": [ip],
                "conditions": {"ready": True, "serving": True, "terminating": False},
                "nodeName": node_name,
                "targetRef": {"kind": "Pod", "namespace": NAMESPACE, "name": pod},
            }
            for pod, ip, node_name in endpoints(svc, without)
        ],
    }


def manifests(without: frozenset[str] = frozenset()) -> dict[str, str]:
    """File name -> JSON text of the cluster's Nodes, Services and EndpointSlices."""

    def as_list(items: list[dict[str, Any]]) -> str:
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=1) + "\n"

    return {
        "00-nodes.json": as_list([_node_object(n) for n in nodes()]),
        "10-services.json": as_list([_service_object(s) for s in SERVICES]),
        "20-endpointslices.json": as_list([_slice_object(s, without) for s in SERVICES]),
    }


def write_manifests(directory: Path, without: frozenset[str] = frozenset()) -> None:
    """Write the manifests into directory, each file replaced atomically (dot-files are ignored)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in manifests(without).items():
        tmp = directory / f".{name}.tmp"
        tmp.write_text(text)
        tmp.chmod(0o644)
        os.replace(tmp, directory / name)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cluster.py")
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("manifests")
    m.add_argument("directory", type=Path)
    m.add_argument("--without", default="", help="pods to leave out, comma-separated")
    sub.add_parser("pods").add_argument("node")
    sub.add_parser("routes").add_argument("node")
    sub.add_parser("get").add_argument("key")
    args = parser.parse_args(argv)
    if args.cmd == "manifests":
        write_manifests(args.directory, frozenset(filter(None, args.without.split(","))))
    elif args.cmd == "pods":
        for pod, ip in sorted(node(args.node).pods.items()):
            print(pod, ip)
    elif args.cmd == "routes":
        for n in nodes():
            if n.name != args.node:
                print(n.pod_cidr, n.ip)
    else:
        print(topology()[args.key])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
