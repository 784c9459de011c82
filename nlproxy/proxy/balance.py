"""Round-robin and consistent-hash service ports: chains and a map of their own.

Sits inside the planner, beside ``affinity.py``. Random choice shares one chain per endpoint count
among every service (``numgen random`` holds no state), but a round-robin counter (``numgen inc``)
is state of the rule that holds it: shared, it would cycle over the connections of every service
with that count, not over one service's. Consistent hashing needs a lookup table per service. So
such a port gets, like ClientIP affinity, its own objects:

* a map per endpoint list (``lb-cluster-…``, and ``lb-local-…`` for a Local policy) from an index
  to ``address . port``: index i → endpoint i for round-robin, the Maglev table for hashing;
* ``lb-internal-…`` (ClusterIP traffic), ``lb-external-…`` (external IPs, load-balancer IPs and
  node ports) and, for externalTrafficPolicy Local, ``lb-dnat-…`` (the short-circuit of pods and
  the node itself to every endpoint); each does what its shared counterpart does, then
  ``dnat to <choice> map @lb-…``.

ClusterIP and external traffic have a rule each, so each cycles on its own (as IPVS keeps a
scheduler per virtual service). An endpoint change is element updates; a change of the endpoint
count (round-robin) or of the table size (hashing) also replaces the rules that carry it.
Pure: no I/O, clock or logging.
"""

from __future__ import annotations

from collections.abc import Sequence

from nlproxy.cluster.model import LoadBalancing, Service, ServicePort
from nlproxy.nft.ir import (
    Chain,
    Cmp,
    DataType,
    DnatMap,
    Element,
    Expr,
    Field,
    Jhash,
    L4Proto,
    Map,
    Numgen,
    NumgenKind,
    Rule,
    Selector,
    goto,
    jump,
)
from nlproxy.proxy import naming as n
from nlproxy.proxy.endpoints import Backend, Categorized, externally_accessible
from nlproxy.proxy.fragments import Recorder
from nlproxy.proxy.hashring import default_seed, lookup_table, table_size
from nlproxy.proxy.skeleton import FIB_SADDR_LOCAL, FamilySpec, PodMatch


def add_balanced_chains(
    sink: Recorder,
    f: FamilySpec,
    svc: Service,
    sp: ServicePort,
    cat: Categorized,
    algorithm: LoadBalancing,
    *,
    pods: PodMatch | None,
    seed: int | None = None,
) -> tuple[str, str | None]:
    """Add the chains and maps of one round-robin or consistent-hash service port.

    Returns:
        The chain for ClusterIP traffic and the one for external traffic (None when the port
        takes none), as :func:`~nlproxy.proxy.affinity.add_affinity_chains` does. A chain is only
        created when something sends traffic to it.

    Args:
        seed: the consistent hash's seed; None derives it from the Service's UID.
    """
    ref = sp.ref
    plan = _Port(sink, f, sp, algorithm)
    if algorithm is LoadBalancing.CONSISTENT_HASH:
        plan.hashed = (f.saddr, Field.TH_SPORT) if svc.hash_source_port else (f.saddr,)
        plan.seed = default_seed(svc) if seed is None else seed
    internal_eps = cat.local if svc.internal_policy_local else cat.cluster
    internal = n.balanced_chain("internal", ref)
    if internal_eps:
        masq: list[tuple[Expr, ...]] = []
        if pods is not None:
            # Off-cluster sources reaching the ClusterIP may be routed back off-node.
            masq.append((pods.not_pod, jump(n.MARK_FOR_MASQUERADE)))
        plan.chain(internal, [*masq, plan.dnat(svc.internal_policy_local, internal_eps)])
    if not (cat.has_any and externally_accessible(svc, sp)):
        return internal, None
    external = n.balanced_chain("external", ref)
    rules: list[tuple[Expr, ...]] = []
    if not svc.external_policy_local:
        rules.append((jump(n.MARK_FOR_MASQUERADE),))
        if cat.cluster:
            rules.append(plan.dnat(False, cat.cluster))
    else:
        to_all = n.balanced_chain("dnat", ref)
        if cat.cluster:
            plan.chain(to_all, [plan.dnat(False, cat.cluster)])
            # Pods and the node itself reach every endpoint (upstream's short-circuits); the
            # node's own traffic is masqueraded, its source being a local address.
            if pods is not None:
                rules.append((pods.is_pod, goto(to_all)))
            rules.append((FIB_SADDR_LOCAL, jump(n.MARK_FOR_MASQUERADE)))
            rules.append((FIB_SADDR_LOCAL, goto(to_all)))
        if cat.local:
            rules.append(plan.dnat(True, cat.local))
    plan.chain(external, rules)
    return internal, external


class _Port:
    """Builds one service port's objects; each endpoint list's map is filled once."""

    def __init__(
        self, sink: Recorder, f: FamilySpec, sp: ServicePort, algorithm: LoadBalancing
    ) -> None:
        self.sink, self.f, self.ref, self.algorithm = sink, f, sp.ref, algorithm
        self.maps: dict[bool, str] = {}
        self.hashed: tuple[Field, ...] = ()
        self.seed = 0

    def chain(self, name: str, rules: list[tuple[Expr, ...]]) -> None:
        self.sink.add_chain(Chain(name=n.check_name("chain", name), comment=str(self.ref)))
        for exprs in rules:
            self.sink.add_rule(Rule(chain=name, exprs=exprs))

    def dnat(self, local: bool, eps: Sequence[Backend]) -> tuple[Expr, ...]:
        """``dnat to <choice> map @lb-…`` over ``eps`` (the cluster or the local list)."""
        name = self.maps.get(local)
        if name is None:
            name = self.maps[local] = n.check_name("map", n.balanced_map(local, self.ref))
            self.sink.add_set(
                Map(
                    name=name,
                    key=(DataType.INTEGER,),
                    data=(self.f.addr, DataType.INET_SERVICE),
                    comment=str(self.ref),
                )
            )
            if self.hashed:
                table = lookup_table(eps, table_size(len(eps)))
                slots: list[Backend] | Sequence[Backend] = [eps[i] for i in table]
            else:
                slots = eps
            for i, b in enumerate(slots):
                self.sink.add_element(Element(set=name, key=(i,), value=b))
        # nft -f takes a DNAT to an address and port only after a protocol match.
        proto = Cmp(Field.META_L4PROTO, L4Proto[self.ref.protocol.value])
        return (proto, DnatMap((self.choice(eps),), name))

    def choice(self, eps: Sequence[Backend]) -> Selector:
        """``numgen inc mod N`` (round-robin), or ``jhash <client> mod M seed S`` (Maglev)."""
        if self.hashed:
            return Jhash(self.hashed, table_size(len(eps)), self.seed)
        assert self.algorithm is LoadBalancing.ROUND_ROBIN, "random ports use the shared chains"
        return Numgen(len(eps), NumgenKind.INC)
