"""Names of every nftables object nlproxy creates: the one place they are made.

Sits inside the planner: fixed names for the static skeleton, and per-service-port names (only
ClientIP affinity needs per-service objects) built as role prefix + short hash + readable text.
The hash keeps names unique when the readable part is shortened; the kernel's limit is checked
here. Pure: no I/O, no clock, no logging.
"""

from __future__ import annotations

import base64
import hashlib

from nlproxy.cluster.model import IPAddress, ServicePortRef
from nlproxy.errors import InvalidNftObject

TABLE = "nlproxy"
MAX_NAME = 255
"""NFT_NAME_MAXLEN (256) counts the terminating NUL."""

# Base chains.
FILTER_PREROUTING = "filter-prerouting"
FILTER_INPUT = "filter-input"
FILTER_FORWARD = "filter-forward"
FILTER_OUTPUT = "filter-output"
FILTER_OUTPUT_POST_DNAT = "filter-output-post-dnat"
NAT_PREROUTING = "nat-prerouting"
NAT_OUTPUT = "nat-output"
NAT_POSTROUTING = "nat-postrouting"
COUNTERS_PREROUTING = "counters-prerouting"
COUNTERS_OUTPUT = "counters-output"

# Static regular chains.
SERVICES = "services"
MASQUERADING = "masquerading"
MARK_FOR_MASQUERADE = "mark-for-masquerade"
FIREWALL_CHECK = "firewall-check"
SERVICE_ENDPOINTS_CHECK = "service-endpoints-check"
NODEPORT_ENDPOINTS_CHECK = "nodeport-endpoints-check"
CLUSTER_IPS_CHECK = "cluster-ips-check"
REJECT_CHAIN = "reject-chain"
COUNT_SERVICES = "count-services"

# Global sets and maps.
CLUSTER_IPS = "cluster-ips"
SERVICE_CIDRS = "service-cidrs"
CLUSTER_CIDRS = "cluster-cidrs"
NODEPORT_IPS = "nodeport-ips"
SERVICE_IPS = "service-ips"
SERVICE_NODEPORTS = "service-nodeports"
NO_ENDPOINT_SERVICES = "no-endpoint-services"
NO_ENDPOINT_NODEPORTS = "no-endpoint-nodeports"
FIREWALL_IPS = "firewall-ips"
FIREWALL_ALLOW = "firewall-allow"
BACKENDS = "backends"
BACKENDS_LOCAL = "backends-local"
NODEPORT_BACKENDS = "nodeport-backends"
NODEPORT_BACKENDS_LOCAL = "nodeport-backends-local"
EXTERNAL_SHORTCUTS = "external-shortcuts"
NODEPORT_SHORTCUTS = "nodeport-shortcuts"
HAIRPIN = "hairpin"
SERVICE_COUNTERS = "service-counters"
NODEPORT_COUNTERS = "nodeport-counters"


# Shared dispatch chains, one per (role, endpoint count N).
def cluster_ip_chain(n: int) -> str:
    """ClusterIP traffic: masquerade non-pod sources, DNAT through ``backends``."""
    return f"cluster-ip-{n}"


def external_chain(n: int) -> str:
    """externalTrafficPolicy Cluster, external IP / LB IP: masquerade, DNAT via ``backends``."""
    return f"external-{n}"


def external_local_chain(n: int) -> str:
    """externalTrafficPolicy Local, external IP / LB IP: short-circuits, ``backends-local``."""
    return f"external-local-{n}"


def dnat_chain(n: int) -> str:
    """Plain DNAT through ``backends`` (target of the short-circuits)."""
    return f"dnat-{n}"


def nodeport_chain(n: int) -> str:
    return f"nodeport-{n}"


def nodeport_local_chain(n: int) -> str:
    return f"nodeport-local-{n}"


def nodeport_dnat_chain(n: int) -> str:
    return f"nodeport-dnat-{n}"


def dnat_local_chain(n: int) -> str:
    """Plain DNAT through ``backends-local`` (a Local-policy affinity port's new clients)."""
    return f"dnat-local-{n}"


def nodeport_dnat_local_chain(n: int) -> str:
    """Plain DNAT through ``nodeport-backends-local`` (as :func:`dnat_local_chain`)."""
    return f"nodeport-dnat-local-{n}"


def is_local_dispatch(name: str) -> bool:
    """Whether ``name`` is a shared chain of externalTrafficPolicy Local
    (:func:`external_local_chain`, :func:`nodeport_local_chain`)."""
    n = _count(name)
    return n is not None and name in (external_local_chain(n), nodeport_local_chain(n))


def is_cluster_dispatch(name: str) -> bool:
    """Whether ``name`` is a shared chain of externalTrafficPolicy Cluster
    (:func:`external_chain`, :func:`nodeport_chain`)."""
    n = _count(name)
    return n is not None and name in (external_chain(n), nodeport_chain(n))


def _count(name: str) -> int | None:
    """The endpoint count a shared dispatch chain's name ends with, else None."""
    tail = name.rpartition("-")[2]
    return int(tail) if tail.isascii() and tail.isdigit() else None


# Per-service-port objects (ClientIP affinity only).
def _hashed(prefix: str, text: str) -> str:
    name = f"{prefix}-{_short_hash(text)}-{text}"
    return name[:MAX_NAME]


_HASH = 8
"""Characters of the hash in a per-port object's name."""
_B32 = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")


def _short_hash(text: str) -> str:
    return base64.b32encode(hashlib.sha256(text.encode()).digest())[:_HASH].decode()


def _port_text(ref: ServicePortRef) -> str:
    return f"{ref.namespace}/{ref.name}/{ref.protocol.value.lower()}/{ref.port_name}"


def _endpoint_text(ref: ServicePortRef, ip: IPAddress, port: int) -> str:
    # (nft reads a name back only without colons: an IPv6 address's are written as dashes.)
    return f"{_port_text(ref)}__{str(ip).replace(':', '-')}/{port}"


def affinity_service_chain(ref: ServicePortRef) -> str:
    """Cluster-policy chain of an affinity service port (upstream ``service-…``)."""
    return _hashed("service", _port_text(ref))


def affinity_local_chain(ref: ServicePortRef) -> str:
    return _hashed("local", _port_text(ref))


def affinity_external_chain(ref: ServicePortRef) -> str:
    return _hashed("external", _port_text(ref))


AFFINITY_ENDPOINT = "endpoint"
"""Role prefix of a ClientIP-affinity port's endpoint chains (their comment names the port)."""


def affinity_endpoint_chain(ref: ServicePortRef, ip: IPAddress, port: int) -> str:
    return _hashed(AFFINITY_ENDPOINT, _endpoint_text(ref, ip, port))


def affinity_set(ref: ServicePortRef, ip: IPAddress, port: int) -> str:
    return _hashed("affinity", _endpoint_text(ref, ip, port))


# The map layout of ClientIP affinity (``affinity.py``): per port a dynamic map, client ->
# endpoint (and one of the clients of this node's endpoints, for a Local policy), learned after
# DNAT by the port's chain, found by the connection's original destination from the static
# base chains below.
AFFINITY_PREROUTING = "affinity-prerouting"
AFFINITY_OUTPUT = "affinity-output"
AFFINITY_ADDRESSES = "affinity-addresses"
"""``address . protocol . port -> goto <the port's learning chain>``: the ClusterIP, external
and LoadBalancer frontends of affinity ports."""
AFFINITY_NODEPORTS = "affinity-nodeports"
"""``protocol . node port -> goto <the port's learning chain>``."""
AFFINITY_ENDPOINTS = "affinity-endpoints"
"""``protocol . node port . endpoint address``: the node ports' endpoints (a connection to a node
port of another frontend's, with the same port number, is not learned)."""
AFFINITY_CLIENTS = "clients"
"""Role prefix of a port's dynamic map ``client -> endpoint`` (its comment names the port)."""
AFFINITY_LOCAL_CLIENTS = "localclients"
"""Role prefix of a Local-policy port's dynamic map of the clients of this node's endpoints."""
AFFINITY_CLIENT_PORTS, AFFINITY_LOCAL_CLIENT_PORTS = "clientports", "localclientports"
"""Role prefixes of the IPv6 maps of those clients' endpoint ports (the address maps hold the
address alone)."""
AFFINITY_LOCAL_ENDPOINTS = "localeps"
"""Role prefix of a Local-policy port's set of this node's endpoints (``address . port``)."""
AFFINITY_LEARN = "learn"


def affinity_clients_map(ref: ServicePortRef) -> str:
    return _hashed(AFFINITY_CLIENTS, _port_text(ref))


def affinity_local_clients_map(ref: ServicePortRef) -> str:
    return _hashed(AFFINITY_LOCAL_CLIENTS, _port_text(ref))


def affinity_client_ports_map(ref: ServicePortRef) -> str:
    return _hashed(AFFINITY_CLIENT_PORTS, _port_text(ref))


def affinity_local_client_ports_map(ref: ServicePortRef) -> str:
    return _hashed(AFFINITY_LOCAL_CLIENT_PORTS, _port_text(ref))


def affinity_local_endpoints(ref: ServicePortRef) -> str:
    return _hashed(AFFINITY_LOCAL_ENDPOINTS, _port_text(ref))


def affinity_learn_chain(ref: ServicePortRef) -> str:
    """The chain that learns the clients of port ``ref``."""
    return _hashed(AFFINITY_LEARN, _port_text(ref))


AFFINITY_NEW, AFFINITY_NEW_LOCAL = "new", "newlocal"
"""Role prefixes of the chains that choose a new client's endpoint, for every endpoint and for
this node's (the only per-port chains an endpoint count changes)."""


def affinity_new_chain(ref: ServicePortRef, local: bool) -> str:
    """The chain choosing an endpoint for a new client of port ``ref``: jumps to the shared
    ``dnat-N`` chains (``local``: the ``…-local-N`` ones, this node's endpoints)."""
    return _hashed(AFFINITY_NEW_LOCAL if local else AFFINITY_NEW, _port_text(ref))


# Per-service-port objects of round-robin and consistent-hash ports (``balance.py``).
def balanced_chain(role: str, ref: ServicePortRef) -> str:
    """``role``: internal (ClusterIP), external, or dnat (external traffic's short-circuits)."""
    return _hashed(f"lb-{role}", _port_text(ref))


BALANCED_MAPS = ("lb-cluster", "lb-local")
"""Role prefixes of a round-robin or consistent-hash port's maps, Cluster then Local policy
(their comment names the port)."""


def balanced_map(local: bool, ref: ServicePortRef) -> str:
    """The index (round-robin) or slot (consistent hash) → endpoint map of one endpoint list."""
    return _hashed(BALANCED_MAPS[local], _port_text(ref))


# Recognisers of the per-port names above (``operate/``: whose object is this?).
_AFFINITY_DISPATCH = ("service", "local", "external")
"""Role prefixes of an affinity port's own dispatch chains (``affinity_*_chain``)."""
_PORT_ROLES = frozenset(
    (*_AFFINITY_DISPATCH, AFFINITY_ENDPOINT, "affinity", AFFINITY_CLIENTS, AFFINITY_LEARN,
     AFFINITY_LOCAL_CLIENTS, AFFINITY_LOCAL_ENDPOINTS, AFFINITY_CLIENT_PORTS,
     AFFINITY_LOCAL_CLIENT_PORTS, AFFINITY_NEW, AFFINITY_NEW_LOCAL,
     *(f"lb-{role}" for role in ("internal", "external", "dnat")), *BALANCED_MAPS)
)  # fmt: skip
"""Every role prefix of a per-port object's name."""


def _unhashed(name: str) -> tuple[str, str] | None:
    """(role prefix, text) of a per-port object's name (:func:`_hashed`), else None. The hash
    is checked against the text unless the name was cut at :data:`MAX_NAME`."""
    role, _, rest = name.partition("-")
    if role == "lb":
        kind, _, rest = rest.partition("-")
        role = f"lb-{kind}"
    short, dash, text = rest[:_HASH], rest[_HASH : _HASH + 1], rest[_HASH + 1 :]
    if role not in _PORT_ROLES or dash != "-" or not _B32.issuperset(short):
        return None
    if len(name) < MAX_NAME and _short_hash(text) != short:
        return None
    return role, text


def is_affinity_dispatch(name: str) -> bool:
    """Whether ``name`` is a ClientIP-affinity port's own dispatch chain
    (:func:`affinity_service_chain`, :func:`affinity_local_chain`,
    :func:`affinity_external_chain`)."""
    parts = _unhashed(name)
    return parts is not None and parts[0] in _AFFINITY_DISPATCH


def port_object_owner(name: str) -> tuple[str, str] | None:
    """(namespace, name) of the Service a per-port chain, set or map belongs to, read from the
    name its builder here gave it; None for any other name (a shared object's)."""
    parts = _unhashed(name)
    if parts is None:
        return None
    namespace, _, rest = parts[1].partition("/")
    service, slash, _ = rest.partition("/")
    return (namespace, service) if namespace and service and slash else None


def check_name(kind: str, name: str) -> str:
    """Return ``name`` if the kernel accepts it.

    Raises:
        InvalidNftObject: naming the object, when the name is empty or too long.
    """
    if not name or len(name.encode()) > MAX_NAME:
        raise InvalidNftObject(f"{kind} {name[:60]}", f"name length is not in 1..{MAX_NAME}")
    return name
