"""Benchmark input: S Services x E endpoints over N nodes, and what kube-proxy would load for it.

Sits at the start of every benchmark: it writes the cluster as manifests (what ``nlproxy run
--manifests`` reads) and, for exactly the same cluster, the input kube-proxy's other modes hand
to the kernel's tools: the ``nft -f`` text of its nftables mode (the 1.31-1.35 shape with a chain
per service and per endpoint, and the 1.36 shape with an inline ``numgen … map`` DNAT) and the
``iptables-restore`` text of its iptables mode (nat table). Deterministic: the same parameters
give byte-for-byte the same files. It only writes files; it never touches the kernel.

Scope: ClusterIP services with one TCP port, so only what those need is generated (no NodePort,
firewall or filter-table chains); the per-service and per-endpoint objects, which dominate at
scale, follow upstream's shapes. In the 1.36 shape the per-endpoint hairpin masquerade rule of
the endpoint chains has no place (there are no endpoint chains) and is left out.

    .venv/bin/python bench/gen.py --services 1000 --endpoints 10 --out /tmp/cluster
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any, TextIO

SERVICE_BASE = IPv4Address("10.96.0.0")
SERVICE_CIDR = IPv4Network("10.96.0.0/12")
POD_BASE = IPv4Address("10.128.0.0")
CLUSTER_CIDR = IPv4Network("10.128.0.0/9")
PORT = 80
TARGET_PORT = 8080
PORT_NAME = "http"
MASQ_MARK = 0x4000
NODE_NAME = "node-0"
NODE_IP = "192.168.77.1"


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """What to generate.

    Attributes:
        services: number of Services (one TCP port each, ``ClusterIP``).
        endpoints: ready endpoints per Service (one EndpointSlice per 100).
        nodes: endpoints are spread round-robin over ``node-0`` … ``node-{N-1}``.
        last_endpoints: when set, the last Service's endpoints are these addresses instead
            (the data-plane bench points it at a real pod).
    """

    services: int
    endpoints: int
    nodes: int = 3
    last_endpoints: tuple[str, ...] | None = None
    namespaces: int = 50
    overrides: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def name(self, i: int) -> tuple[str, str]:
        """(namespace, name) of Service ``i``."""
        return f"ns-{i % self.namespaces}", f"svc-{i:06d}"

    def vip(self, i: int) -> str:
        return str(SERVICE_BASE + 1 + i)

    def endpoint_ips(self, i: int) -> tuple[str, ...]:
        if i in self.overrides:
            return self.overrides[i]
        if self.last_endpoints is not None and i == self.services - 1:
            return self.last_endpoints
        first = 16 + i * self.endpoints
        return tuple(str(POD_BASE + first + e) for e in range(self.endpoints))

    def node_of(self, ip: str) -> str:
        return f"node-{int(IPv4Address(ip)) % self.nodes}"


# ---------------------------------------------------------------- manifests


def service_doc(c: Cluster, i: int) -> dict[str, Any]:
    ns, name = c.name(i)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "resourceVersion": "1"},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": c.vip(i),
            "clusterIPs": [c.vip(i)],
            "ipFamilies": ["IPv4"],
            "ports": [
                {"name": PORT_NAME, "protocol": "TCP", "port": PORT, "targetPort": TARGET_PORT}
            ],
        },
    }


def slice_docs(c: Cluster, i: int, per_slice: int = 100) -> Iterator[dict[str, Any]]:
    ns, name = c.name(i)
    ips = c.endpoint_ips(i)
    for k in range(0, max(len(ips), 1), per_slice):
        chunk = ips[k : k + per_slice]
        yield {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{name}-{k // per_slice:04d}",
                "namespace": ns,
                "labels": {"kubernetes.io/service-name": name},
                "resourceVersion": "1",
            },
            "addressType": "IPv4",
            "ports": [{"name": PORT_NAME, "protocol": "TCP", "port": TARGET_PORT}],
            "endpoints": [
                {
                    "addresses": [ip],
                    "conditions": {"ready": True, "serving": True, "terminating": False},
                    "nodeName": c.node_of(ip),
                }
                for ip in chunk
            ],
        }


def node_doc() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE_NAME},
        "spec": {"podCIDR": "10.128.0.0/24", "podCIDRs": ["10.128.0.0/24"]},
        "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]},
    }


def write_manifests(c: Cluster, out: Path, fmt: str = "yaml") -> list[Path]:
    """Write ``services``, ``endpointslices`` and ``node`` files into ``out``.

    ``fmt`` is ``yaml`` (multi-document block-style YAML as ``kubectl get -o yaml`` writes each
    object: keys sorted, lists at their key's indentation), ``yaml-flow`` (one JSON-style flow
    document per object between ``---`` lines, as JSON-emitting tools write YAML) or ``json``
    (one ``kind: List`` per file, as ``kubectl get -o json`` writes it). Returns the paths
    written.
    """
    out.mkdir(parents=True, exist_ok=True)
    groups = {
        "node": [node_doc()],
        "services": [service_doc(c, i) for i in range(c.services)],
        "endpointslices": [d for i in range(c.services) for d in slice_docs(c, i)],
    }
    paths = []
    for stem, docs in groups.items():
        path = out / f"{stem}.{'json' if fmt == 'json' else 'yaml'}"
        with path.open("w") as f:
            if fmt == "json":
                json.dump(_json_list(docs), f, indent=4)
            elif fmt == "yaml-flow":
                _write_flow_docs(f, docs)
            elif fmt == "yaml":
                _write_block_docs(f, docs)
            else:
                raise ValueError(f"unknown manifest format {fmt!r}")
        paths.append(path)
    return paths


def _json_list(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "items": docs, "kind": "List", "metadata": {"resourceVersion": ""}}


def _write_flow_docs(f: TextIO, docs: Sequence[dict[str, Any]]) -> None:
    # One flow-style (JSON) document per object: valid YAML that any loader reads, written
    # without PyYAML's emitter, which would dominate the generator's time at 100k objects.
    for doc in docs:
        f.write("---\n")
        f.write(json.dumps(doc, separators=(", ", ": ")))
        f.write("\n")


def _write_block_docs(f: TextIO, docs: Sequence[dict[str, Any]]) -> None:
    # Block style as kubectl writes it; by hand, as PyYAML's emitter would dominate the
    # generator's time at 100k objects (bench/checks reads the output back with PyYAML).
    for doc in docs:
        f.write("---\n")
        f.writelines(_block(doc, ""))


_PLAIN = re.compile(r"[A-Za-z][\w./-]*|\d{1,3}(\.\d{1,3}){3}(/\d{1,2})?")
_NOT_STRINGS = frozenset(("y", "n", "yes", "no", "on", "off", "true", "false", "null"))


def _scalar(value: object) -> str:
    if isinstance(value, str):
        plain = _PLAIN.fullmatch(value) and value.lower() not in _NOT_STRINGS
        return value if plain else json.dumps(value)
    return json.dumps(value)


def _block(value: dict[str, Any], indent: str) -> Iterator[str]:
    """The lines of a mapping in block style, each starting with ``indent``."""
    for key in sorted(value):
        item = value[key]
        if isinstance(item, dict) and item:
            yield f"{indent}{key}:\n"
            yield from _block(item, indent + "  ")
        elif isinstance(item, list) and item:
            yield f"{indent}{key}:\n"
            for entry in item:
                if isinstance(entry, dict) and entry:
                    lines = list(_block(entry, indent + "  "))
                    yield f"{indent}- {lines[0][len(indent) + 2 :]}"
                    yield from lines[1:]
                else:
                    yield f"{indent}- {_scalar(entry)}\n"
        elif isinstance(item, dict | list):
            yield f"{indent}{key}: {'{}' if isinstance(item, dict) else '[]'}\n"
        else:
            yield f"{indent}{key}: {_scalar(item)}\n"


def edit_one_endpoint(c: Cluster, i: int) -> Cluster:
    """The same cluster with Service ``i``'s first endpoint moved to a new address."""
    ips = list(c.endpoint_ips(i))
    ips[0] = str(POD_BASE + (1 << 22) + i)
    return Cluster(
        services=c.services,
        endpoints=c.endpoints,
        nodes=c.nodes,
        last_endpoints=c.last_endpoints,
        namespaces=c.namespaces,
        overrides={**c.overrides, i: tuple(ips)},
    )


# ---------------------------------------------------------------- names as kube-proxy makes them


def _hash32(text: str) -> str:
    return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()


def port_name(c: Cluster, i: int) -> str:
    """kube-proxy's ServicePortName string: ``namespace/name:port``."""
    ns, name = c.name(i)
    return f"{ns}/{name}:{PORT_NAME}"


def nft_service_chain(c: Cluster, i: int) -> str:
    ns, name = c.name(i)
    return f"service-{_hash32(port_name(c, i) + 'tcp')[:8]}-{ns}/{name}/tcp/{PORT_NAME}"


def nft_endpoint_chain(c: Cluster, i: int, ip: str) -> str:
    ns, name = c.name(i)
    h = _hash32(port_name(c, i) + "tcp" + f"{ip}:{TARGET_PORT}")[:8]
    return f"endpoint-{h}-{ns}/{name}/tcp/{PORT_NAME}__{ip}/{TARGET_PORT}"


def ipt_svc_chain(c: Cluster, i: int) -> str:
    return "KUBE-SVC-" + _hash32(port_name(c, i) + "tcp")[:16]


def ipt_sep_chain(c: Cluster, i: int, ip: str) -> str:
    return "KUBE-SEP-" + _hash32(port_name(c, i) + "tcp" + f"{ip}:{TARGET_PORT}")[:16]


# ---------------------------------------------------------------- kube-proxy nftables mode

NFT_TABLE = "kube-proxy"


def nft_base(t: str = NFT_TABLE) -> list[str]:
    """The static part of kube-proxy's nftables table (ClusterIP-only subset, IPv4)."""
    p = f"ip {t}"
    return [
        f'add table {p} {{ comment "rules for kube-proxy" ; }}',
        f"add chain {p} mark-for-masquerade",
        f"add rule {p} mark-for-masquerade mark set mark or {MASQ_MARK:#x}",
        f"add chain {p} masquerading",
        f"add rule {p} masquerading mark and {MASQ_MARK:#x} == 0 return",
        f"add rule {p} masquerading mark set mark xor {MASQ_MARK:#x}",
        f"add rule {p} masquerading masquerade fully-random",
        f'add set {p} cluster-ips {{ type ipv4_addr ; comment "Active ClusterIPs" ; }}',
        f"add map {p} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; "
        'comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }',
        f"add map {p} no-endpoint-services {{ type ipv4_addr . inet_proto . inet_service : "
        'verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }',
        f"add chain {p} services",
        f"add rule {p} services ip daddr . meta l4proto . th dport vmap @service-ips",
        f"add chain {p} service-endpoints-check",
        f"add rule {p} service-endpoints-check ip daddr . meta l4proto . th dport "
        "vmap @no-endpoint-services",
        f"add chain {p} cluster-ips-check",
        f"add rule {p} cluster-ips-check ip daddr @cluster-ips reject "
        'comment "Reject traffic to invalid ports of ClusterIPs"',
        f"add rule {p} cluster-ips-check ip daddr {SERVICE_CIDR} drop "
        'comment "Drop traffic to unallocated ClusterIPs"',
        f"add chain {p} filter-prerouting {{ type filter hook prerouting priority -110 ; }}",
        f"add rule {p} filter-prerouting ct state new jump service-endpoints-check",
        f"add chain {p} filter-output {{ type filter hook output priority -110 ; }}",
        f"add rule {p} filter-output ct state new jump service-endpoints-check",
        f"add rule {p} filter-output ct state new jump cluster-ips-check",
        f"add chain {p} nat-prerouting {{ type nat hook prerouting priority -100 ; }}",
        f"add rule {p} nat-prerouting jump services",
        f"add chain {p} nat-output {{ type nat hook output priority -100 ; }}",
        f"add rule {p} nat-output jump services",
        f"add chain {p} nat-postrouting {{ type nat hook postrouting priority 100 ; }}",
        f"add rule {p} nat-postrouting jump masquerading",
    ]


def nft_service(c: Cluster, i: int, shape: str, t: str = NFT_TABLE) -> list[str]:
    """One service port's objects in kube-proxy's ``shape`` (``nft-1.31`` or ``nft-1.36``),
    as its partial sync writes them: chains added then flushed, then their rules re-added."""
    p = f"ip {t}"
    vip, ips = c.vip(i), c.endpoint_ips(i)
    svc = nft_service_chain(c, i)
    out = [f"add chain {p} {svc}", f"flush chain {p} {svc}"]
    out.append(
        f"add rule {p} {svc} ip daddr {vip} tcp dport {PORT} ip saddr != {CLUSTER_CIDR} "
        "jump mark-for-masquerade"
    )
    n = len(ips)
    if shape == "nft-1.31":
        # Endpoint chains first: the service's vmap refers to them.
        eps = []
        for ip in ips:
            ep = nft_endpoint_chain(c, i, ip)
            eps += [
                f"add chain {p} {ep}",
                f"flush chain {p} {ep}",
                f"add rule {p} {ep} ip saddr {ip} jump mark-for-masquerade",
                f"add rule {p} {ep} meta l4proto tcp dnat to {ip}:{TARGET_PORT}",
            ]
        out = eps + out
        targets = ", ".join(
            f"{k} : goto {nft_endpoint_chain(c, i, ip)}" for k, ip in enumerate(ips)
        )
        out.append(f"add rule {p} {svc} numgen random mod {n} vmap {{ {targets} }}")
    elif shape == "nft-1.36":
        # No endpoint chains: one DNAT rule with an anonymous map of (address . port).
        targets = ", ".join(f"{k} : {ip} . {TARGET_PORT}" for k, ip in enumerate(ips))
        out.append(
            f"add rule {p} {svc} meta l4proto tcp dnat ip addr . port to numgen random mod {n} "
            f"map {{ {targets} }}"
        )
    else:
        raise ValueError(f"unknown nft shape {shape!r}")
    out += [
        f"add element {p} cluster-ips {{ {vip} }}",
        f"add element {p} service-ips {{ {vip} . tcp . {PORT} : goto {svc} }}",
    ]
    return out


def nft_text(c: Cluster, shape: str) -> str:
    """The whole ``nft -f`` input of kube-proxy's first (full) sync for ``c``."""
    lines = nft_base()
    for i in range(c.services):
        lines += nft_service(c, i, shape)
    return "\n".join(lines) + "\n"


def nft_partial(c: Cluster, old: Cluster, i: int, shape: str) -> str:
    """What a partial sync sends when only Service ``i``'s endpoints changed from ``old``:
    its chains re-written, the endpoint chains that went away flushed and deleted."""
    lines = nft_service(c, i, shape)
    if shape == "nft-1.31":
        gone = set(old.endpoint_ips(i)) - set(c.endpoint_ips(i))
        p = f"ip {NFT_TABLE}"
        for ip in sorted(gone):
            ep = nft_endpoint_chain(c, i, ip)
            lines += [f"flush chain {p} {ep}", f"delete chain {p} {ep}"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- kube-proxy iptables mode


def iptables_text(c: Cluster) -> str:
    """The nat table ``iptables-restore`` input of kube-proxy's iptables mode for ``c``."""
    chains = ["KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-MARK-MASQ", "KUBE-NODEPORTS"]
    rules = [
        '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
        '-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
        '-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING',
        f"-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK:#x}/{MASQ_MARK:#x} -j RETURN",
        f"-A KUBE-POSTROUTING -j MARK --xor-mark {MASQ_MARK:#x}",
        '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" '
        "-j MASQUERADE --random-fully",
        f"-A KUBE-MARK-MASQ -j MARK --or-mark {MASQ_MARK:#x}",
    ]
    per_service: list[str] = []
    for i in range(c.services):
        svc, pn, vip = ipt_svc_chain(c, i), port_name(c, i), c.vip(i)
        ips = c.endpoint_ips(i)
        chains.append(svc)
        match = f"-m tcp -p tcp -d {vip}/32 --dport {PORT}"
        rules.append(f'-A KUBE-SERVICES -m comment --comment "{pn} cluster IP" {match} -j {svc}')
        per_service.append(
            f'-A {svc} -m comment --comment "{pn} cluster IP" {match} ! -s {CLUSTER_CIDR} '
            "-j KUBE-MARK-MASQ"
        )
        for k, ip in enumerate(ips):
            sep = ipt_sep_chain(c, i, ip)
            chains.append(sep)
            left = len(ips) - k
            stat = f"-m statistic --mode random --probability {1 / left:0.10f} " if left > 1 else ""
            per_service += [
                f'-A {svc} -m comment --comment "{pn} -> {ip}:{TARGET_PORT}" {stat}-j {sep}',
                f'-A {sep} -m comment --comment "{pn}" -s {ip}/32 -j KUBE-MARK-MASQ',
                f'-A {sep} -m comment --comment "{pn}" -m tcp -p tcp '
                f"-j DNAT --to-destination {ip}:{TARGET_PORT}",
            ]
    rules.append(
        '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must '
        'be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS'
    )
    head = ["*nat", *(f":{b} ACCEPT [0:0]" for b in ("PREROUTING", "OUTPUT", "POSTROUTING"))]
    head += [f":{ch} - [0:0]" for ch in chains]
    return "\n".join([*head, *rules, *per_service, "COMMIT"]) + "\n"


# ---------------------------------------------------------------- command line


def write_all(c: Cluster, out: Path, fmt: str = "yaml") -> dict[str, Path]:
    """Manifests plus every baseline's input, in ``out``; returns a map of what is where."""
    write_manifests(c, out / "manifests", fmt)
    files = {"manifests": out / "manifests"}
    for shape in ("nft-1.31", "nft-1.36"):
        files[shape] = out / f"{shape}.nft"
        files[shape].write_text(nft_text(c, shape))
    files["iptables"] = out / "iptables.rules"
    files["iptables"].write_text(iptables_text(c))
    return files


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--services", type=int, default=1000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--format", choices=("yaml", "yaml-flow", "json"), default="yaml")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    c = Cluster(services=args.services, endpoints=args.endpoints, nodes=args.nodes)
    for what, path in write_all(c, args.out, args.format).items():
        print(json.dumps({"bench": "gen", "file": what, "path": str(path)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
