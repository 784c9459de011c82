"""ClientIP session affinity: per-port state the packet path keeps, in one of two layouts.

Sits inside the planner. Affinity remembers which endpoint served each client (with a
timeout), so the choice depends on state and cannot be folded into the shared
``numgen … map @backends`` chains.

The map layout (IPv4 ports whose only frontend is the ClusterIP, with the Cluster policy: most
of them) costs a few objects per port whatever its endpoints: a dynamic map
``clients-…`` (client -> endpoint address . port, the Service's timeout) and an index map
``lb-cluster-…`` (as a round-robin port's, ``balance.py``). The ``service-…`` chain DNATs a
known client through the clients map and a new one through ``numgen random`` over the index
map. After DNAT the static ``affinity-…`` chains (``skeleton.py``) find the connection by its
original address in ``affinity-addresses`` and go to the Service's ``learn-…`` chain, which
matches the original port and records (or refreshes) ``client -> endpoint``. The packet path
cannot delete an element: when an endpoint goes, the sync deletes the clients held for it
(:func:`stale_client_maps`, ``nft/dynmap.py``). An endpoint change is element operations.

Every other affinity port keeps upstream's layout: ``service-…`` / ``local-…`` policy chains
send a known client to its endpoint's chain and a new one to a random endpoint chain, which
records the client (a dynamic set per endpoint) and DNATs. Pure: no I/O, clock, logging.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from typing import Protocol

from nlproxy.cluster.model import IPAddress, Service, ServiceKey, ServicePort, ServicePortRef
from nlproxy.nft.ir import (
    Chain,
    Cmp,
    DataType,
    Dnat,
    DnatMap,
    Element,
    Expr,
    Family,
    Field,
    InlineVMap,
    L4Proto,
    Lookup,
    Map,
    Numgen,
    Rule,
    Ruleset,
    Set,
    SetFlag,
    SetUpdate,
    Value,
    Verdict,
    goto,
    jump,
)
from nlproxy.proxy import naming as n
from nlproxy.proxy.endpoints import Backend, Categorized, externally_accessible
from nlproxy.proxy.fragments import Recorder
from nlproxy.proxy.skeleton import FIB_SADDR_LOCAL, FamilySpec, PodMatch


class Planning(Protocol):
    """What the affinity chains need of the family's planner (``planner.FamilyPlanner``)."""

    sink: Recorder
    f: FamilySpec
    pods: PodMatch | None

    def fill(
        self, set_name: str, prefix: tuple[IPAddress | int, ...], eps: tuple[Backend, ...]
    ) -> None: ...


def add_affinity_chains(
    fp: Planning, svc: Service, sp: ServicePort, cip: IPAddress, cat: Categorized
) -> tuple[str, str | None]:
    """Add the affinity chains, sets and maps of one service port.

    Returns:
        The chain for ClusterIP traffic and the one for external traffic (None when the port
        takes none). Only chains with something to do are created.
    """
    sink, f, pods = fp.sink, fp.f, fp.pods
    if map_layout(f, svc, sp):
        return _map_port(fp, svc, sp, cip, cat), None
    ref = sp.ref
    timeout = svc.affinity_timeout or 0
    proto = L4Proto[ref.protocol.value]
    for b in sorted({*cat.cluster, *cat.local}, key=lambda b: (b.ip, b.port)):
        _endpoint(sink, f, ref, b, proto, timeout)
    masq: tuple[Expr, ...] = ()
    if pods is not None:
        # Off-cluster sources reaching the ClusterIP may be routed back off-node: masquerade.
        masq = (Cmp(f.daddr, cip), pods.not_pod, jump(n.MARK_FOR_MASQUERADE))
    cluster_chain = n.affinity_service_chain(ref)
    local_chain = n.affinity_local_chain(ref)
    if cat.cluster:
        _policy(sink, f, ref, cluster_chain, cat.cluster, () if svc.internal_policy_local else masq)
    if cat.local:
        _policy(sink, f, ref, local_chain, cat.local, masq if svc.internal_policy_local else ())
    internal = local_chain if svc.internal_policy_local else cluster_chain
    if not (cat.has_any and externally_accessible(svc, sp)):
        return internal, None
    ext = n.affinity_external_chain(ref)
    rules: list[tuple[Expr, ...]] = []
    if not svc.external_policy_local:
        rules += [(jump(n.MARK_FOR_MASQUERADE),), (goto(cluster_chain),)]
    else:
        if pods is not None:
            rules.append((pods.is_pod, goto(cluster_chain)))
        rules.append((FIB_SADDR_LOCAL, jump(n.MARK_FOR_MASQUERADE)))
        rules.append((FIB_SADDR_LOCAL, goto(cluster_chain)))
        if cat.local:
            rules.append((goto(local_chain),))
    _chain(sink, ext, ref, rules)
    return internal, ext


def _chain(sink: Recorder, name: str, ref: ServicePortRef, rules: list[tuple[Expr, ...]]) -> None:
    sink.add_chain(Chain(name=n.check_name("chain", name), comment=str(ref)))
    for exprs in rules:
        sink.add_rule(Rule(chain=name, exprs=exprs))


def _policy(
    sink: Recorder,
    f: FamilySpec,
    ref: ServicePortRef,
    name: str,
    eps: tuple[Backend, ...],
    masq: tuple[Expr, ...],
) -> None:
    rules: list[tuple[Expr, ...]] = [masq] if masq else []
    targets = [n.affinity_endpoint_chain(ref, b.ip, b.port) for b in eps]
    for b, chain in zip(eps, targets, strict=True):
        sticky = n.affinity_set(ref, b.ip, b.port)
        rules.append((Lookup((f.saddr,), sticky), goto(chain)))
    entries: tuple[tuple[tuple[Value, ...], Verdict], ...] = tuple(
        ((i,), goto(c)) for i, c in enumerate(targets)
    )
    rules.append((InlineVMap((Numgen(len(eps)),), entries),))
    _chain(sink, name, ref, rules)


def _endpoint(
    sink: Recorder, f: FamilySpec, ref: ServicePortRef, b: Backend, proto: L4Proto, timeout: int
) -> None:
    sticky = n.check_name("set", n.affinity_set(ref, b.ip, b.port))
    sink.add_set(
        Set(
            name=sticky,
            key=(f.addr,),
            flags=SetFlag.TIMEOUT | SetFlag.EVAL,
            timeout=timeout,
            comment=str(ref),
        )
    )
    chain = n.affinity_endpoint_chain(ref, b.ip, b.port)
    _chain(
        sink,
        chain,
        ref,
        [
            (SetUpdate(sticky, (f.saddr,)),),
            (Cmp(Field.META_L4PROTO, proto), Dnat(b.ip, b.port)),
        ],
    )


def map_layout(f: FamilySpec, svc: Service, sp: ServicePort) -> bool:
    """Whether port ``sp`` of ``svc`` takes the map layout in family ``f``: IPv4, the ClusterIP
    its only frontend (no node port, no external or LoadBalancer address in any family) and
    the Cluster policy for it."""
    return (
        f.family is Family.IP
        and not sp.node_port
        and not svc.external_ips
        and not svc.load_balancer_ips
        and not svc.internal_policy_local
    )


def _map_port(fp: Planning, svc: Service, sp: ServicePort, cip: IPAddress, cat: Categorized) -> str:
    sink, f, pods = fp.sink, fp.f, fp.pods
    ref, comment = sp.ref, str(sp.ref)
    proto = L4Proto[ref.protocol.value]
    clients = n.check_name("map", n.affinity_clients_map(ref))
    sink.add_set(
        Map(
            name=clients,
            key=(f.addr,),
            data=(f.addr, DataType.INET_SERVICE),
            flags=SetFlag.TIMEOUT | SetFlag.EVAL,
            timeout=svc.affinity_timeout,
            comment=comment,
        )
    )
    # This port's learning: ``client -> endpoint`` (the packet's destination is the endpoint
    # by now). A chain of its own: nft lists a port match and an update with ``th dport`` in
    # one rule so that it cannot load it back (``tcp dport`` drops the protocol match).
    port_learn = n.check_name("chain", n.affinity_learn_chain(ref))
    sink.add_chain(Chain(name=port_learn, comment=comment))
    update = SetUpdate(clients, (f.saddr,), None, (f.daddr, Field.TH_DPORT))
    sink.add_rule(Rule(chain=port_learn, exprs=(update,)))
    chain = n.affinity_service_chain(ref)
    if cat.cluster:
        # A new client's endpoint: from the shared backends map, as the cluster-ip-N chains
        # choose (an endpoint change keeps the others' slots: elements only).
        fp.fill(n.BACKENDS, (cip, proto, sp.port), cat.cluster)
        rules: list[tuple[Expr, ...]] = []
        if pods is not None:
            # Off-cluster sources reaching the ClusterIP may be routed back off-node.
            rules.append((pods.not_pod, jump(n.MARK_FOR_MASQUERADE)))
        # nft -f takes a DNAT to an address and port only after a protocol match.
        is_proto = Cmp(Field.META_L4PROTO, proto)
        rules.append((is_proto, DnatMap((f.saddr,), clients)))
        choice = (f.daddr, Field.META_L4PROTO, Field.TH_DPORT, Numgen(len(cat.cluster)))
        rules.append((is_proto, DnatMap(choice, n.BACKENDS)))
        _chain(sink, chain, ref, rules)
    # The Service's learning chain, with its last map-layout port of this protocol: every
    # clients map it names is planned by then.
    same = [p for p in svc.ports if p.ref.protocol is ref.protocol and map_layout(f, svc, p)]
    if same[-1] is sp:
        learn = n.check_name("chain", n.affinity_service_learn_chain(ref))
        sink.add_chain(Chain(name=learn, comment=f"{ref.namespace}/{ref.name}"))
        ports = tuple(((p.port,), goto(n.affinity_learn_chain(p.ref))) for p in same)
        by_port = InlineVMap((Field.CT_ORIGINAL_PROTO_DST,), ports)
        sink.add_rule(Rule(chain=learn, exprs=(Cmp(Field.META_L4PROTO, proto), by_port)))
        sink.add_element(
            Element(set=n.AFFINITY_ADDRESSES, key=(cip, proto), value=goto(learn), comment=comment)
        )
    return chain


class PortEndpoints(Protocol):
    """A port's plan as the sync has it (``planner.PortPlan``)."""

    @property
    def ref(self) -> ServicePortRef: ...
    @property
    def cluster_endpoints(self) -> tuple[Backend, ...]: ...


def client_maps(
    rs: Ruleset, ports: Iterable[PortEndpoints], services: AbstractSet[ServiceKey] | None = None
) -> list[tuple[Map, tuple[Backend, ...]]]:
    """Each clients map of ``rs`` (the map layout) of ``services`` (None: every one) with the
    endpoints its clients may keep: its port's. What the sync hands ``nft/dynmap.py`` after a
    commit that changed those services, to forget the clients of endpoints that went."""
    by_ref = {str(p.ref): p for p in ports}
    prefix = f"{n.AFFINITY_CLIENTS}-"
    version = 4 if rs.table.family is Family.IP else 6  # (a port's plan has both families)
    out: list[tuple[Map, tuple[Backend, ...]]] = []
    for name, s in rs.sets.items():
        if not name.startswith(prefix) or not isinstance(s, Map):
            continue
        p = by_ref.get(s.comment)
        if p is None:  # (not in a plan's own rulesets: every map there has its port)
            out.append((s, ()))
        elif services is None or p.ref.service in services:
            out.append((s, tuple(b for b in p.cluster_endpoints if b[0].version == version)))
    return out
