"""``nlproxy explain``, the cluster half: one Service and its EndpointSlices as nlproxy saw them.

Sits after the manifests source (:func:`nlproxy.cluster.manifests.load_manifests`, whose parsing
and validation are ``cluster/parse.py``'s) and before the report: it picks one Service's
``Upsert``/``Skip``/``Invalid`` changes out of a load, describes them in short lines, and lists
the frontends the Service asks for, so they can be compared with what is programmed. Pure: no
I/O, no logging; it never reads raw objects itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from nlproxy.cluster.manifests import ManifestLoad
from nlproxy.cluster.model import (
    ClusterSnapshot,
    Endpoint,
    EndpointSlice,
    Invalid,
    LoadBalancing,
    Service,
    ServiceKey,
    ServiceType,
    Skip,
    Upsert,
)
from nlproxy.cluster.state import ClusterState
from nlproxy.nft.ir import Family, IPAddress
from nlproxy.operate.programmed import FrontendReport
from nlproxy.proxy.budget import Fallback, admit, choice, demand
from nlproxy.proxy.layout import Frontend

SKIPPED = "skipped: headless, ExternalName or another proxy's Service; nlproxy does not proxy it"


@dataclass(frozen=True, slots=True, kw_only=True)
class SliceFacts:
    """One EndpointSlice of the Service: its endpoints in short lines, or why it is left out."""

    name: str
    status: str  # valid | skipped | invalid
    family: str = ""
    ports: str = ""
    endpoints: tuple[str, ...] = ()
    problem: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceFacts:
    """The Service as the manifests define it.

    Attributes:
        status: ``valid``, ``skipped``, ``invalid`` or ``absent`` (no such Service).
        fields: ``(name, value)`` lines describing a valid Service.
        problems: validation errors and file errors, each naming the object or file.
        frontends: what a valid Service asks for (nothing programmed yet).
    """

    status: str
    fields: tuple[tuple[str, str], ...] = ()
    problems: tuple[str, ...] = ()
    slices: tuple[SliceFacts, ...] = ()
    frontends: tuple[FrontendReport, ...] = ()
    service: Service | None = None


def service_facts(load: ManifestLoad, key: ServiceKey) -> ServiceFacts:
    """Pick ``key``'s Service and slices out of ``load`` and describe them.

    Invalid or skipped slices carry no parsed ``kubernetes.io/service-name`` label, so those
    are attributed by their name: ``NAME`` or ``NAME-…``, as the EndpointSlice controller names
    them.
    """
    status, svc, problems = "absent", None, [f"manifests: {e}" for e in load.errors]
    slices: list[SliceFacts] = []
    for replace in load.changes:
        for change in replace.changes:
            ref = change.ref
            if ref.namespace != key.namespace:
                continue
            if ref.kind == "Service" and ref.name == key.name:
                status, svc = _service_change(change, problems)
            elif ref.kind == "EndpointSlice":
                facts = _slice_change(change, key)
                if facts is not None:
                    slices.append(facts)
                    if facts.problem and facts.status == "invalid":
                        problems.append(facts.problem)
    # Claims between Services (one frontend, two Services; addresses no Service may take) are
    # settled by the state, as the daemon settles them.
    state = ClusterState("")
    state.apply(load.changes)
    problems += [m for m in state.refused if m.startswith(f"Service {key}: ")]
    fallback = None
    if svc is not None:
        problems += [f"Service {key}: {w}" for w in svc.annotation_warnings]
        fallback = _fallback(state.snapshot(), key)
        if fallback is not None:
            problems.append(f"Service {key}: {fallback}")
    return ServiceFacts(
        status=status,
        fields=(*_fields(svc), ("load balancing", _balancing(svc, fallback)))
        if svc is not None
        else (),
        problems=tuple(problems),
        slices=tuple(sorted(slices, key=lambda s: s.name)),
        frontends=tuple(service_frontends(svc)) if svc is not None else (),
        service=svc,
    )


def _fallback(snap: ClusterSnapshot, key: ServiceKey) -> Fallback | None:
    """Whether ``key`` is past the element budget among the manifests' Services (as the daemon
    decides it; a ``--load-balancing`` default is not known here, so only annotations count)."""
    demands = {}
    for k, svc in snap.services.items():
        asked = choice(svc, LoadBalancing.RANDOM)
        if asked is not LoadBalancing.RANDOM:
            demands[k] = (asked, demand(svc, snap.slices.get(k, ()), asked))
    return admit(snap.services, demands).get(key) if key in demands else None


def _balancing(svc: Service, fallback: Fallback | None) -> str:
    """The endpoint choice the Service asks for (``nlproxy.io/load-balancing``), and what it
    gets when that is not in effect."""
    asked = str(svc.load_balancing) if svc.load_balancing else "the node's default"
    if svc.load_balancing and svc.load_balancing is not LoadBalancing.RANDOM:
        if svc.affinity_timeout is not None:
            return f"{asked} asked; ClientIP affinity wins"
        if fallback is not None:
            return f"{asked} asked; random: {fallback.elements} elements past the {fallback.reason}"
    if svc.annotation_warnings:
        return f"{asked} (an annotation value was not understood, see PROBLEM)"
    return asked


def _service_change(
    change: Upsert | Skip | Invalid, problems: list[str]
) -> tuple[str, Service | None]:
    if isinstance(change, Invalid):
        problems.append(change.error)
        return "invalid", None
    if isinstance(change, Skip):
        problems.append(f"{change.ref}: {SKIPPED}")
        return "skipped", None
    obj = change.obj
    return ("valid", obj) if isinstance(obj, Service) else ("invalid", None)


def _slice_change(change: Upsert | Skip | Invalid, key: ServiceKey) -> SliceFacts | None:
    name = change.ref.name
    if isinstance(change, Upsert):
        sl = change.obj
        if not isinstance(sl, EndpointSlice) or sl.service != key:
            return None
        return SliceFacts(
            name=name,
            status="valid",
            family=sl.family.value,
            ports=", ".join(f"{p.name or '-'} {p.port}/{p.protocol}" for p in sl.ports),
            endpoints=tuple(_endpoint_line(ep) for ep in sl.endpoints),
        )
    if not (name == key.name or name.startswith(f"{key.name}-")):
        return None
    if isinstance(change, Skip):
        reason = "skipped: FQDN, without a Service, or another proxy's; nlproxy ignores it"
        return SliceFacts(name=name, status="skipped", problem=f"{change.ref}: {reason}")
    return SliceFacts(name=name, status="invalid", problem=change.error)


def _endpoint_line(ep: Endpoint) -> str:
    cond = [c for c, on in (("ready", ep.ready), ("serving", ep.serving)) if on]
    if ep.terminating:
        cond.append("terminating")
    where = f"node {ep.node_name}" if ep.node_name else "no node"
    return f"{ep.ip}  {','.join(cond) or 'not-ready'}  {where}"


def _fields(svc: Service) -> tuple[tuple[str, str], ...]:
    def ips(values: Iterable[object]) -> str:
        return ", ".join(str(v) for v in values) or "-"

    ports = "; ".join(
        f"{p.ref.port_name or '-'} {p.port}/{p.ref.protocol} -> {p.target_port}"
        + (f" nodePort {p.node_port}" if p.node_port else "")
        for p in svc.ports
    )
    out = [
        ("type", svc.type.value),
        ("cluster IPs", ips(svc.cluster_ips)),
        ("ports", ports),
    ]
    if svc.external_ips:
        out.append(("external IPs", ips(svc.external_ips)))
    if svc.type is ServiceType.LOAD_BALANCER:
        out.append(("LB IPs", ips(svc.load_balancer_ips)))
    if svc.load_balancer_source_ranges:
        out.append(("source ranges", ips(svc.load_balancer_source_ranges)))
    policies = f"external {'Local' if svc.external_policy_local else 'Cluster'}, "
    policies += f"internal {'Local' if svc.internal_policy_local else 'Cluster'}"
    out.append(("traffic policy", policies))
    if svc.affinity_timeout is not None:
        out.append(("affinity", f"ClientIP, {svc.affinity_timeout}s"))
    return tuple(out)


def _family(addr: IPAddress) -> Family:
    return Family.IP if addr.version == 4 else Family.IP6


def service_frontends(svc: Service) -> list[FrontendReport]:
    """The frontends ``svc`` asks for: per port, its cluster IP of each family, external IPs,
    load-balancer IPs, and its node port (per family that has a cluster IP)."""
    out: list[FrontendReport] = []
    families = {_family(ip): ip for ip in reversed(svc.cluster_ips)}
    for sp in svc.ports:
        proto = sp.ref.protocol.value.lower()
        addrs = [("cluster-ip", ip) for ip in families.values()]
        addrs += [("external-ip", ip) for ip in svc.external_ips if _family(ip) in families]
        addrs += [("load-balancer", ip) for ip in svc.load_balancer_ips if _family(ip) in families]
        for kind, addr in addrs:
            out.append(
                FrontendReport(
                    ref=str(sp.ref),
                    family=_family(addr),
                    frontend=Frontend(proto, addr, sp.port),
                    kind=kind,
                )
            )
        if sp.node_port:
            out.extend(
                FrontendReport(
                    ref=str(sp.ref),
                    family=fam,
                    frontend=Frontend(proto, None, sp.node_port),
                    kind="node-port",
                )
                for fam in families
            )
    return out
