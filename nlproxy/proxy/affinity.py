"""ClientIP session affinity: the one feature that needs chains and sets per service port.

Sits inside the planner. Affinity remembers, per endpoint, which clients it served (a dynamic
set with a timeout, updated by the packet path), so the choice depends on per-endpoint state and
cannot be folded into the shared ``numgen … map @backends`` chains. The layout is upstream's:
``service-…`` / ``local-…`` policy chains send a known client to its endpoint's chain and a new
one to a random endpoint chain, which records the client and DNATs. Pure: no I/O, clock, logging.
"""

from __future__ import annotations

from nlproxy.cluster.model import IPAddress, Service, ServicePort, ServicePortRef
from nlproxy.nft.ir import (
    Chain,
    Cmp,
    Dnat,
    Expr,
    Field,
    InlineVMap,
    L4Proto,
    Lookup,
    Numgen,
    Rule,
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


def add_affinity_chains(
    sink: Recorder,
    f: FamilySpec,
    svc: Service,
    sp: ServicePort,
    cip: IPAddress,
    cat: Categorized,
    *,
    pods: PodMatch | None,
) -> tuple[str, str | None]:
    """Add the affinity chains and sets of one service port.

    Returns:
        The chain for ClusterIP traffic and the one for external traffic (None when the port
        takes none). Only chains with something to do are created.
    """
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
