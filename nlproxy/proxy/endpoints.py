"""Endpoint selection: which endpoints of a service port this node sends traffic to.

Sits between the cluster snapshot and the planner: resolves each ServicePort against its
EndpointSlices (port looked up by the slice port's name, so named targetPorts resolve per slice),
deduplicates by IP:port, and splits the result into the cluster and local sets as kube-proxy's
``CategorizeEndpoints`` does (conditions, topology hints). Pure: no I/O, clock or logging.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import compress, repeat
from operator import attrgetter, lt
from typing import NamedTuple, overload

import msgspec

from nlproxy.cluster.model import (
    Endpoint,
    EndpointSlice,
    IPAddress,
    IPFamily,
    Protocol,
    Service,
    ServicePort,
)
from nlproxy.nft.packed import PackedElements


class Backend(NamedTuple):
    """One endpoint address and the port it serves this service port on.

    Just the pair, as a backends map element's data holds it: a plan keeps one per endpoint
    and frontend policy, 100k and more at scale, so the endpoint it came from is not kept.
    """

    ip: IPAddress
    port: int

    @property
    def text(self) -> str:
        """``10.0.0.1:80`` or ``[fd00::1]:80``."""
        return f"[{self.ip}]:{self.port}" if self.ip.version == 6 else f"{self.ip}:{self.port}"


_new = tuple.__new__
"""``_new(Backend, (ip, port))``: a Backend without the NamedTuple's Python ``__new__`` frame
(100k and more per plan)."""


class OnePort(Sequence[Backend]):
    """The backends of endpoints that all serve a port on one number (a port resolved from one
    slice, the common case): the endpoints and the number, each :class:`Backend` made when
    read. A plan keeps these for every port, so at 100k endpoints this holds no 100k pairs
    (about 6 MB), only the endpoints tuple the cluster state holds anyway.

    It is a sequence of Backends equal to (and hashing as) the tuple of them; ``endpoints``
    and ``port`` give the pairs' parts without making them.
    """

    __slots__ = ("endpoints", "port")

    def __init__(self, endpoints: Sequence[Endpoint], port: int) -> None:
        self.endpoints = endpoints
        self.port = port

    def addresses(self) -> Iterator[IPAddress]:
        return map(_ip, self.endpoints)

    def __len__(self) -> int:
        return len(self.endpoints)

    def __iter__(self) -> Iterator[Backend]:
        return map(_new, repeat(Backend), zip(map(_ip, self.endpoints), repeat(self.port)))

    @overload
    def __getitem__(self, i: int) -> Backend: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Backend, ...]: ...
    def __getitem__(self, i: int | slice) -> Backend | tuple[Backend, ...]:
        if isinstance(i, slice):
            return tuple(self)[i]
        return _new(Backend, (self.endpoints[i].ip, self.port))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, OnePort):
            if self.endpoints is other.endpoints:
                return self.port == other.port
            other = tuple(other)
        return tuple(self) == other

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __add__(self, other: object) -> tuple[Backend, ...]:
        return (*self, *other) if isinstance(other, tuple | OnePort) else NotImplemented

    def __radd__(self, other: object) -> tuple[Backend, ...]:
        return (*other, *self) if isinstance(other, tuple | OnePort) else NotImplemented

    def __repr__(self) -> str:
        return repr(tuple(self))


_ip = attrgetter("ip")


def addresses(backends: Sequence[Backend]) -> Iterator[IPAddress]:
    """The addresses of ``backends`` (no pair made for a :class:`OnePort`)."""
    if isinstance(backends, OnePort):
        return backends.addresses()
    return map(_ip, backends)


def packed_data(store: PackedElements, backends: Sequence[Backend]) -> tuple[bytes, ...]:
    """The backends map's data of ``backends`` (a :class:`OnePort` packed from its addresses
    and number: no pair made per endpoint)."""
    if isinstance(backends, OnePort):
        return tuple(store.pack_port(list(backends.addresses()), backends.port))
    return tuple(store.pack_rows(backends))


class Categorized(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The endpoint sets of one service port on this node.

    Attributes:
        cluster: endpoints for Cluster traffic policy (empty when no policy uses them).
        local: endpoints on this node for Local policy (empty when no policy uses them).
        has_any: the service has usable endpoints somewhere in the cluster.
        local_terminating: ``local`` is the serving-terminating fallback (no local endpoint is
            ready): traffic still drains to them, but the health-check node port fails so load
            balancers move away (upstream counts only ready local endpoints there).
    """

    cluster: Sequence[Backend]
    local: Sequence[Backend]
    has_any: bool
    local_terminating: bool = False


def resolve(
    port: ServicePort, slices: Sequence[EndpointSlice], family: IPFamily
) -> tuple[Sequence[Backend], Sequence[Endpoint]]:
    """Backends of ``port`` from the slices of one family, sorted by (ip, port), deduplicated,
    and beside them (same order) the endpoints they came from, whose conditions and hints
    decide their use.

    A slice serves the port when it has a port of the same name and protocol. When two slices
    list the same IP:port, the one whose name sorts first wins (kube-proxy keeps the first).
    The backends are a tuple: when every endpoint is ready, the port's cluster set is it.
    """
    name, proto = port.ref.port_name, port.ref.protocol
    if len(slices) == 1:
        return _resolve_one(slices[0], name, proto, family)
    # Keyed by the address as an int: ipaddress objects hash and compare in Python, ints in C,
    # and this runs once per endpoint.
    seen: dict[tuple[int, int], Endpoint] = {}
    for sl in sorted(slices, key=lambda s: s.name):
        if sl.family is not family:
            continue
        number = next((p.port for p in sl.ports if p.name == name and p.protocol is proto), None)
        if number is None:
            continue
        for ep in sl.endpoints:
            seen.setdefault((int(ep.ip), number), ep)
    keys = sorted(seen)
    eps = [seen[k] for k in keys]
    return tuple([_new(Backend, (ep.ip, k[1])) for k, ep in zip(keys, eps, strict=True)]), eps


def _resolve_one(
    sl: EndpointSlice, name: str, proto: Protocol, family: IPFamily
) -> tuple[Sequence[Backend], Sequence[Endpoint]]:
    """``resolve`` of a single slice (the common case): one port number, so the address alone
    keys an endpoint; the first listing of an address wins, as across slices."""
    if sl.family is not family:
        return (), ()
    for p in sl.ports:  # (a loop, not next() of a generator: one frame less per port)
        if p.name == name and p.protocol is proto:
            number = p.port
            break
    else:
        return (), ()
    if len(sl.endpoints) == 1:  # (many Services have one endpoint: no lists to order it)
        return OnePort(sl.endpoints, number), sl.endpoints
    # ``_ip`` is ``int(ip)`` without a Python-level call (as nft/values.py packs addresses).
    ips = [ep.ip._ip for ep in sl.endpoints]  # type: ignore[union-attr]
    eps: Sequence[Endpoint]
    if all(map(lt, ips, ips[1:])):  # listed in order, each once (as a controller writes them)
        eps = sl.endpoints
    else:
        first = {ep.ip._ip: ep for ep in reversed(sl.endpoints)}  # type: ignore[union-attr]
        eps = tuple([first[ip] for ip in sorted(first)])
    return OnePort(eps, number), eps


def externally_accessible(svc: Service, port: ServicePort) -> bool:
    return bool(port.node_port or svc.external_ips or svc.load_balancer_ips)


def categorize(
    backends: Sequence[Backend],
    eps: Sequence[Endpoint],
    svc: Service,
    port: ServicePort,
    node: str,
    zone: str | None,
) -> Categorized:
    """Split backends (``resolve``'s, with their endpoints) into the cluster and local sets
    (kube-proxy's ``CategorizeEndpoints``).

    Ready endpoints are used; when a set has none, its serving-and-terminating ones are (decided
    separately for the cluster and the local set). Topology hints narrow the cluster set.
    """
    external = externally_accessible(svc, port)
    ext_local = svc.external_policy_local and external
    uses_cluster = not svc.internal_policy_local or external
    uses_local = svc.internal_policy_local or ext_local
    cluster: Sequence[Backend] = ()
    has_any = False
    if uses_cluster:
        cluster = cluster_set(backends, eps, node, zone)
        has_any = bool(cluster)
    local: tuple[Backend, ...] = ()
    fallback = False
    if uses_local:
        has_any = has_any or any(map(_usable, eps))
        mine = [(b, ep) for b, ep in zip(backends, eps, strict=True) if ep.node_name == node]
        local = tuple(b for b, ep in mine if ep.ready)
        if not local:
            local = tuple(b for b, ep in mine if _serving_terminating(ep))
            fallback = bool(local)
    return Categorized(cluster=cluster, local=local, has_any=has_any, local_terminating=fallback)


_ready = attrgetter("ready")


def _usable(ep: Endpoint) -> bool:
    return ep.ready or _serving_terminating(ep)


def _serving_terminating(ep: Endpoint) -> bool:
    return ep.serving and ep.terminating


def whole(backends: Sequence[Backend]) -> Sequence[Backend]:
    """All of ``backends``, as a plan keeps them: a :class:`OnePort` as it is, else a tuple."""
    return backends if isinstance(backends, OnePort) else tuple(backends)


def cluster_set(
    backends: Sequence[Backend], eps: Sequence[Endpoint], node: str, zone: str | None
) -> Sequence[Backend]:
    """The endpoints Cluster policy traffic goes to: the ready ones (narrowed by topology
    hints that apply), else the serving-terminating ones."""
    mode = topology_mode(eps, node, zone)
    pairs = zip(backends, eps, strict=True)
    chosen: Sequence[Backend]
    if mode == "node":
        chosen = tuple(b for b, ep in pairs if ep.ready and node in (ep.hints_nodes or ()))
    elif mode == "zone":
        chosen = tuple(b for b, ep in pairs if ep.ready and zone in (ep.hints_zones or ()))
    elif all(map(_ready, eps)):  # in C: no list of flags when every endpoint is ready
        chosen = whole(backends)
    else:
        chosen = tuple(compress(backends, map(_ready, eps)))
    if chosen:
        return chosen
    # No ready endpoint anywhere (topology is only used when it leaves one): fall back to the
    # serving, terminating ones so connections drain instead of failing.
    return tuple(b for b, ep in zip(backends, eps, strict=True) if _serving_terminating(ep))


def topology_mode(eps: Iterable[Endpoint], node: str, zone: str | None) -> str:
    """``node``, ``zone`` or ``""``: which hints narrow the cluster set.

    Hints count only when every ready endpoint has them, and only when some ready endpoint is
    hinted for this node (zone); otherwise all ready endpoints are used, as upstream.
    """
    all_nodes = all_zones = True
    for_node = for_zone = False
    for ep in eps:
        if not ep.ready:
            continue
        if ep.hints_zones:
            for_zone = for_zone or (zone is not None and zone in ep.hints_zones)
        else:
            all_zones = False
        if ep.hints_nodes:
            for_node = for_node or node in ep.hints_nodes
        else:
            all_nodes = False
        if not (all_nodes or all_zones):  # a ready endpoint without hints: none apply
            return ""
    if all_nodes and for_node:
        return "node"
    if all_zones and for_zone:
        return "zone"
    return ""
