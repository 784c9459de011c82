"""This node's addresses and the pods' and Services' source ranges, per family, as the planner
matches them: ``--node-ip`` or the Node's addresses, the NodePort addresses
(``nodePortAddresses``), the pod ranges and interface of ``detectLocalMode``, and the
families where no address accepts NodePorts (``nodeport_gaps``, worth a warning).

Pure: reads the snapshot and the config, nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable
from ipaddress import collapse_addresses

from nlproxy.cluster.model import ClusterSnapshot, IPAddress, IPNetwork, Service
from nlproxy.nft.ir import Family
from nlproxy.proxy.config import PRIMARY, DetectLocal, ProxyConfig
from nlproxy.proxy.skeleton import IPV4, IPV6, FamilySpec


def node_ips_of(f: FamilySpec, snapshot: ClusterSnapshot, config: ProxyConfig) -> list[IPAddress]:
    """This node's IPs of one family: ``--node-ip``, else the Node object's (primary first)."""
    node = snapshot.node
    all_ips = config.node_ips or (node.addresses if node else ())
    return [ip for ip in all_ips if ip.version == f.version]


def nodeport_ips_of(
    f: FamilySpec, snapshot: ClusterSnapshot, config: ProxyConfig
) -> list[IPAddress] | None:
    """The addresses of one family that accept NodePorts, or None for "every local address".

    ``primary`` is the node's primary IP of the family; a CIDR selects the node's IPs and its
    interface addresses (``snapshot.local_addresses``) inside it, as upstream matches
    ``nodePortAddresses`` against the kernel's view. Loopback addresses are left out: NodePorts on
    them would need route_localnet, and upstream leaves them out too.
    """
    cidrs = config.nodeport_cidrs(f.version)
    primary = PRIMARY in config.nodeport_addresses
    if (not cidrs and not primary) or any(c.prefixlen == 0 for c in cidrs):
        return None
    node_ips = node_ips_of(f, snapshot, config)
    ips = [ip for ip in node_ips if any(ip in c for c in cidrs)]
    local = (a for a in snapshot.local_addresses if a.version == f.version)
    ips += [ip for ip in local if any(ip in c for c in cidrs)]
    if primary and node_ips:
        ips.insert(0, node_ips[0])
    return sorted({ip for ip in ips if ip not in f.loopback})


def nodeport_gaps(snapshot: ClusterSnapshot, config: ProxyConfig) -> dict[Family, str]:
    """Families whose NodePorts no address accepts although a Service has node ports there,
    each with a sentence naming the node, what ``nodePortAddresses`` asked for and what was
    looked at (the traffic would be refused: worth a warning, never silence).

    Cheap in the usual case: the services are only walked for a family without addresses.
    """
    gaps: dict[Family, str] = {}
    for f in (IPV4, IPV6):
        if nodeport_ips_of(f, snapshot, config) != []:
            continue
        if not any_nodeport(snapshot.services.values(), f.version):
            continue
        node = snapshot.node
        name = config.node_name or "(no --node-name)"
        looked = [
            f"Node {name}: "
            + (
                ", ".join(map(str, node_ips_of(f, snapshot, config))) or "no address"
                if node or config.node_ips
                else "no Node object"
            )
        ]
        if config.nodeport_cidrs(f.version):
            local = [str(a) for a in snapshot.local_addresses if a.version == f.version]
            looked.append(f"interfaces: {', '.join(local) or 'no address'}")
        wanted = ",".join(config.nodeport_addresses)
        gaps[f.family] = (
            f"node {name}: nodePortAddresses {wanted} selects no IPv{f.version} address "
            f"({'; '.join(looked)}): IPv{f.version} NodePorts are refused"
        )
    return gaps


def any_nodeport(services: Iterable[Service], version: int) -> bool:
    """Whether any of ``services`` has a node port and a ClusterIP of IP ``version``.

    Plain loops, not a generator per Service: on a node without addresses of a family this
    walks every Service before its first sync (10k: ~5 ms as generators, ~1 ms so)."""
    for svc in services:
        for port in svc.ports:
            if port.node_port:
                break
        else:
            continue
        for ip in svc.cluster_ips:
            if ip.version == version:
                return True
    return False


def pod_cidrs_of(f: FamilySpec, snapshot: ClusterSnapshot, config: ProxyConfig) -> list[IPNetwork]:
    """The source ranges of one family that are this cluster's pods (the ``cluster-cidrs`` set):
    ``clusterCIDR``'s, or with ``NodeCIDR`` the first of the Node's ``spec.podCIDRs`` of the
    family (as upstream; a Node without one tells no pod apart until it has one)."""
    if config.detect_local is DetectLocal.NODE_CIDR:
        node = snapshot.node
        for cidr in node.pod_cidrs if node else ():
            if cidr.version == f.version:
                return [cidr]
        return []
    if config.detect_local is DetectLocal.CLUSTER_CIDR:
        return collapse(config.cluster_cidrs, f.version)
    return []


def pod_iifname(config: ProxyConfig) -> str:
    """The ``iifname`` pods' packets come in on with the interface modes: the bridge's name
    (``BridgeInterface``) or the name prefix with nft's ``*`` (``InterfaceNamePrefix``); empty
    with the CIDR modes."""
    if config.detect_local is DetectLocal.BRIDGE_INTERFACE:
        return config.pod_interface
    if config.detect_local is DetectLocal.INTERFACE_NAME_PREFIX:
        return config.pod_interface + "*"
    return ""


def collapse(nets: Iterable[IPNetwork], version: int) -> list[IPNetwork]:
    """The networks of ``nets`` of one IP version, sorted, overlaps and neighbours merged."""
    return list(collapse_addresses(sorted({x for x in nets if x.version == version})))  # type: ignore[type-var]
