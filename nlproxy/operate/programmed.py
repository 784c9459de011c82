"""``nlproxy explain``, the kernel half: one Service's frontends, elements and chains, read back.

Sits after read-back (:func:`nlproxy.nft.readback.read_ruleset`) and before the report: from the
programmed ``ip``/``ip6 nlproxy`` tables it recovers the frontends of one Service (the
``service-ips``, ``service-nodeports`` and ``no-endpoint-*`` elements carry ``ns/name:port/PROTO``
comments), their endpoints (``backends*`` maps, keyed by frontend), the elements that belong to
them and the shared chains those elements jump or go to, rendered nft-like with ``nft/render``.
The ruleset shape (docs/ruleset.md) is read through :mod:`nlproxy.proxy.layout`. Pure: no I/O,
no logging; it never changes a ruleset. :func:`kernel_frontends` also lists every service's
frontends at once, for ``nlproxy services``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network

from nlproxy.nft.ir import (
    Counter,
    DnatMap,
    Family,
    IPAddress,
    IPNetwork,
    Jhash,
    Numgen,
    NumgenKind,
    Ruleset,
    SetFlag,
    SetUpdate,
    Value,
    Verdict,
    VerdictKind,
)
from nlproxy.nft.render import render_chain, render_element
from nlproxy.nft.values import key_order
from nlproxy.proxy import layout
from nlproxy.proxy import naming as n
from nlproxy.proxy.layout import (
    SHAPES,
    Frontend,
    Target,
    closure,
    dnat_targets,
    proto_name,
    proto_number,
)

FrontKey = tuple[Family, int, IPAddress | None, int]
"""(family, l4proto, address or None for a node port, port): a frontend's identity."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FrontendReport:
    """A frontend (an address and port one service port answers on) and what is programmed for
    it, as explain reports it.

    Attributes:
        ref: the service port, ``ns/name:port/PROTO``.
        family: the table it was read from (or the manifests ask for it in).
        frontend: the protocol, address (None for a node port: every NodePort address of the
            family) and port.
        kind: ``cluster-ip``, ``external-ip``, ``load-balancer``, ``external`` (an external or
            load-balancer IP, when only the kernel was read) or ``node-port``.
        dispatch: the chain the ``service-ips``/``service-nodeports`` element goes to, or None.
        no_endpoint: ``reject`` or ``drop`` when a ``no-endpoint-*`` element catches it.
        endpoints: what the dispatch DNATs to (``backends``/``nodeport-backends``).
        local_endpoints: the Local-policy set (``backends-local``/``nodeport-backends-local``).
        allowed: ``loadBalancerSourceRanges`` as programmed, None when not firewalled.
        programmed: any element of this frontend is in the kernel.
        algorithm: how its dispatch chooses an endpoint (``random``, ``round-robin``, or
            ``consistent-hash`` with its hash), empty without a dispatch.
    """

    ref: str
    family: Family
    frontend: Frontend
    kind: str
    dispatch: str | None = None
    no_endpoint: str | None = None
    endpoints: tuple[Target, ...] = ()
    local_endpoints: tuple[Target, ...] = ()
    allowed: tuple[IPNetwork, ...] | None = None
    programmed: bool = False
    algorithm: str = ""

    @property
    def proto(self) -> int:
        """The l4proto number."""
        return proto_number(self.frontend.proto)

    @property
    def address(self) -> IPAddress | None:
        return self.frontend.addr

    @property
    def port(self) -> int:
        return self.frontend.port

    @property
    def key(self) -> FrontKey:
        return (self.family, self.proto, self.address, self.port)

    @property
    def label(self) -> str:
        if self.address is None:
            where = "nodeport" if self.family is Family.IP else "nodeport6"
        elif self.address.version == 6:
            where = f"[{self.address}]"
        else:
            where = str(self.address)
        return f"{where}:{self.port}/{proto_name(self.proto)}"

    @property
    def port_name(self) -> str:
        """The ``port`` part of ``ns/name:port/PROTO`` (may be empty)."""
        return self.ref.partition(":")[2].rpartition("/")[0]

    @property
    def state(self) -> str:
        """``dispatch`` (DNAT'd), ``reject``, ``drop`` or ``not programmed``, as one word."""
        if self.dispatch is not None:
            return "dispatch"
        return self.no_endpoint or "not programmed"


@dataclass(frozen=True, slots=True, kw_only=True)
class ElementLine:
    family: Family
    set: str
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ChainText:
    family: Family
    name: str
    lines: tuple[str, ...]
    counters: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceRules:
    """What one Service has programmed, all families together."""

    frontends: tuple[FrontendReport, ...]
    elements: tuple[ElementLine, ...]
    chains: tuple[ChainText, ...]
    counter_rules: int
    """Rules with a ``counter`` anywhere in the tables (0: counters are off)."""
    undecoded_rules: int


def belongs(ref: str, service: str) -> bool:
    """``ns/name:port/PROTO`` is a port of ``ns/name``."""
    return ref.partition(":")[0] == service


def element_frontend(family: Family, set_name: str, key: tuple[Value, ...]) -> FrontKey | None:
    """The frontend an element of a per-frontend map belongs to, None for other sets/shapes."""
    fk = layout.element_front(set_name, key)
    return None if fk is None else (family, *fk)


def _kind(rs: Ruleset, addr: IPAddress | None) -> str:
    if addr is None:
        return "node-port"
    if (addr,) in rs.elements.get(n.CLUSTER_IPS, {}):
        return "cluster-ip"
    return "external"


def _verdict_word(v: object) -> str:
    if isinstance(v, Verdict) and v.kind is VerdictKind.DROP:
        return "drop"
    if isinstance(v, Verdict) and v.chain == n.REJECT_CHAIN:
        return "reject"
    return str(getattr(v, "kind", v))


def _allowed(rs: Ruleset, fe: FrontendReport) -> tuple[IPNetwork, ...] | None:
    if fe.address is None or (fe.address, fe.proto, fe.port) not in rs.elements.get(
        n.FIREWALL_IPS, {}
    ):
        return None
    out = []
    for key in sorted(rs.elements.get(n.FIREWALL_ALLOW, {}), key=key_order):
        if element_frontend(rs.table.family, n.FIREWALL_ALLOW, key) == fe.key:
            net = key[3]
            if isinstance(net, IPv4Network | IPv6Network):
                out.append(net)
    return tuple(out)


def kernel_frontends(rs: Ruleset, service: str | None = None) -> list[FrontendReport]:
    """The frontends of ``service`` (``ns/name``; None: of every service) in one family's
    table, with their state and endpoints.

    Each ``backends*`` map is walked once for all the frontends found, so listing every
    service costs one pass over its elements, not one per frontend.
    """
    found: dict[FrontKey, FrontendReport] = {}
    family = rs.table.family
    for field in ("dispatch", "no_endpoint"):
        for shape in SHAPES:
            for front, el in layout.keyed(rs, getattr(shape, field), shape.width):
                if service is not None and not belongs(el.comment, service):
                    continue
                fk = (family, *front)
                fe = found.get(fk) or FrontendReport(
                    ref=el.comment,
                    family=family,
                    frontend=layout.frontend(front),
                    kind=_kind(rs, fk[2]),
                    programmed=True,
                )
                value = el.value
                update = (
                    {"dispatch": value.chain if isinstance(value, Verdict) else None}
                    if field == "dispatch"
                    else {"no_endpoint": _verdict_word(value)}
                )
                found[fk] = dataclasses.replace(fe, **update)
    if not found:
        return []
    wanted = {fk[1:] for fk in found}
    targets = {
        name: layout.targets(rs, name, shape.width, wanted)
        for shape in SHAPES
        for name in (shape.backends, shape.local)
    }
    return [_with_endpoints(rs, fe, targets) for fe in found.values()]


def _with_endpoints(
    rs: Ruleset,
    fe: FrontendReport,
    targets: Mapping[str, Mapping[layout.FrontKey, tuple[Target, ...]]],
) -> FrontendReport:
    shape = layout.NODEPORT if fe.address is None else layout.ADDRESS
    front = (fe.proto, fe.address, fe.port)
    allowed = _allowed(rs, fe)
    endpoints = targets[shape.backends].get(front, ())
    local = targets[shape.local].get(front, ())
    if fe.dispatch is not None and not endpoints:
        endpoints = dnat_targets(rs, fe.dispatch)
    if fe.dispatch is not None and not local:
        local = _affinity_local_targets(rs, fe.dispatch)
    return dataclasses.replace(
        fe,
        algorithm="" if fe.dispatch is None else _algorithm(rs, fe.dispatch),
        endpoints=endpoints,
        local_endpoints=local,
        allowed=allowed,
        kind="load-balancer" if allowed is not None and fe.kind == "external" else fe.kind,
    )


def _affinity_local_targets(rs: Ruleset, dispatch: str) -> tuple[Target, ...]:
    """The local endpoints of a ClientIP-affinity port's Local-policy external chain: those
    of its ``local-…`` chain (same hash and text as ``external-…``), which outside clients
    reach; none for any other chain. Without this an ``externalTrafficPolicy: Local`` port
    with affinity showed "no backends" while its local pods served traffic."""
    if not dispatch.startswith("external-"):
        return ()
    local = "local-" + dispatch.removeprefix("external-")
    referenced = {
        e.chain for rule in rs.rules.get(dispatch, []) for e in rule.exprs if isinstance(e, Verdict)
    }
    return dnat_targets(rs, local) if local in referenced else ()


def service_rules(rulesets: Iterable[Ruleset], frontends: Iterable[FrontendReport]) -> ServiceRules:
    """The elements of ``frontends`` and the chains they lead to, rendered per family."""
    fronts = tuple(frontends)
    keys = {fe.key for fe in fronts}
    eps = {addr for fe in fronts for addr, _ in (*fe.endpoints, *fe.local_endpoints)}
    cips = {fe.address for fe in fronts if fe.kind == "cluster-ip"}
    elements: list[ElementLine] = []
    chains: list[ChainText] = []
    counters = undecoded = 0
    for rs in rulesets:
        family = rs.table.family
        start: list[str] = []
        for set_name, els in rs.elements.items():
            s = rs.sets[set_name]
            for key in sorted(els, key=key_order):
                el = els[key]
                fk = element_frontend(family, set_name, key)
                mine = (
                    fk in keys
                    or (set_name in (n.CLUSTER_IPS, n.AFFINITY_ADDRESSES) and key[0] in cips)
                    or (set_name == n.HAIRPIN and key[0] in eps)
                )
                if not mine:
                    continue
                elements.append(
                    ElementLine(family=family, set=set_name, text=render_element(el, s))
                )
                if isinstance(el.value, Verdict) and el.value.chain is not None:
                    start.append(el.value.chain)
        chains.extend(_chains(rs, start))
        all_rules = [r for rules in rs.rules.values() for r in rules]
        counters += sum(1 for r in all_rules if any(isinstance(e, Counter) for e in r.exprs))
        undecoded += sum(1 for r in all_rules if not r.exprs)
    return ServiceRules(
        frontends=fronts,
        elements=tuple(elements),
        chains=tuple(chains),
        counter_rules=counters,
        undecoded_rules=undecoded,
    )


def _algorithm(rs: Ruleset, chain: str) -> str:
    """How the chains below a dispatch choose: the first choice they make names it."""
    for name in closure(rs, [chain]):
        for rule in rs.rules.get(name, []):
            for e in rule.exprs:
                if isinstance(e, SetUpdate) or (isinstance(e, DnatMap) and learned_map(rs, e.map)):
                    return "ClientIP affinity (a new client: random)"
                if not isinstance(e, DnatMap):
                    continue
                for sel in e.key:
                    if isinstance(sel, Jhash):
                        hashed = " . ".join(f.text for f in sel.key)
                        return (
                            f"consistent-hash (jhash {hashed} mod {sel.modulus} "
                            f"seed 0x{sel.seed:x})"
                        )
                    if isinstance(sel, Numgen) and sel.kind is NumgenKind.INC:
                        return "round-robin"
    return "random"


def learned_map(rs: Ruleset, name: str) -> bool:
    """Whether ``name`` is a map the packet path fills (ClientIP affinity's clients map)."""
    s = rs.sets.get(name)
    return s is not None and bool(s.flags & SetFlag.EVAL)


def _chains(rs: Ruleset, start: list[str]) -> list[ChainText]:
    """The chains ``start`` leads to, rendered."""
    out = []
    for name in closure(rs, start):
        rules = rs.rules.get(name, [])
        lines = render_chain(rs.chains[name], rules, rs.table.family)
        count = sum(1 for r in rules if any(isinstance(e, Counter) for e in r.exprs))
        out.append(
            ChainText(
                family=rs.table.family,
                name=name,
                lines=tuple(line.replace("\t", "  ") for line in lines),
                counters=count,
            )
        )
    return out
