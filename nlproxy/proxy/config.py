"""Planner configuration: the node facts and options the planner needs, validated once.

Sits between the daemon's configuration (flags, KubeProxyConfiguration) and the planner. Pure
data: no I/O, no clock, no logging. The planner never reads anything but this and the snapshot.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network, ip_network

from nlproxy.cluster.model import IPAddress, IPNetwork, LoadBalancing
from nlproxy.errors import ConfigError
from nlproxy.nft.validate import check_ifname

PRIMARY = "primary"
"""``nodeport_addresses`` entry meaning "the node's primary IP of each family"."""


class DetectLocal(enum.StrEnum):
    """kube-proxy's ``detectLocalMode``: how a packet's source is told to be a pod of this
    cluster (not masqueraded on its way to a ClusterIP; short-circuited for
    externalTrafficPolicy Local).

    ``ClusterCIDR``: the source is in ``cluster_cidrs``. ``NodeCIDR``: the source is in the Node's
    ``spec.podCIDRs`` (the first of each family), followed as the Node changes.
    ``BridgeInterface``: the packet came in on the bridge named ``pod_interface``.
    ``InterfaceNamePrefix``: it came in on an interface whose name starts with ``pod_interface``.
    A family with nothing to match (no CIDR of it) tells no pod apart, as upstream's no-op
    detector.
    """

    CLUSTER_CIDR = "ClusterCIDR"
    NODE_CIDR = "NodeCIDR"
    BRIDGE_INTERFACE = "BridgeInterface"
    INTERFACE_NAME_PREFIX = "InterfaceNamePrefix"


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyConfig:
    """What the planner needs besides the cluster snapshot.

    Attributes:
        node_name: this node's name (``Endpoint.node_name`` equal to it makes an endpoint local).
        cluster_cidrs: pod ranges; sources inside them are "pods" (no masquerade to cluster IPs,
            short-circuit for externalTrafficPolicy Local). Empty: no pod detection, as upstream.
        service_cidrs: ranges ClusterIPs come from (besides ServiceCIDR objects); traffic to an
            unallocated address in them is dropped.
        nodeport_addresses: ``primary`` (the node's primary IP per family) and/or CIDRs. A family
            without any entry accepts NodePorts on every local address but loopback.
        masquerade_bit: bit of the packet mark that asks for masquerade (0..31).
        node_ips: this node's addresses, overriding the Node object's when not empty.
        service_counters: count the packets and bytes of every frontend (``--service-counters``):
            two sets with a counter per element and the chains that advance them.
        load_balancing: the endpoint choice of Services without ``nlproxy.io/load-balancing``.
        hash_seed: the ``jhash`` seed of every consistent-hash Service; None derives one per
            Service from its UID, so every node agrees without configuration.
        masquerade_all: masquerade every packet to a ClusterIP, whatever its source
            (kube-proxy's ``masqueradeAll``).
        detect_local: how pods are told apart (:class:`DetectLocal`).
        pod_interface: the bridge (``BridgeInterface``) or the name prefix
            (``InterfaceNamePrefix``) of the pods' interfaces.
    """

    node_name: str
    cluster_cidrs: tuple[IPNetwork, ...] = ()
    service_cidrs: tuple[IPNetwork, ...] = ()
    nodeport_addresses: tuple[str, ...] = (PRIMARY,)
    masquerade_bit: int = 14
    node_ips: tuple[IPAddress, ...] = ()
    service_counters: bool = False
    load_balancing: LoadBalancing = LoadBalancing.RANDOM
    hash_seed: int | None = None
    masquerade_all: bool = False
    detect_local: DetectLocal = DetectLocal.CLUSTER_CIDR
    pod_interface: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.masquerade_bit <= 31:
            raise ConfigError(
                "config masqueradeBit", f"{self.masquerade_bit} is not in 0..31", field="value"
            )
        if self.hash_seed is not None and not 0 <= self.hash_seed <= 0xFFFFFFFF:
            raise ConfigError(
                "config consistentHashSeed", f"{self.hash_seed} is not in 0..4294967295"
            )
        if self.detect_local in INTERFACE_MODES:
            bridge = self.detect_local is DetectLocal.BRIDGE_INTERFACE
            flag = "--pod-bridge-interface" if bridge else "--pod-interface-name-prefix"
            if not self.pod_interface:
                raise ConfigError(
                    flag, f"must name an interface with detectLocalMode {self.detect_local}"
                )
            # nft matches a name, or the prefix followed by a "*" of its own
            name = self.pod_interface
            why = check_ifname(name) if "*" not in name else f"{name!r}: no '*' in a name"
            if why is not None:
                raise ConfigError(flag, why)
        for entry in self.nodeport_addresses:
            if entry != PRIMARY:
                parse_nodeport_cidr(entry)

    @property
    def masquerade_mark(self) -> int:
        return 1 << self.masquerade_bit

    def nodeport_cidrs(self, version: int) -> tuple[IPNetwork, ...]:
        """The ``nodeport_addresses`` CIDRs of one IP version (4 or 6)."""
        nets = (parse_nodeport_cidr(e) for e in self.nodeport_addresses if e != PRIMARY)
        return tuple(n for n in nets if n.version == version)


INTERFACE_MODES = (DetectLocal.BRIDGE_INTERFACE, DetectLocal.INTERFACE_NAME_PREFIX)


def parse_nodeport_cidr(entry: str) -> IPv4Network | IPv6Network:
    """Parse one ``nodeport_addresses`` CIDR.

    Raises:
        ConfigError: naming the entry, when it is neither ``primary`` nor a CIDR.
    """
    try:
        return ip_network(entry, strict=False)
    except ValueError as exc:
        raise ConfigError(
            "config nodePortAddresses", f"{entry!r} is neither 'primary' nor a CIDR"
        ) from exc
