"""``nlproxy services``: every programmed frontend with its backends, their state and policies.

Sits at the end of the flow with the other read-only reports. The frontends come from the
kernel through the one read-back of the ruleset's shape (:func:`nlproxy.operate.programmed.
kernel_frontends`), the reachability of each backend from the inspector
(:func:`nlproxy.inspect.classify.classify`), and, when a manifests directory is given, the
Services and EndpointSlices it holds (through the manifests source's parsing): the kernel cannot
tell a ready backend from a serving terminating one (both are just map elements) nor a Cluster
internal policy from a Local one, the slices and Services can. :func:`services` reads them all;
the rest is pure: no I/O, no logging.

What the kernel alone tells:

- **external traffic policy** of external IP, load-balancer and node-port frontends: ``Local``
  when they dispatch to a ``*-local-N`` chain or have a ``*-backends-local`` set or a ``drop``
  for no local endpoints, ``Cluster`` when they dispatch to ``external-N``/``nodeport-N``;
- **internal traffic policy**: ``Local`` only when the ClusterIP drops for want of local
  endpoints, otherwise unknown;
- **affinity**: ``ClientIP`` (with the timeout of its ``affinity-…`` sets) when the frontend
  dispatches to a per-service chain, ``None`` when it dispatches to a shared one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nlproxy.cluster.manifests import load_manifests
from nlproxy.cluster.model import EndpointSlice, Service, Upsert
from nlproxy.errors import ConfigError
from nlproxy.inspect.classify import Reachability, classify
from nlproxy.nft.ir import FAMILIES, DnatMap, Family, IPAddress, Ruleset, Set, SetUpdate
from nlproxy.operate.explain import parse_service_key
from nlproxy.operate.manifests import service_frontends
from nlproxy.operate.programmed import FrontendReport, FrontKey, kernel_frontends, learned_map
from nlproxy.operate.rules import programmed
from nlproxy.proxy import naming as n
from nlproxy.proxy.layout import closure, proto_name

Target = tuple[IPAddress, int]
KIND_NAMES = {
    "cluster-ip": "ClusterIP",
    "external-ip": "ExternalIP",
    "external": "External",
    "load-balancer": "LoadBalancer",
    "node-port": "NodePort",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Backend:
    """One backend of a frontend.

    Attributes:
        state: ``ready``, ``serving,terminating``, ``terminating``, ``not-ready`` from the
            EndpointSlice; ``in use`` when only the kernel was read.
        programmed: the frontend DNATs to it (False: in the slices but not used, e.g. not ready).
        reach: how this node reaches it; None for backends that are not programmed.
    """

    address: IPAddress
    port: int
    state: str
    programmed: bool
    node: str | None = None
    reach: Reachability | None = None

    @property
    def label(self) -> str:
        host = f"[{self.address}]" if self.address.version == 6 else str(self.address)
        return f"{host}:{self.port}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceRow:
    """One frontend of one service port, with its backends and policies."""

    frontend: FrontendReport
    external_policy: str | None
    internal_policy: str | None
    affinity: str | None
    affinity_timeout: int | None
    backends: tuple[Backend, ...]
    cluster_backends: tuple[Target, ...] = ()
    """For a Local-policy frontend: what pods and the node itself reach (the Cluster set)."""

    @property
    def service(self) -> str:
        return self.frontend.ref.partition(":")[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class Manifests:
    """What a manifests directory says, indexed for the join."""

    services: Mapping[str, Service]
    """``ns/name`` → the Service."""
    slices: Mapping[str, tuple[EndpointSlice, ...]]
    """``ns/name`` → its EndpointSlices."""


def services(service: str | None, *, netns: str | None, manifests: Path | None) -> list[ServiceRow]:
    """Every programmed frontend (of ``service``, ``NS/NAME``, when given) as a row, in the
    table's order: read back from the kernel's ``ip``/``ip6 nlproxy`` tables, each backend
    classified from this node's routes, and with ``manifests`` the backend conditions and
    traffic policies of the Services and EndpointSlices in that directory.

    Raises:
        ConfigError: a bad ``service``, one neither programmed nor in ``manifests``, or a
            ``manifests`` that is not a directory.
        NlproxyError: the kernel refused a read-back or an rtnetlink dump.
    """
    key = str(parse_service_key(service)) if service else None
    rulesets = {rs.table.family: rs for rs in programmed(FAMILIES, netns)}
    index = _manifests(manifests)
    frontends: list[FrontendReport] = [
        fe for rs in rulesets.values() for fe in kernel_frontends(rs, key)
    ]
    if index is not None:
        frontends = join_frontends(frontends, index, key)
    if key is not None and not frontends:
        where = f"nor defined in {manifests}" if index else "(no --manifests given)"
        raise ConfigError(f"service {key}", f"unknown: nothing is programmed for it {where}")
    frontends.sort(key=_order)
    reach = classify(
        [a for fe in frontends for a, _ in (*fe.endpoints, *fe.local_endpoints)], netns=netns
    )
    return build_rows(frontends, rulesets, reach, index)


def _manifests(directory: Path | None) -> Manifests | None:
    if directory is None:
        return None
    if not directory.is_dir():
        raise ConfigError("--manifests", f"{directory} is not a directory")
    load = load_manifests(directory)
    return manifests_index(c.obj for r in load.changes for c in r.changes if isinstance(c, Upsert))


def _order(fe: FrontendReport) -> tuple[str, bool, int, int, int]:
    kinds = ("cluster-ip", "external-ip", "load-balancer", "external", "node-port")
    addr = 0 if fe.address is None else int(fe.address)
    return (fe.ref, fe.family is Family.IP6, kinds.index(fe.kind), addr, fe.port)


def manifests_index(objects: Iterable[object]) -> Manifests:
    """Index parsed Services and EndpointSlices (other objects are ignored)."""
    services: dict[str, Service] = {}
    slices: dict[str, list[EndpointSlice]] = {}
    for obj in objects:
        if isinstance(obj, Service):
            services[str(obj.key)] = obj
        elif isinstance(obj, EndpointSlice):
            slices.setdefault(str(obj.service), []).append(obj)
    return Manifests(services=services, slices={k: tuple(v) for k, v in slices.items()})


def join_frontends(
    programmed: Iterable[FrontendReport], manifests: Manifests, service: str | None = None
) -> list[FrontendReport]:
    """Programmed frontends, named by the kind their Service gives them (external IP or
    load-balancer IP, which the kernel alone cannot always tell apart), plus the frontends the
    manifests' Services (only ``service``'s when given) ask for that are not programmed."""
    found: dict[FrontKey, FrontendReport] = {fe.key: fe for fe in programmed}
    for key, svc in manifests.services.items():
        if service is not None and key != service:
            continue
        for want in service_frontends(svc):
            have = found.get(want.key)
            found[want.key] = want if have is None else dataclasses.replace(have, kind=want.kind)
    return list(found.values())


def _state_of(ready: bool, serving: bool, terminating: bool) -> str:
    if ready:
        return "ready"
    if serving and terminating:
        return "serving,terminating"
    return "terminating" if terminating else "not-ready"


def _slice_endpoints(
    fe: FrontendReport, manifests: Manifests
) -> dict[Target, tuple[str, str | None]]:
    """(address, target port) → (state, node) of the frontend's service port in the slices."""
    service, _, rest = fe.ref.partition(":")
    port_name = rest.rpartition("/")[0]
    proto = proto_name(fe.proto)
    out: dict[Target, tuple[str, str | None]] = {}
    for sl in manifests.slices.get(service, ()):
        ports = [p.port for p in sl.ports if p.name == port_name and p.protocol.value == proto]
        for ep in sl.endpoints:
            for port in ports:
                state = _state_of(ep.ready, ep.serving, ep.terminating)
                out.setdefault((ep.ip, port), (state, ep.node_name))
    return out


def _external_policy(fe: FrontendReport, svc: Service | None) -> str | None:
    if fe.kind == "cluster-ip":
        return None
    if svc is not None:
        return "Local" if svc.external_policy_local else "Cluster"
    chain = fe.dispatch or ""
    if n.is_local_dispatch(chain) or fe.local_endpoints or fe.no_endpoint == "drop":
        return "Local"
    if n.is_cluster_dispatch(chain):
        return "Cluster"
    return None


def _internal_policy(fe: FrontendReport, svc: Service | None) -> str | None:
    if fe.kind != "cluster-ip":
        return None
    if svc is not None:
        return "Local" if svc.internal_policy_local else "Cluster"
    return "Local" if fe.no_endpoint == "drop" else None


def _affinity(
    fe: FrontendReport, rs: Ruleset | None, svc: Service | None
) -> tuple[str | None, int | None]:
    if svc is not None:
        timeout = svc.affinity_timeout
        return ("ClientIP", timeout) if timeout is not None else ("None", None)
    chain = fe.dispatch
    if chain is None:
        return None, None
    if not n.is_affinity_dispatch(chain):
        return "None", None
    timeouts = []
    if rs is not None:
        for name in closure(rs, [chain]):
            for rule in rs.rules.get(name, []):
                for e in rule.exprs:
                    if isinstance(e, SetUpdate):
                        s = rs.sets.get(e.set)
                        timeout = e.timeout or (s.timeout if isinstance(s, Set) else None)
                    elif isinstance(e, DnatMap) and learned_map(rs, e.map):
                        timeout = rs.sets[e.map].timeout  # the map layout: its clients map's
                    else:
                        continue
                    if timeout:
                        timeouts.append(timeout)
    return "ClientIP", max(timeouts) if timeouts else None


def build_rows(
    frontends: Sequence[FrontendReport],
    rulesets: Mapping[Family, Ruleset],
    reach: Mapping[IPAddress, Reachability],
    manifests: Manifests | None = None,
) -> list[ServiceRow]:
    """Join frontends with their backends' states, reachability and the service's policies.

    A Local-policy frontend lists its local backends (what outside clients reach); the Cluster
    set its pods and the node reach is in ``cluster_backends``.
    """
    rows = []
    for fe in frontends:
        svc = manifests.services.get(fe.ref.partition(":")[0]) if manifests else None
        external = _external_policy(fe, svc)
        local_view = external == "Local" and fe.kind != "cluster-ip"
        used = fe.local_endpoints if local_view else fe.endpoints
        known = _slice_endpoints(fe, manifests) if manifests else {}
        backends = [
            Backend(
                address=addr,
                port=port,
                state=known[(addr, port)][0] if (addr, port) in known else "in use",
                programmed=True,
                node=known[(addr, port)][1] if (addr, port) in known else None,
                reach=reach.get(addr),
            )
            for addr, port in used
        ]
        if manifests is not None:
            backends += [
                Backend(address=addr, port=port, state=state, programmed=False, node=node)
                for (addr, port), (state, node) in sorted(known.items(), key=_target_order)
                if (addr, port) not in set(used)
                and (addr, port) not in set(fe.endpoints)
                and addr.version == (4 if fe.family is Family.IP else 6)
            ]
        affinity, timeout = _affinity(fe, rulesets.get(fe.family), svc)
        rows.append(
            ServiceRow(
                frontend=fe,
                external_policy=external,
                internal_policy=_internal_policy(fe, svc),
                affinity=affinity,
                affinity_timeout=timeout,
                backends=tuple(backends),
                cluster_backends=fe.endpoints if local_view else (),
            )
        )
    return rows


def _target_order(item: tuple[Target, object]) -> tuple[int, int, int]:
    (addr, port), _ = item
    return addr.version, int(addr), port


def _policy_text(row: ServiceRow) -> str:
    parts = []
    if row.internal_policy or row.frontend.kind == "cluster-ip":
        parts.append(f"internal={row.internal_policy or '?'}")
    if row.external_policy or row.frontend.kind != "cluster-ip":
        parts.append(f"external={row.external_policy or '?'}")
    if row.affinity == "ClientIP":
        parts.append(
            "affinity=ClientIP"
            + (f"/{row.affinity_timeout}s" if row.affinity_timeout is not None else "")
        )
    if row.frontend.allowed is not None:
        parts.append("sourceRanges=" + (",".join(map(str, row.frontend.allowed)) or "none"))
    return " ".join(parts)


def _backend_text(b: Backend) -> str:
    notes = [b.state]
    if b.reach is not None:
        if b.reach.reachable:
            notes += [b.reach.kind, "reachable"]
        else:
            notes.append(f"UNREACHABLE: {b.reach.reason}")
    elif not b.programmed:
        notes.append("not programmed")
    return f"{b.label} ({', '.join(notes)})"


def render_table(rows: Sequence[ServiceRow]) -> str:
    """One row per frontend, its backends one per line (``cilium service list``'s layout)."""
    head = ("FRONTEND", "TYPE", "SERVICE PORT", "POLICY", "BACKENDS")
    lines: list[tuple[str, ...]] = [head]
    for row in rows:
        fe = row.frontend
        first = (fe.label, KIND_NAMES.get(fe.kind, fe.kind), fe.ref, _policy_text(row) or "-")
        numbered = [
            f"{i} => {_backend_text(b)}" for i, b in enumerate(row.backends, 1) if b.programmed
        ]
        if not numbered:
            word = fe.no_endpoint or ("not programmed" if not fe.programmed else "none")
            numbered.append(f"(no backends: {word})")
        elif fe.no_endpoint is not None:
            numbered.append(f"(outside traffic: {fe.no_endpoint})")
        numbered += [f"     {_backend_text(b)}" for b in row.backends if not b.programmed]
        lines.append((*first, numbered[0]))
        lines.extend(("", "", "", "", more) for more in numbered[1:])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head) - 1)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=False)) + "  " + line[-1]
        for line in lines
    )


def row_json(row: ServiceRow) -> dict[str, object]:
    """``--json``: one object per frontend."""
    fe = row.frontend
    return {
        "service": row.service,
        "port": fe.ref,
        "frontend": fe.label,
        "type": KIND_NAMES.get(fe.kind, fe.kind),
        "family": fe.family.value,
        "address": None if fe.address is None else str(fe.address),
        "port_number": fe.port,
        "protocol": proto_name(fe.proto),
        "state": fe.state,
        "external_traffic_policy": row.external_policy,
        "internal_traffic_policy": row.internal_policy,
        "session_affinity": row.affinity,
        "affinity_timeout_seconds": row.affinity_timeout,
        "source_ranges": None if fe.allowed is None else [str(n) for n in fe.allowed],
        "backends": [_backend_json(b) for b in row.backends],
        "cluster_backends": [f"{a}:{p}" for a, p in row.cluster_backends],
    }


def _backend_json(b: Backend) -> dict[str, object]:
    r = b.reach
    return {
        "address": str(b.address),
        "port": b.port,
        "state": b.state,
        "programmed": b.programmed,
        "node": b.node,
        "where": None if r is None else r.kind,
        "reachable": None if r is None else r.reachable,
        "reason": None if r is None else r.reason,
    }
