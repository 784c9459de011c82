"""ClientIP session affinity: per-port state the packet path keeps, a few objects per port.

Sits inside the planner. Affinity remembers which endpoint served each client (with a
timeout), so the choice depends on state and cannot be folded into the shared
``numgen … map @backends`` chains.

Every port costs a few objects whatever its endpoints and frontends: a dynamic map
``clients-…`` (client -> endpoint address . port, the Service's timeout) and, for a Local
policy, ``localclients-…`` (the clients of this node's endpoints) with the set ``localeps-…``
of those endpoints. In IPv6 each is two maps, the address in ``clients-…`` and the port in
``clientports-…`` (``localclientports-…``): nft 1.0.6 aborts on an update whose data is
``ip6 daddr . th dport``, so a saved ruleset holding one could not be loaded back. The chains
``service-…`` (Cluster policy) and ``local-…`` (Local policy) DNAT a known client through its
map and send a new one to ``new-…`` (``newlocal-…``), which jumps to the shared ``dnat-N``
chains over the backends maps, filled for each frontend as random choice fills them (an
endpoint count changes those jumps and nothing else of the port: see :meth:`_MapPort.new_client`);
``external-…`` is external traffic's (masquerade, or the Local policy's short-circuits), as
upstream's.

After DNAT the static ``affinity-…`` chains (``skeleton.py``) find the connection's port by its
original address, protocol and port in ``affinity-addresses``, or for a node port by the port
and the endpoint's address in ``affinity-nodeports``, and go to the port's ``learn-…`` chain,
which records (or refreshes) ``client -> endpoint``, and into the local map too when the
endpoint is this node's. The packet path cannot delete an element: when an endpoint goes, the
sync deletes the clients held for it (:func:`client_maps`, ``nft/dynmap.py``). An endpoint
change is element operations and the jumps of ``new-…``. Pure: no I/O, clock, logging.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from typing import NamedTuple, Protocol

from nlproxy.cluster.model import IPAddress, Service, ServiceKey, ServicePort, ServicePortRef
from nlproxy.nft.ir import (
    Chain,
    Cmp,
    DataType,
    DnatMap,
    Element,
    Expr,
    Family,
    Field,
    L4Proto,
    Lookup,
    Map,
    Rule,
    Ruleset,
    Set,
    SetFlag,
    SetUpdate,
    goto,
    jump,
)
from nlproxy.nft.packed import PackedElements
from nlproxy.proxy import naming as n
from nlproxy.proxy.endpoints import Backend, Categorized, externally_accessible
from nlproxy.proxy.fragments import Fill, Recorder
from nlproxy.proxy.skeleton import FIB_SADDR_LOCAL, Dispatch, FamilySpec, PodMatch


class Planning(Protocol):
    """What the affinity chains need of the family's planner (``planner.FamilyPlanner``)."""

    sink: Recorder
    f: FamilySpec
    dispatch: Dispatch
    pods: PodMatch | None
    rs: Ruleset

    def fill(
        self, set_name: str, prefix: tuple[IPAddress | int, ...], eps: Sequence[Backend]
    ) -> None: ...


def add_affinity_chains(
    fp: Planning, svc: Service, sp: ServicePort, cip: IPAddress, cat: Categorized
) -> tuple[str, str | None]:
    """Add the affinity chains, sets and maps of one service port.

    Returns:
        The chain for ClusterIP traffic and the one for external traffic (None when the port
        takes none). Only chains with something to do are created.
    """
    return _map_port(fp, svc, sp, cip, cat)


def _chain(sink: Recorder, name: str, ref: ServicePortRef, rules: list[tuple[Expr, ...]]) -> None:
    sink.add_chain(Chain(name=n.check_name("chain", name), comment=str(ref)))
    for exprs in rules:
        sink.add_rule(Rule(chain=name, exprs=exprs))


class _Clients(NamedTuple):
    """A clients map, and in IPv6 the map of its clients' ports."""

    map: str
    ports: str | None


def _dynamic(name: str, f: FamilySpec, data: tuple[DataType, ...], svc: Service, c: str) -> Map:
    return Map(
        name=n.check_name("map", name),
        key=(f.addr,),
        data=data,
        flags=SetFlag.TIMEOUT | SetFlag.EVAL,
        timeout=svc.affinity_timeout,
        comment=c,
    )


def _clients_map(
    sink: Recorder, f: FamilySpec, names: tuple[str, str], svc: Service, comment: str
) -> _Clients:
    if f.family is Family.IP:
        sink.add_set(_dynamic(names[0], f, (f.addr, DataType.INET_SERVICE), svc, comment))
        return _Clients(names[0], None)
    sink.add_set(_dynamic(names[0], f, (f.addr,), svc, comment))
    sink.add_set(_dynamic(names[1], f, (DataType.INET_SERVICE,), svc, comment))
    return _Clients(*names)


class _MapPort:
    """One map-layout port's objects: the clients maps, its learning chain and the chains that
    choose (a known client: its endpoint; a new one: the shared ``numgen random`` chains over
    the backends maps, filled for each of its frontends as random choice fills them)."""

    def __init__(self, fp: Planning, svc: Service, sp: ServicePort, cip: IPAddress) -> None:
        self.fp, self.sink, self.f, self.svc, self.sp, self.cip = fp, fp.sink, fp.f, svc, sp, cip
        self.ref = sp.ref
        self.comment = str(sp.ref)
        self.proto = L4Proto[sp.ref.protocol.value]
        # nft -f takes a DNAT to an address and port only after a protocol match.
        self.is_proto = Cmp(Field.META_L4PROTO, self.proto)

    def chain(self, name: str, rules: list[tuple[Expr, ...]]) -> str:
        _chain(self.sink, name, self.ref, rules)
        return name

    def choose(
        self,
        clients: _Clients,
        eps: Sequence[Backend],
        addresses: Sequence[tuple[str, IPAddress]],
        by_node_port: bool,
        local: bool,
    ) -> list[tuple[Expr, ...]]:
        """A known client to its endpoint (``clients``), a new one on to the port's chain
        that chooses one of ``eps`` (:meth:`new_client`)."""
        known = DnatMap((self.f.saddr,), clients.map, clients.ports)
        rules: list[tuple[Expr, ...]] = [(self.is_proto, known)]
        new = self.new_client(eps, addresses, by_node_port, local)
        if new is not None:
            rules.append((goto(new),))
        return rules

    def new_client(
        self,
        eps: Sequence[Backend],
        addresses: Sequence[tuple[str, IPAddress]],
        by_node_port: bool,
        local: bool,
    ) -> str | None:
        """The port's chain that sends a new client to one of ``eps``: by the packet's address
        and port where it came to one of ``addresses`` (each with the backends map it is
        indexed in), else by its node port, each through the shared ``…dnat…-N`` chain of that
        map. A lookup that misses returns there, on to the next rule. None: nothing to choose.

        A chain of jumps alone, the one per-port chain an endpoint count changes: the kernel
        walks every element of a map each time it adds a rule that looks the map up
        (``nf_tables_bind_set``), and the backends maps hold every frontend's endpoints, a
        clients map every client it learned. The rules that look them up stay put: the
        shared chain of a count is made once for all the ports with that count.
        """
        d, proto, port, count = self.fp.dispatch, self.proto, self.sp.port, len(eps)
        jumps: list[tuple[Expr, ...]] = []
        for backends in dict.fromkeys(m for m, _ in addresses):
            for m, addr in addresses:
                if m == backends:
                    self.fp.fill(backends, (addr, proto, port), eps)
            local_map = backends == n.BACKENDS_LOCAL
            jumps.append((jump(d.dnat_local(count) if local_map else d.dnat(count)),))
        if by_node_port and self.sp.node_port:
            backends = n.NODEPORT_BACKENDS_LOCAL if local else n.NODEPORT_BACKENDS
            self.fp.fill(backends, (proto, self.sp.node_port), eps)
            shared = d.nodeport_dnat_local(count) if local else d.nodeport_dnat(count)
            jumps.append((jump(shared),))
        if not jumps:
            return None
        return self.chain(n.check_name("chain", n.affinity_new_chain(self.ref, local)), jumps)

    def learn(self, clients: _Clients, local: _Clients | None, local_eps: Sequence[Backend]) -> str:
        """The port's learning chain: ``client -> endpoint`` into ``clients``, and into
        ``local`` too when the endpoint is one of this node's (its own chain: nft lists a port
        match and an update with ``th dport`` in one rule so that it cannot load it back)."""
        f, sink = self.f, self.sink
        name = n.check_name("chain", n.affinity_learn_chain(self.ref))
        endpoint = (f.daddr, Field.TH_DPORT)
        rules = self._updates(clients, ())
        if local is not None:
            mine = n.check_name("set", n.affinity_local_endpoints(self.ref))
            sink.add_set(Set(name=mine, key=(f.addr, DataType.INET_SERVICE), comment=self.comment))
            for b in local_eps:
                sink.add_element(Element(set=mine, key=(b.ip, b.port)))
            rules += self._updates(local, (Lookup(endpoint, mine),))
        return self.chain(name, rules)

    def _updates(self, clients: _Clients, when: tuple[Expr, ...]) -> list[tuple[Expr, ...]]:
        saddr, daddr = (self.f.saddr,), self.f.daddr
        if clients.ports is None:
            return [(*when, SetUpdate(clients.map, saddr, None, (daddr, Field.TH_DPORT)))]
        return [
            (*when, SetUpdate(clients.map, saddr, None, (daddr,))),
            (*when, SetUpdate(clients.ports, saddr, None, (Field.TH_DPORT,))),
        ]


# One piece (81 lines): its chains hang on each other (the external chain goes to the cluster
# and local chains, every one learns through the same learning chain) and all read the same
# policy flags; split, each part would take all of them.
def _map_port(
    fp: Planning, svc: Service, sp: ServicePort, cip: IPAddress, cat: Categorized
) -> tuple[str, str | None]:
    """Add a map-layout port's objects; returns its internal and external chains, as
    :func:`add_affinity_chains`."""
    p = _MapPort(fp, svc, sp, cip)
    sink, f, pods, ref = fp.sink, fp.f, fp.pods, sp.ref
    external = cat.has_any and externally_accessible(svc, sp)
    ext_local = external and svc.external_policy_local
    int_local = svc.internal_policy_local
    addrs: tuple[IPAddress, ...] = ()
    if external:
        version = f.version
        addrs = tuple(
            ip for ip in (*svc.external_ips, *svc.load_balancer_ips) if ip.version == version
        )
    names = n.affinity_clients_map(ref), n.affinity_client_ports_map(ref)
    clients = _clients_map(sink, f, names, svc, p.comment)
    local_clients = None
    if int_local or ext_local:
        names = n.affinity_local_clients_map(ref), n.affinity_local_client_ports_map(ref)
        local_clients = _clients_map(sink, f, names, svc, p.comment)
    learn = goto(p.learn(clients, local_clients, cat.local))
    # What finds the learning chain after DNAT: the frontend (address . protocol . port), or
    # for a node port the port and the endpoint's address (the node's addresses are many; the
    # endpoint tells this port's connections from another frontend's with the same port).
    proto, port = p.proto, sp.port
    for addr in (cip, *addrs):
        key = (addr, proto, port)
        sink.add_element(Element(set=n.AFFINITY_ADDRESSES, key=key, value=learn, comment=p.comment))
    if external and sp.node_port:
        np_key = (proto, sp.node_port)
        sink.add_element(
            Element(set=n.AFFINITY_NODEPORTS, key=np_key, value=learn, comment=p.comment)
        )
        # Its endpoints' addresses, as the kernel's bytes (one per endpoint: held packed).
        store = fp.rs.elements[n.AFFINITY_ENDPOINTS]
        assert isinstance(store, PackedElements), "affinity-endpoints is held packed"
        ips = dict.fromkeys(b.ip for b in (*cat.cluster, *cat.local))
        keys = tuple(store.pack_keys([(proto, sp.node_port, ip) for ip in ips]))
        store.own().update(dict.fromkeys(keys, b""))
        sink.ops.append(Fill(n.AFFINITY_ENDPOINTS, keys, (b"",) * len(keys)))
    masq: list[tuple[Expr, ...]] = []
    if pods is not None:
        # Off-cluster sources reaching the ClusterIP may be routed back off-node: masquerade.
        masq.append((Cmp(f.daddr, cip), pods.not_pod, jump(n.MARK_FOR_MASQUERADE)))
    # Cluster policy: ClusterIP traffic (internal Cluster policy), external traffic (external
    # Cluster policy), and the short-circuits of external Local (pods and the node itself).
    # (The ClusterIP's choice is in ``backends`` whatever its policy, as random choice's.)
    cluster_chain = None
    if cat.cluster and (not int_local or external):
        by_addr = [(n.BACKENDS, a) for a in (addrs if int_local else (cip, *addrs))]
        rules = [] if int_local else list(masq)
        rules += p.choose(clients, cat.cluster, by_addr, external, local=False)
        cluster_chain = p.chain(n.affinity_service_chain(ref), rules)
    local_chain = None
    if cat.local and local_clients is not None:
        # External addresses first: those of a Service whose ClusterIP takes the Local policy
        # and its external traffic the Cluster one are in ``backends`` too (not used here).
        by_addr = [(n.BACKENDS_LOCAL, a) for a in (addrs if ext_local else ())]
        by_addr += [(n.BACKENDS, cip)] if int_local else []
        rules = list(masq) if int_local else []
        rules += p.choose(local_clients, cat.local, by_addr, ext_local, local=True)
        local_chain = p.chain(n.affinity_local_chain(ref), rules)
    internal = local_chain if int_local else cluster_chain
    if not external:
        return internal or n.affinity_service_chain(ref), None
    ext_rules: list[tuple[Expr, ...]] = []
    if not ext_local:
        if cluster_chain is not None:
            ext_rules += [(jump(n.MARK_FOR_MASQUERADE),), (goto(cluster_chain),)]
    else:
        if cluster_chain is not None:
            if pods is not None:
                ext_rules.append((pods.is_pod, goto(cluster_chain)))
            ext_rules.append((FIB_SADDR_LOCAL, jump(n.MARK_FOR_MASQUERADE)))
            ext_rules.append((FIB_SADDR_LOCAL, goto(cluster_chain)))
        if local_chain is not None:
            ext_rules.append((goto(local_chain),))
    ext = p.chain(n.affinity_external_chain(ref), ext_rules)
    return internal or n.affinity_service_chain(ref), ext


Learned = tuple[Map, tuple[Backend, ...]] | tuple[Map, tuple[Backend, ...], Map]
"""A clients map and the endpoints its clients may keep; in IPv6 with its ports map
(``nft/dynmap.py``'s ``Learned``)."""


class PortEndpoints(Protocol):
    """A port's plan as the sync has it (``planner.PortPlan``)."""

    @property
    def ref(self) -> ServicePortRef: ...
    @property
    def cluster_endpoints(self) -> Sequence[Backend]: ...
    @property
    def local_endpoints(self) -> Sequence[Backend]: ...


def client_maps(
    rs: Ruleset, ports: Iterable[PortEndpoints], services: AbstractSet[ServiceKey] | None = None
) -> list[Learned]:
    """Each clients map of ``rs`` of ``services`` (None: every one) with the endpoints its
    clients may keep: its port's (this node's, for a map of local clients), and in IPv6 its
    ports map. What the sync hands ``nft/dynmap.py`` after a commit that changed those
    services, to forget the clients of endpoints that went."""
    by_ref = {str(p.ref): p for p in ports}
    roles = {f"{n.AFFINITY_CLIENTS}-": False, f"{n.AFFINITY_LOCAL_CLIENTS}-": True}
    version = 4 if rs.table.family is Family.IP else 6  # (a port's plan has both families)
    out: list[Learned] = []
    for name, s in rs.sets.items():
        is_local = next((local for role, local in roles.items() if name.startswith(role)), None)
        if is_local is None or not isinstance(s, Map):
            continue
        p = by_ref.get(s.comment)
        keep: tuple[Backend, ...] = ()
        if p is not None:  # (not in a plan's own rulesets: every map there has its port)
            if services is not None and p.ref.service not in services:
                continue
            eps = p.local_endpoints if is_local else (*p.cluster_endpoints, *p.local_endpoints)
            # (not made unique: packed into a set only for a map that holds clients)
            keep = tuple([b for b in eps if b[0].version == version])
        ports_name = (
            (n.affinity_local_client_ports_map if is_local else n.affinity_client_ports_map)(p.ref)
            if p is not None
            else None
        )
        port_map = rs.sets.get(ports_name) if ports_name else None
        if len(s.data) == 1 and isinstance(port_map, Map):
            out.append((s, keep, port_map))
        else:
            out.append((s, keep))
    return out
