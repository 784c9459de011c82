"""The planner: cluster snapshot + config -> the desired nftables rulesets and a per-port summary.

Sits between cluster state and the reconciler (DESIGN §3). For each family it builds the static
skeleton (``skeleton.py``) and then, per service port, only elements of global maps: dispatch
(``service-ips``, ``service-nodeports``), endpoint choice (``backends*`` keyed by frontend and
index, read by the shared ``dnat … numgen … map`` chains), no-endpoint verdicts, firewall ranges
and hairpin pairs. ClientIP affinity and the round-robin and consistent-hash choices need
per-service chains and maps (``affinity.py``, ``balance.py``). What each service adds is
recorded (``fragments.py``) so the next plan can replay unchanged services, or
``incremental.py`` can update this plan in place for the changed ones. The node's addresses and
the source ranges it matches come from ``addresses.py``. The shape and its
reasoning are in docs/ruleset.md.

Pure: no I/O, no clock, no logging; deterministic (same input, identical plan).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from ipaddress import ip_network
from operator import attrgetter, itemgetter
from typing import Any

import msgspec

from nlproxy.cluster.model import (
    ClusterSnapshot,
    Endpoint,
    EndpointSlice,
    IPAddress,
    IPNetwork,
    LoadBalancing,
    Protocol,
    Service,
    ServiceKey,
    ServicePort,
    ServicePortRef,
)
from nlproxy.nft.ir import DROP, Element, Family, L4Proto, Ruleset, Verdict, goto
from nlproxy.nft.packed import PackedElements, index_bytes, indices
from nlproxy.proxy import naming as n
from nlproxy.proxy.addresses import (
    collapse,
    node_ips_of,
    nodeport_ips_of,
    pod_cidrs_of,
    pod_iifname,
)
from nlproxy.proxy.affinity import add_affinity_chains
from nlproxy.proxy.balance import add_balanced_chains
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.endpoints import (
    Backend,
    Categorized,
    addresses,
    categorize,
    cluster_set,
    externally_accessible,
    packed_data,
    resolve,
    whole,
)
from nlproxy.proxy.fragments import Fill, Fragment, Recorder
from nlproxy.proxy.skeleton import IPV4, IPV6, Dispatch, FamilySpec, pod_match, skeleton
from nlproxy.proxy.slots import keep_slots, read_slots, slot_token
from nlproxy.runtime.hotpath import collection_paused

_new = tuple.__new__
"""``_new(Fill, (…))``: a NamedTuple without its Python ``__new__`` frame (the hot path)."""

_first = itemgetter(0)
_int_of = attrgetter("_ip")
"""An address's int (``int(ip)`` without a Python-level call, as nft/values.py packs it)."""

_NONE: list[Any] = []
"""The ops and pieces of a fragment of a service without an address of its table's family
(many: each single-stack Service's other family). Shared, so never written to:
``FamilyPlanner.finish`` checks that it is still empty."""

_IN_SET = (b"",)
"""The data of one element of a set (no data), in a :class:`Fill`."""
_INDEX0 = index_bytes(0)

_ready = attrgetter("ready")
_L4 = {Protocol.TCP: L4Proto.TCP, Protocol.UDP: L4Proto.UDP, Protocol.SCTP: L4Proto.SCTP}


class FrontendKind(enum.StrEnum):
    CLUSTER_IP = "cluster-ip"
    EXTERNAL_IP = "external-ip"
    LOAD_BALANCER = "load-balancer"
    NODE_PORT = "node-port"


# The per-port summary values are msgspec Structs, as the model's are: a plan builds several per
# service port (10k ports: tens of thousands), a frozen dataclass costs several times a Struct to
# build, and with gc=False (they hold no cycles) the collector never walks them.
_CLUSTER_IP = FrontendKind.CLUSTER_IP
_RANDOM = LoadBalancing.RANDOM
"""(Module constants: an enum member read through its class costs a Python call.)"""


class Frontend(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """An address (None for a node port: any NodePort address) and port a service port answers."""

    family: Family
    protocol: Protocol
    kind: FrontendKind
    address: IPAddress | None
    port: int


class PortPlan(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What the rest of nlproxy needs to know about one service port, all families together.

    Attributes:
        cluster_endpoints: endpoints for Cluster policy traffic (conntrack cleanup, inspector).
        local_endpoints: this node's endpoints for Local policy traffic (ready ones, else the
            serving-terminating ones traffic drains to).
        local_ready: this node's ready endpoints: what the health-check node port counts.
        has_endpoints: usable endpoints exist somewhere (else traffic is rejected).
    """

    ref: ServicePortRef
    frontends: tuple[Frontend, ...]
    cluster_endpoints: Sequence[Backend]
    local_endpoints: Sequence[Backend]
    has_endpoints: bool
    health_check_node_port: int | None = None
    local_ready: Sequence[Backend] = ()


@dataclass(slots=True)
class Plan:
    """The planner's output: one ruleset per family (both always present) and the summary.

    ``fragments`` and ``context`` let the next plan replay unchanged services, and ``live`` (the
    reference counts of shared objects, see ``incremental.py``) lets it be updated in place; they
    are not part of the plan's value.
    """

    rulesets: dict[Family, Ruleset]
    ports: dict[ServicePortRef, PortPlan]
    fragments: dict[Family, dict[ServiceKey, Fragment]] = field(
        default_factory=dict, repr=False, compare=False
    )
    context: object = field(default=None, repr=False, compare=False)
    live: object = field(default=None, repr=False, compare=False)


def plan(
    snapshot: ClusterSnapshot,
    config: ProxyConfig,
    *,
    previous: Plan | None = None,
    slots: Mapping[Family, Ruleset | None] | None = None,
) -> Plan:
    """Plan the ``ip nlproxy`` and ``ip6 nlproxy`` tables for ``snapshot`` on this node.

    Args:
        snapshot: the valid cluster objects (services, their slices, this node, ServiceCIDRs).
        config: node name, ranges and options.
        previous: the last plan. Services whose Service and slice objects are the same objects
            as then are replayed from it rather than planned again (the result is identical;
            only faster). Ignored when the config, node or ServiceCIDRs changed. A changed
            service's endpoints keep their backends slots (``slots.py``).
        slots: what is programmed (a read-back), for the backends slots of the services
            ``previous`` does not have: a restarted process keeps the kernel's slots.

    Returns:
        The rulesets and, per service port, its frontends and chosen endpoints.
    """
    # The collector held (runtime/hotpath.py): planning makes no cycles, and a full collection
    # midway would walk the previous plan too (twice the time at 100k endpoints).
    with collection_paused():
        return _plan(snapshot, config, previous, slots or {})


def plan_context(snapshot: ClusterSnapshot, config: ProxyConfig) -> object:
    """What every service's plan depends on besides its own objects (a change re-plans all)."""
    return (config, snapshot.node, snapshot.service_cidrs, snapshot.local_addresses)


def _plan(
    snapshot: ClusterSnapshot,
    config: ProxyConfig,
    previous: Plan | None,
    slots: Mapping[Family, Ruleset | None],
) -> Plan:
    context = plan_context(snapshot, config)
    reuse = previous is not None and previous.context == context
    # Each port's part, by first family; a port with parts in both families (dual-stack) also
    # has them all, in family order, in ``both`` (most ports have one: no list for them).
    parts: dict[ServicePortRef, PortPart] = {}
    both: dict[ServicePortRef, list[PortPart]] = {}
    rulesets, fragments = {}, {}
    # Sorted and looked up once for both families (the Services sorted with their keys: no
    # look-up of each again).
    all_slices = dict(snapshot.slices)  # (a dict's get is a C call, a mapping proxy's is not)
    inputs = [
        (key, svc, all_slices.get(key, ()))
        for key, svc in sorted(snapshot.services.items(), key=_first)
    ]
    for spec in (IPV4, IPV6):
        fp = FamilyPlanner(spec, snapshot, config)
        fp.programmed = slots.get(spec.family)
        earlier = previous.fragments.get(spec.family, {}) if previous else {}
        old = earlier if reuse else {}
        new: dict[ServiceKey, Fragment] = {}
        for key, svc, slices in inputs:
            frag = old.get(key) if old else None
            if frag is not None and frag.reusable_for(svc, slices):
                fp.replay(frag)
            else:
                if earlier:  # (else it stays the empty one FamilyPlanner starts with)
                    fp.prior = prior_slots(earlier.get(key))
                frag = fp.add_service(svc, slices)
            for piece in frag.pieces:
                assert isinstance(piece, PortPart), "fragments hold port parts"
                first = parts.setdefault(piece.ref, piece)
                if first is not piece:
                    both.setdefault(piece.ref, [first]).append(piece)
            new[key] = frag
        fp.finish()
        rulesets[spec.family], fragments[spec.family] = fp.rs, new
    ports = {
        ref: merge_parts(ref, both[ref]) if both and ref in both else _one_part(ref, p)
        for ref, p in parts.items()
    }
    return Plan(rulesets=rulesets, ports=ports, fragments=fragments, context=context)


class PortPart(msgspec.Struct, kw_only=True, gc=False):
    """One family's share of a service port's summary (kept in its service's fragment)."""

    ref: ServicePortRef
    frontends: tuple[Frontend, ...]
    """(A tuple: the port's summary holds the same one.)"""
    cat: Categorized
    hc: int | None


def hairpin_of(frag: Fragment) -> Iterator[IPAddress]:
    """The endpoint addresses a fragment lists for the hairpin set, as its port parts hold
    them: each one's cluster set, then its local set (an address once per listing)."""
    for piece in frag.pieces:
        assert isinstance(piece, PortPart), "fragments hold port parts"
        cat = piece.cat
        yield from addresses(cat.cluster)
        yield from addresses(cat.local)


def prior_slots(frag: Fragment | None) -> dict[tuple[str, bytes], tuple[bytes, ...]]:
    """The backends slots ``frag`` filled: (map, frontend's key head) → packed endpoints."""
    if frag is None:
        return {}
    return {(op.set, op.keys[0][:-4]): op.data for op in frag.ops if type(op) is Fill}


def plan_slot_token(p: Plan) -> str:
    """:func:`~nlproxy.proxy.slots.slot_token` of ``p``: "" when every frontend's backends
    are in sorted order (as a cold plan of the same snapshot fills them)."""
    shuffled = {}
    for family, frags in p.fragments.items():
        for frag in frags.values():
            if not frag.shuffled:
                continue
            for op in frag.ops:
                if type(op) is Fill and op.shuffled:
                    head = op.keys[0][:-4]
                    shuffled[(str(family), op.set, head)] = op.data
    return slot_token(shuffled)


def merge_parts(ref: ServicePortRef, parts: list[PortPart]) -> PortPlan:
    """The summary of one service port from its parts, ``ip`` family first."""
    if len(parts) == 1:  # a single-stack Service: nothing to merge
        return _one_part(ref, parts[0])
    return PortPlan(
        ref=ref,
        frontends=tuple(f for p in parts for f in p.frontends),
        cluster_endpoints=tuple(b for p in parts for b in p.cat.cluster),
        local_endpoints=tuple(b for p in parts for b in p.cat.local),
        has_endpoints=any(p.cat.has_any for p in parts),
        health_check_node_port=parts[0].hc,
        local_ready=tuple(b for p in parts if not p.cat.local_terminating for b in p.cat.local),
    )


def _one_part(ref: ServicePortRef, p: PortPart) -> PortPlan:
    """The summary of a service port with one part (a single-stack Service's)."""
    cat = p.cat
    return PortPlan(
        ref=ref,
        frontends=tuple(p.frontends),
        cluster_endpoints=cat.cluster,
        local_endpoints=cat.local,
        has_endpoints=cat.has_any,
        health_check_node_port=p.hc,
        local_ready=() if cat.local_terminating else cat.local,
    )


class FamilyPlanner:
    """Plans one family's table; ``add_service`` is called once per service, in key order."""

    plain = True
    """Plan the common ports the short way (``_plain_port``); False: every port through
    ``_port`` (what the short way is compared with)."""

    def __init__(self, f: FamilySpec, snapshot: ClusterSnapshot, config: ProxyConfig) -> None:
        self.f = f
        node = snapshot.node
        self.node_name = config.node_name
        self.zone = node.zone if node else None
        self.node_ips = tuple(node_ips_of(f, snapshot, config))
        svc_cidrs = [*config.service_cidrs, *(c for sc in snapshot.service_cidrs for c in sc.cidrs)]
        pods = pod_cidrs_of(f, snapshot, config)
        services = collapse(svc_cidrs, f.version)
        nodeport_ips = nodeport_ips_of(f, snapshot, config)
        self.rs = skeleton(
            f,
            mark=config.masquerade_mark,
            nodeport_match_all=nodeport_ips is None,
            service_cidrs=bool(services),
            counters=config.service_counters,
            masquerade_all=config.masquerade_all,
        )
        self.counters = config.service_counters
        self.lb = config.load_balancing
        self.hash_seed = config.hash_seed
        self.sink = Recorder(self.rs)
        cluster_ips = self.rs.elements[n.CLUSTER_IPS]
        assert isinstance(cluster_ips, PackedElements), "the cluster-ips set is held packed"
        self._cluster_ips = cluster_ips
        """(The skeleton's set: emptied, never replaced, when a planner is reused.)"""
        self.pods = pod_match(f, cidrs=bool(pods), iifname=pod_iifname(config))
        self.dispatch = Dispatch(self.sink, f, pods=self.pods, masquerade_all=config.masquerade_all)
        self.prior: dict[tuple[str, bytes], tuple[bytes, ...]] = {}
        """The service being planned's backends slots as they were (``slots.py``)."""
        self.programmed: Ruleset | None = None
        """What the kernel holds: slots of frontends ``prior`` does not have are kept too."""
        self._frag: Fragment | None = None
        self._gotos: dict[str, Verdict] = {}
        # The endpoints of each port part planned or replayed (its cluster and local sets, as
        # :func:`hairpin_of` lists them), their addresses joined once in finish().
        self.hairpin: list[Sequence[Backend]] = []
        for net in pods:
            self.element(n.CLUSTER_CIDRS, (net,))
        for net in services:
            self.element(n.SERVICE_CIDRS, (net,))
        for ip in nodeport_ips or ():
            self.element(n.NODEPORT_IPS, (ip,))

    def finish(self) -> None:
        """Add what is collected across services: the hairpin pairs (endpoint . endpoint)."""
        assert not _NONE, "the shared empty fragment lists were written to"
        hairpin = self.rs.elements[n.HAIRPIN]
        assert isinstance(hairpin, PackedElements), "the hairpin set is held packed"
        # Each address once, first listing first (deterministic), packed from its int: deduplicated
        # as the packed pair (ipaddress objects hash in Python; one dict, not one of ints too).
        ints = map(_int_of, itertools.chain.from_iterable(map(addresses, self.hairpin)))
        hairpin.own().update(dict.fromkeys(hairpin.pack_pairs(ints), b""))

    def element(
        self,
        set_name: str,
        key: tuple[IPAddress | IPNetwork | int, ...],
        value: tuple[IPAddress | int, ...] | Verdict | None = None,
        comment: str = "",
    ) -> None:
        self.sink.add_element(Element(set=set_name, key=key, value=value, comment=comment))

    def add_service(self, svc: Service, slices: Sequence[EndpointSlice]) -> Fragment:
        """Plan one service; returns what it added (empty when it has no address here)."""
        version = self.f.version
        for cip in svc.cluster_ips:  # the first of this family (a loop: no generator frame)
            if cip.version == version:
                break
        else:
            # Nothing to log: no ops, no pieces (the other family of every single-stack
            # Service: its lists are the shared empty ones, nothing is written).
            return Fragment(service=svc, slices=slices, ops=_NONE, pieces=_NONE)
        frag = Fragment(service=svc, slices=slices, ops=[], pieces=[])
        self.sink.ops = frag.ops
        self._frag = frag
        # (Most services have neither: no list comprehension frame then.)
        ext = [ip for ip in svc.external_ips if ip.version == version] if svc.external_ips else []
        lbs = (
            [ip for ip in svc.load_balancer_ips if ip.version == version]
            if svc.load_balancer_ips
            else []
        )
        # A port of a ClusterIP-only, random-choice, Cluster-policy Service (most ports) takes
        # the short way: the same operations as _port's, without what it does not use. Only
        # with no external or LoadBalancer address in any family: one of the other family's
        # makes the Service externally reachable, so its Local policy applies here too.
        plain = (
            self.plain
            and not self.counters
            and not svc.external_ips
            and not svc.load_balancer_ips
            and svc.affinity_timeout is None
            and not svc.internal_policy_local
            and (svc.load_balancing or self.lb) is _RANDOM
        )
        for sp in svc.ports:
            backends, eps = resolve(sp, slices, self.f.ip_family)
            if plain and not sp.node_port:
                frag.pieces.append(self._plain_port(svc, sp, cip, backends, eps))
                continue
            cat = categorize(backends, eps, svc, sp, self.node_name, self.zone)
            fronts = self._port(svc, sp, cip, ext, lbs, cat)
            hc = svc.health_check_node_port if svc.external_policy_local else None
            frag.pieces.append(PortPart(ref=sp.ref, frontends=tuple(fronts), cat=cat, hc=hc))
        return frag

    def replay(self, frag: Fragment) -> None:
        """Re-apply an unchanged service's fragment from the previous plan."""
        self.sink.ops = []
        self.sink.replay(frag.ops)
        hairpin = self.hairpin
        for piece in frag.pieces:
            assert isinstance(piece, PortPart), "fragments hold port parts"
            cat = piece.cat
            hairpin.append(cat.cluster)
            if cat.local:
                hairpin.append(cat.local)

    # One piece (68 lines): a port's frontends in the order the kernel's maps are filled, each
    # with the same verdicts and policy flags; it runs per port of a full plan (the hot loop).
    def _port(
        self,
        svc: Service,
        sp: ServicePort,
        cip: IPAddress,
        ext: list[IPAddress],
        lbs: list[IPAddress],
        cat: Categorized,
    ) -> list[Frontend]:
        ref, port, proto = sp.ref, sp.port, _L4[sp.ref.protocol]
        comment = str(ref)
        external = externally_accessible(svc, sp)
        ext_local = svc.external_policy_local and external
        has_int = bool(cat.local) if svc.internal_policy_local else cat.has_any
        has_ext = bool(cat.local) if ext_local else cat.has_any
        # No endpoints at all: reject. Endpoints, but none for this policy: drop.
        no_ep: Verdict = self.goto(n.REJECT_CHAIN) if not cat.has_any else DROP
        fixed = None
        if svc.affinity_timeout is not None:  # affinity wins over the algorithm, as upstream's
            fixed = add_affinity_chains(self, svc, sp, cip, cat)
        elif (lb := svc.load_balancing or self.lb) is not LoadBalancing.RANDOM:
            fixed = add_balanced_chains(
                self.sink, self.f, svc, sp, cat, lb, pods=self.pods, seed=self.hash_seed
            )
        targets = _Targets(self, svc, sp, cat, fixed)
        fronts = [
            Frontend(
                family=self.f.family,
                protocol=ref.protocol,
                kind=FrontendKind.CLUSTER_IP,
                address=cip,
                port=port,
            )
        ]
        self._cluster_ip(cip)
        if has_int:
            verdict = self.goto(targets.internal(cip))
            self.sink.add_element(  # (every port has one: not through self.element)
                Element(set=n.SERVICE_IPS, key=(cip, proto, port), value=verdict, comment=comment)
            )
        else:
            self.element(n.NO_ENDPOINT_SERVICES, (cip, proto, port), no_ep, comment)
        addrs = [(FrontendKind.EXTERNAL_IP, a) for a in ext] if ext else []
        if lbs:
            addrs += [(FrontendKind.LOAD_BALANCER, a) for a in lbs]
        for kind, addr in addrs:
            fronts.append(self._front(sp, kind, addr, port))
            if cat.has_any:
                self.element(
                    n.SERVICE_IPS, (addr, proto, port), self.goto(targets.external(addr)), comment
                )
            if not has_ext:
                self.element(n.NO_ENDPOINT_SERVICES, (addr, proto, port), no_ep, comment)
        if lbs and svc.load_balancer_source_ranges:
            self._firewall(svc, lbs, proto, port, comment)
        if sp.node_port:
            fronts.append(self._front(sp, FrontendKind.NODE_PORT, None, sp.node_port))
            if cat.has_any:
                verdict = self.goto(targets.nodeport(sp.node_port))
                self.element(n.SERVICE_NODEPORTS, (proto, sp.node_port), verdict, comment)
            if not has_ext:
                self.element(n.NO_ENDPOINT_NODEPORTS, (proto, sp.node_port), no_ep, comment)
        if self.counters:
            self._counters(fronts, proto)
        self.hairpin.append(cat.cluster)
        if cat.local:
            self.hairpin.append(cat.local)
        return fronts

    def _plain_port(
        self,
        svc: Service,
        sp: ServicePort,
        cip: IPAddress,
        backends: Sequence[Backend],
        eps: Sequence[Endpoint],
    ) -> PortPart:
        """``categorize`` and ``_port`` of a port that has only its ClusterIP as frontend (of a
        Service with no external or LoadBalancer address in either family), random choice and
        the Cluster policy for it: the same operations in the same order
        (tests/unit/test_planner_plain.py plans both ways and compares)."""
        ref, port = sp.ref, sp.port
        key = (cip, _L4[ref.protocol], port)
        # str(ref) without its frames (a StrEnum formats as its value, in C)
        comment = f"{ref.namespace}/{ref.name}:{ref.port_name}/{ref.protocol}"
        # categorize: the cluster set only (no policy here uses the local one). All ready and
        # the first unhinted: no hints apply, so cluster_set would give them all.
        if (
            eps
            and (e0 := eps[0]).ready
            and not (e0.hints_zones or e0.hints_nodes)
            and all(map(_ready, eps))
        ):
            cluster = whole(backends)
        else:
            cluster = cluster_set(backends, eps, self.node_name, self.zone)
        cat = Categorized(cluster=cluster, local=(), has_any=bool(cluster))
        # _cluster_ip, inline
        cips = self._cluster_ips
        packed_ip = cips.pack_key((cip,))
        cips.own()[packed_ip] = b""
        self.sink.ops.append(_new(Fill, (n.CLUSTER_IPS, (packed_ip,), _IN_SET, False)))
        if cluster:
            self.fill(n.BACKENDS, key, cluster)
            verdict = self.goto(self.dispatch.cluster_ip(len(cluster)))
            el = Element(set=n.SERVICE_IPS, key=key, value=verdict, comment=comment)
        else:  # no endpoints at all: reject
            verdict = self.goto(n.REJECT_CHAIN)
            el = Element(set=n.NO_ENDPOINT_SERVICES, key=key, value=verdict, comment=comment)
        self.sink.add_element(el)
        self.hairpin.append(cluster)
        front = Frontend(
            family=self.f.family,
            protocol=ref.protocol,
            kind=_CLUSTER_IP,
            address=cip,
            port=port,
        )
        hc = svc.health_check_node_port if svc.external_policy_local else None
        return PortPart(ref=ref, frontends=(front,), cat=cat, hc=hc)

    def goto(self, chain: str) -> Verdict:
        """``goto chain``: one (frozen) verdict per chain, shared by the ports that use it."""
        verdict = self._gotos.get(chain)
        if verdict is None:
            verdict = self._gotos[chain] = goto(chain)
        return verdict

    def _cluster_ip(self, cip: IPAddress) -> None:
        """``cip`` in ``cluster-ips``, written as the kernel's bytes (the set is packed)."""
        store = self._cluster_ips
        key = store.pack_key((cip,))
        store.own()[key] = b""
        self.sink.ops.append(_new(Fill, (n.CLUSTER_IPS, (key,), _IN_SET, False)))

    def _counters(self, fronts: list[Frontend], proto: int) -> None:
        """One counting element per frontend, keyed like its dispatch element. It depends on
        the Service alone, never on endpoints: endpoint churn leaves its counter alone."""
        for fe in fronts:
            if fe.address is None:
                self.element(n.NODEPORT_COUNTERS, (proto, fe.port))
            else:
                self.element(n.SERVICE_COUNTERS, (fe.address, proto, fe.port))

    def _front(
        self, sp: ServicePort, kind: FrontendKind, addr: IPAddress | None, port: int
    ) -> Frontend:
        return Frontend(
            family=self.f.family, protocol=sp.ref.protocol, kind=kind, address=addr, port=port
        )

    def _firewall(
        self, svc: Service, lbs: list[IPAddress], proto: int, port: int, comment: str
    ) -> None:
        # Ranges of the other family are ignored; none left means no firewall (as upstream).
        ranges = collapse(svc.load_balancer_source_ranges, self.f.version)
        if not ranges:
            return
        # A VIP-like LB address is often local: the node reaching it uses the VIP as its source,
        # so when the node itself is allowed, the LB addresses are too (as upstream).
        if any(ip in r for r in ranges for ip in self.node_ips):
            ranges = collapse([*ranges, *(ip_network(lb) for lb in lbs)], self.f.version)
        for lb in lbs:
            self.element(n.FIREWALL_IPS, (lb, proto, port), comment=comment)
            # An interval set holds a range in every key part: the address as a /32 (/128) is
            # what the kernel hands back, so read-back compares equal.
            host = ip_network(lb)
            for net in ranges:
                self.element(n.FIREWALL_ALLOW, (host, proto, port, net), comment=comment)

    def fill(
        self, set_name: str, prefix: tuple[IPAddress | int, ...], eps: Sequence[Backend]
    ) -> None:
        """Index ``eps`` 0..N-1 under ``prefix`` in a backends map (what ``numgen mod N`` picks).

        Written as the kernel's bytes (the map is a :class:`PackedElements`): the key is the
        frontend's packed parts and the packed index, the data the packed address and port.
        """
        if not eps:
            return
        store = self.rs.elements[set_name]
        assert isinstance(store, PackedElements), "the backends maps are held packed"
        head = store.pack_head(prefix)  # the key less the index
        if len(eps) == 1:  # (no list and index slice for the one endpoint)
            keys: tuple[bytes, ...] = (head + _INDEX0,)
        else:
            keys = tuple([head + i for i in indices(len(eps))])
        data = packed_data(store, eps)
        shuffled = False
        if self.prior or self.programmed is not None:  # (a cold plan has neither)
            data, shuffled = self._slotted(set_name, head, store, data)
        # (keys and data are as long as eps: no strict zip, its check costs 3 ms per 10k fills)
        store.own().update(zip(keys, data, strict=False))
        self.sink.ops.append(_new(Fill, (set_name, keys, data, shuffled)))

    def _slotted(
        self, set_name: str, head: bytes, store: PackedElements, data: tuple[bytes, ...]
    ) -> tuple[tuple[bytes, ...], bool]:
        """``data`` in the slots the frontend's endpoints held (``slots.py``), and whether
        that is not their sorted order (then the service's fragment is marked shuffled)."""
        prior = self.prior.get((set_name, head)) if self.prior else None
        if prior is None and self.programmed is not None:
            prior = read_slots(self.programmed.elements.get(set_name), head, store)
        if not prior or prior == data or (slots := keep_slots(prior, data)) == data:
            return data, False
        if self._frag is not None:
            self._frag.shuffled = True
        return slots, True


class _Targets:
    """The chains a service port's dispatch elements go to; fills the backends maps on the way.

    Without affinity these are shared chains (role + endpoint count) and the service's endpoints
    go into ``backends*`` elements keyed by the frontend; with affinity they are the service
    port's own chains (``fixed``: internal chain, external chain or None).
    """

    __slots__ = ("_cat", "_fixed", "_fp", "_internal_eps", "_local_ext", "_port", "_proto")

    def __init__(
        self,
        fp: FamilyPlanner,
        svc: Service,
        sp: ServicePort,
        cat: Categorized,
        fixed: tuple[str, str | None] | None,
    ) -> None:
        self._fp, self._cat, self._fixed = fp, cat, fixed
        self._local_ext = svc.external_policy_local
        self._internal_eps = cat.local if svc.internal_policy_local else cat.cluster
        self._proto: int = _L4[sp.ref.protocol]
        self._port = sp.port

    def internal(self, cip: IPAddress) -> str:
        if self._fixed is not None:
            return self._fixed[0]
        fp = self._fp
        fp.fill(n.BACKENDS, (cip, self._proto, self._port), self._internal_eps)
        return fp.dispatch.cluster_ip(len(self._internal_eps))

    def external(self, addr: IPAddress) -> str:
        if self._fixed is not None:
            assert self._fixed[1] is not None, "external chain planned for an external frontend"
            return self._fixed[1]
        fp, key = self._fp, (addr, self._proto, self._port)
        fp.fill(n.BACKENDS, key, self._cat.cluster)
        if not self._local_ext:
            return fp.dispatch.external(len(self._cat.cluster))
        fp.fill(n.BACKENDS_LOCAL, key, self._cat.local)
        fp.element(n.EXTERNAL_SHORTCUTS, key, goto(fp.dispatch.dnat(len(self._cat.cluster))))
        return fp.dispatch.external_local(len(self._cat.local))

    def nodeport(self, node_port: int) -> str:
        if self._fixed is not None:
            assert self._fixed[1] is not None, "external chain planned for a node port"
            return self._fixed[1]
        fp, key = self._fp, (self._proto, node_port)
        fp.fill(n.NODEPORT_BACKENDS, key, self._cat.cluster)
        if not self._local_ext:
            return fp.dispatch.nodeport(len(self._cat.cluster))
        fp.fill(n.NODEPORT_BACKENDS_LOCAL, key, self._cat.local)
        fp.element(
            n.NODEPORT_SHORTCUTS, key, goto(fp.dispatch.nodeport_dnat(len(self._cat.cluster)))
        )
        return fp.dispatch.nodeport_local(len(self._cat.local))
