"""``nlproxy compare``: kube-proxy's live rules against nlproxy's plan for the same cluster.

The certificate before a switch: for every Service port, family, frontend (ClusterIP, NodePort
on the node's address, external and load-balancer IPs) and kind of client (a pod on this node,
a pod on another node, the node itself, a client outside the cluster; and for a firewalled
load balancer, a client inside its ``loadBalancerSourceRanges``), one new connection is traced
(``proxy/tracer.py``) through kube-proxy's ruleset as the kernel holds it
(``inspect/kubeproxy.py`` for its nftables mode, ``inspect/iptables.py`` for its iptables
mode) and through nlproxy's plan of the same objects (``proxy/planner``), and the outcomes are
compared: which endpoints can answer, whether the source is masqueraded, and whether it is
accepted, rejected or dropped.

Where they differ because nlproxy is meant to, the difference is named by design, with the
reason (:func:`by_design`); every other difference is reported as one an operator must look at.
The tracing and the comparison are pure; :func:`read_kube` is the one read of the kernel.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from ipaddress import ip_address

from nlproxy.cluster.model import ClusterSnapshot, IPAddress, IPNetwork, Protocol, Service
from nlproxy.nft.ir import (
    FAMILIES,
    Cmp,
    Family,
    Field,
    MarkSet,
    Rule,
    Ruleset,
    Table,
    Verdict,
    VerdictKind,
)
from nlproxy.operate.manifests import service_frontends
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.tracer import Tracer, TraceResult

OUTSIDE = {Family.IP: ip_address("192.0.2.77"), Family.IP6: ip_address("2001:db8::77")}
"""The outside client (documentation ranges: never a pod, node or Service address)."""
_KINDS = {
    "cluster-ip": "ClusterIP",
    "node-port": "NodePort",
    "external-ip": "external IP",
    "load-balancer": "load-balancer IP",
}
_VERDICTS = {"DROP": "drops it", "REJECT": "rejects it"}
_UNSERVED = " (port not served)"
_NO_SERVICE = "(no Service)"


@dataclass(frozen=True, slots=True, kw_only=True)
class Client:
    """A kind of client and the address it sends from."""

    kind: str
    addr: IPAddress


@dataclass(frozen=True, slots=True, kw_only=True)
class Probe:
    """One new connection: a client to one frontend of a Service port."""

    ref: str
    family: Family
    kind: str
    proto: Protocol
    dst: IPAddress
    port: int
    client: Client

    def __str__(self) -> str:
        where = f"[{self.dst}]" if self.dst.version == 6 else str(self.dst)
        return (
            f"{self.ref} from {self.client.kind} ({self.client.addr}) to "
            f"{_KINDS.get(self.kind, self.kind)} {where}:{self.port}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """A probe traced through both rulesets; ``why`` says why a difference is by design."""

    probe: Probe
    kube: TraceResult
    ours: TraceResult
    why: str = ""
    notes: tuple[str, ...] = ()
    """What the Service's EndpointSlices say of each endpoint only one of them sends to."""

    @property
    def differs(self) -> bool:
        return self.kube != self.ours

    def words(self) -> str:
        """The difference as an operator reads it."""
        k, o = self.kube, self.ours
        parts: list[str] = []
        if k.verdict != o.verdict or k.endpoints != o.endpoints:
            parts.append(f"kube-proxy {_fate(k)}, nlproxy {_fate(o)}")
        if k.masquerade != o.masquerade:
            who, other = ("kube-proxy", "nlproxy") if k.masquerade else ("nlproxy", "kube-proxy")
            parts.append(f"{who} masquerades the source, {other} keeps it")
        if self.notes:
            parts[0] += f" ({'; '.join(self.notes)})"
        text = f"{self.probe}: {'; '.join(parts)}"
        return f"{text} (by design: {self.why})" if self.why else text


def _fate(r: TraceResult) -> str:
    if r.verdict != "ACCEPT":
        return _VERDICTS[r.verdict]
    if not r.endpoints:
        return "lets it through to the address itself (not proxied)"
    n = len(r.endpoints)
    return f"sends to {n} endpoint{'s' if n != 1 else ''} ({', '.join(sorted(r.endpoints))})"


# ---------------------------------------------------------------------------------------------
# Probes


def node_addresses(snapshot: ClusterSnapshot, config: ProxyConfig) -> tuple[IPAddress, ...]:
    """This node's addresses, as the planner takes them (``--node-ip``, else the Node's)."""
    if config.node_ips:
        return tuple(config.node_ips)
    return snapshot.node.addresses if snapshot.node is not None else ()


def clients(snapshot: ClusterSnapshot, config: ProxyConfig, family: Family) -> list[Client]:
    """The kinds of client of ``family`` this node can tell apart, each with an address."""
    version = 4 if family is Family.IP else 6
    here = [n for n in (snapshot.node.pod_cidrs if snapshot.node else ()) if n.version == version]
    cluster = [n for n in config.cluster_cidrs if n.version == version]
    out: list[Client] = []
    if here:
        out.append(Client(kind="a pod on this node", addr=_inside(here[0])))
    elsewhere = next((a for n in cluster for a in _candidates(n) if not _within(a, here)), None)
    if elsewhere is not None:
        out.append(Client(kind="a pod on another node", addr=elsewhere))
    node = next((a for a in node_addresses(snapshot, config) if a.version == version), None)
    if node is not None:
        out.append(Client(kind="the node itself", addr=node))
    out.append(Client(kind="a client outside the cluster", addr=OUTSIDE[family]))
    return out


def _inside(net: IPNetwork) -> IPAddress:
    return net[-2] if net.num_addresses > 2 else net[0]


def _candidates(net: IPNetwork) -> list[IPAddress]:
    return [_inside(net), net[net.num_addresses // 2 + 1], net[1]]


def _within(addr: IPAddress, nets: Iterable[IPNetwork]) -> bool:
    return any(addr in n for n in nets)


def probes(snapshot: ClusterSnapshot, config: ProxyConfig) -> list[Probe]:
    """Every Service port, family, frontend and kind of client of ``snapshot`` on this node."""
    nodes = node_addresses(snapshot, config)
    out: list[Probe] = []
    for key in sorted(snapshot.services, key=str):
        svc = snapshot.services[key]
        for fr in service_frontends(svc):
            dst = fr.frontend.addr
            if dst is None:  # a NodePort: on the node's primary address of the family
                dst = next((a for a in nodes if _family(a) is fr.family), None)
                if dst is None:
                    continue
            who = clients(snapshot, config, fr.family)
            if fr.kind == "load-balancer":
                who += _allowed(svc, fr.family)
            proto = Protocol(fr.frontend.proto.upper())
            out += [
                Probe(
                    ref=fr.ref,
                    family=fr.family,
                    kind=fr.kind,
                    proto=proto,
                    dst=dst,
                    port=fr.frontend.port,
                    client=c,
                )
                for c in who
            ]
    return out


def edge_probes(snapshot: ClusterSnapshot, config: ProxyConfig) -> list[Probe]:
    """Connections no Service port answers: a port a ClusterIP does not serve, and an address
    of a service range no Service holds (both rejected or dropped, by kube-proxy as by nlproxy),
    each from a pod on this node or, without pod ranges, from outside."""
    out: list[Probe] = []
    taken = {ip for svc in snapshot.services.values() for ip in svc.cluster_ips}
    for family in FAMILIES:
        version = 4 if family is Family.IP else 6
        client = clients(snapshot, config, family)[0]
        for key in sorted(snapshot.services, key=str):
            svc = snapshot.services[key]
            ip = next((a for a in svc.cluster_ips if a.version == version), None)
            served = {p.port for p in svc.ports if p.ref.protocol is Protocol.TCP}
            unserved = next(n for n in (1, 2, 3, 4) if n not in served)
            if ip is not None:
                out.append(Probe(ref=f"{key}{_UNSERVED}", family=family,
                                 kind="cluster-ip", proto=Protocol.TCP, dst=ip, port=unserved,
                                 client=client))  # fmt: skip
        ranges = [n for n in config.service_cidrs if n.version == version]
        ranges += [n for sc in snapshot.service_cidrs for n in sc.cidrs if n.version == version]
        free = next((a for n in ranges for a in _candidates(n) if a not in taken), None)
        if free is not None:
            out.append(Probe(ref=_NO_SERVICE, family=family, kind="cluster-ip",
                             proto=Protocol.TCP, dst=free, port=80, client=client))  # fmt: skip
    return out


def _allowed(svc: Service, family: Family) -> list[Client]:
    version = 4 if family is Family.IP else 6
    nets = [n for n in svc.load_balancer_source_ranges if n.version == version]
    if not nets:
        return []
    return [Client(kind="an outside client in loadBalancerSourceRanges", addr=_inside(nets[0]))]


def _family(addr: IPAddress) -> Family:
    return Family.IP if addr.version == 4 else Family.IP6


# ---------------------------------------------------------------------------------------------
# Comparison


def compare(
    kube: Mapping[Family, Ruleset | None],
    ours: Mapping[Family, Ruleset],
    snapshot: ClusterSnapshot,
    config: ProxyConfig,
) -> list[Outcome]:
    """Every probe of ``snapshot`` traced through kube-proxy's tables and nlproxy's plan."""
    local = node_addresses(snapshot, config)
    masquerade_all = {f: rs is not None and masquerades_all(rs) for f, rs in kube.items()}
    iptables = {f: rs is not None and mode(rs) == "iptables" for f, rs in kube.items()}
    kube_tracers: dict[Family, Tracer] = {}
    our_tracers: dict[Family, Tracer] = {}
    out: list[Outcome] = []
    for p in [*probes(snapshot, config), *edge_probes(snapshot, config)]:
        if p.family not in kube_tracers:  # each ruleset indexed once, not once per probe
            theirs = kube.get(p.family) or Ruleset(table=Table(family=p.family, name="kube-proxy"))
            kube_tracers[p.family] = Tracer(theirs, local)
            our_tracers[p.family] = Tracer(ours[p.family], local)
        k = kube_tracers[p.family].trace(p.client.addr, p.proto, p.dst, p.port)
        o = our_tracers[p.family].trace(p.client.addr, p.proto, p.dst, p.port)
        outcome = Outcome(probe=p, kube=k, ours=o)
        if outcome.differs:
            why = by_design(
                outcome, masquerade_all.get(p.family, False), config,
                iptables=iptables.get(p.family, False),
            )  # fmt: skip
            both = k.verdict == o.verdict == "ACCEPT"
            notes = endpoint_notes(snapshot, p, k.endpoints ^ o.endpoints) if both else ()
            outcome = Outcome(probe=p, kube=k, ours=o, why=why, notes=notes)
        out.append(outcome)
    return out


def endpoint_notes(
    snapshot: ClusterSnapshot, probe: Probe, endpoints: Iterable[str]
) -> tuple[str, ...]:
    """What the Service's EndpointSlices say of each of ``endpoints`` (``ip:port``)."""
    namespace, _, rest = probe.ref.partition("/")
    name = rest.split(":", 1)[0].split(" ", 1)[0]
    found = {
        ep.ip: ep
        for key, slices in snapshot.slices.items()
        if (key.namespace, key.name) == (namespace, name)
        for sl in slices
        for ep in sl.endpoints
    }
    notes = []
    for text in sorted(endpoints):
        addr = ip_address(text.rsplit(":", 1)[0].strip("[]"))
        ep = found.get(addr)
        if ep is None:
            notes.append(f"{addr} is in none of the Service's EndpointSlices")
            continue
        state = "ready" if ep.ready else "terminating" if ep.terminating else "not ready"
        if ep.ready and not ep.serving:
            state = "ready but not serving"
        where = f"on node {ep.node_name}" if ep.node_name else "on no node"
        notes.append(f"{addr} is {state}, {where}")
    return tuple(notes)


def mode(rs: Ruleset) -> str:
    """Which of kube-proxy's modes ``rs`` was read from: "nftables" or "iptables"."""
    from nlproxy.inspect.iptables import NAME

    return "iptables" if rs.table.name == NAME else "nftables"


def masquerades_all(rs: Ruleset) -> bool:
    """Whether kube-proxy runs with ``--masquerade-all``: it marks every connection to a
    ClusterIP for masquerade, not only those from outside the cluster CIDR (nftables mode: in its
    ``services`` chain; iptables mode: in each ``KUBE-SVC-*`` chain's jump to
    ``KUBE-MARK-MASQ``)."""
    if mode(rs) == "iptables":
        marks = [
            rule
            for chain, rules in rs.rules.items()
            if chain.startswith(("nat/KUBE-SVC-", "nat/KUBE-SVL-"))
            for rule in rules
            if Verdict(VerdictKind.JUMP, "nat/KUBE-MARK-MASQ") in rule.exprs
        ]
        return bool(marks) and not any(_matches_source(r) for r in marks)
    for rule in rs.rules.get("services", ()):
        if any(isinstance(e, MarkSet) for e in rule.exprs):
            return not _matches_source(rule)
    return False


def _matches_source(rule: Rule) -> bool:
    return any(
        isinstance(e, Cmp) and e.left in (Field.IP_SADDR, Field.IP6_SADDR) for e in rule.exprs
    )


def by_design(
    outcome: Outcome, masquerade_all: bool, config: ProxyConfig, *, iptables: bool = False
) -> str:
    """Why nlproxy differs from kube-proxy here on purpose, or "" when it should not.

    ``iptables``: kube-proxy runs in iptables mode, which (unlike its nftables mode, whose
    ruleset nlproxy's follows) has no rule for addresses and ports of the service range that no
    Service port serves: such a connection is routed on, unproxied, where nlproxy refuses it.
    """
    k, o = outcome.kube, outcome.ours
    same_path = k.verdict == o.verdict and k.endpoints == o.endpoints
    if same_path and k.masquerade and not o.masquerade and masquerade_all:
        return (
            "kube-proxy runs with --masquerade-all; nlproxy has no such setting and masquerades "
            "ClusterIP traffic only from outside the cluster CIDR (--cluster-cidr)"
        )
    unproxied = k.verdict == "ACCEPT" and not k.endpoints and outcome.probe.kind == "cluster-ip"
    if iptables and unproxied and outcome.probe.ref.endswith(_UNSERVED) and o.verdict == "REJECT":
        return (
            "kube-proxy's iptables mode has no rule for a ClusterIP's unserved ports and routes "
            "the connection on; nlproxy rejects it, as kube-proxy's nftables mode does"
        )
    if iptables and unproxied and outcome.probe.ref == _NO_SERVICE and o.verdict == "DROP":
        return (
            "kube-proxy's iptables mode has no rule for service-range addresses no Service holds "
            "and routes the connection on; nlproxy drops it, as kube-proxy's nftables mode does"
        )
    return ""


def why_no_table(netns: str | None) -> str:
    """Why there are no kube-proxy rules to compare with: kube-proxy in IPVS mode (or its
    iptables chains in the legacy backend, out of netlink's reach), or no kube-proxy at all."""
    from nlproxy.inspect.foreign import detect

    others = [t for t in detect(netns) if t.mode != "nftables"]
    if others:
        found = "; ".join(t.describe for t in others)
        return (
            f"kube-proxy's rules on this node are not in a mode compare reads ({found}); "
            "compare reads kube-proxy's nftables mode and its iptables mode through iptables-nft"
        )
    return "no kube-proxy rules on this node (neither its nftables tables nor its iptables chains)"


def read_kube(netns: str | None) -> dict[Family, Ruleset | None]:
    """kube-proxy's rules on this node, per family (None for a family without them): its
    nftables table, else its iptables-mode chains in the iptables-nft tables.

    Raises:
        KubeProxyRulesetError: a rule that cannot be interpreted.
        ReadbackError: the ruleset kept changing while it was read.
    """
    from nlproxy.inspect.iptables import read_kube_proxy_iptables
    from nlproxy.inspect.kubeproxy import read_kube_proxy

    out: dict[Family, Ruleset | None] = {}
    for f in FAMILIES:
        rs = read_kube_proxy(f, netns)
        out[f] = rs if rs is not None else read_kube_proxy_iptables(f, netns)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Certificate:
    """The comparison: every outcome, and what the tables said."""

    outcomes: tuple[Outcome, ...]
    kube_tables: tuple[Family, ...]
    kube_mode: str = "nftables"
    """The mode kube-proxy's rules were read in: "nftables" or "iptables" (through iptables-nft)."""

    @property
    def differences(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.differs and not o.why]

    @property
    def designed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.differs and o.why]

    @property
    def frontends(self) -> int:
        return len({(o.probe.ref, o.probe.dst, o.probe.port) for o in self.outcomes})

    def summary(self) -> str:
        tables = ", ".join(f"{f} kube-proxy" for f in self.kube_tables) or "no kube-proxy table"
        if self.kube_mode == "iptables" and self.kube_tables:
            families = ", ".join(str(f) for f in self.kube_tables)
            tables = f"kube-proxy's iptables mode: {families}"
        head = f"{len(self.outcomes)} connections to {self.frontends} frontends compared ({tables})"
        if self.differences:
            return f"{head}: {len(self.differences)} differ" + (
                f", {len(self.designed)} more by design" if self.designed else ""
            )
        if self.designed:
            return f"{head}: equivalent but for {len(self.designed)} differences by design"
        return f"{head}: equivalent"


def render_text(cert: Certificate) -> str:
    lines = [f"differs: {o.words()}" for o in cert.differences]
    lines += [f"by design: {o.words()}" for o in cert.designed]
    lines.append(cert.summary())
    return "\n".join(lines) + "\n"


def to_json(cert: Certificate) -> dict[str, object]:
    def result(r: TraceResult) -> dict[str, object]:
        return {
            "verdict": r.verdict,
            "endpoints": sorted(r.endpoints),
            "masquerade": r.masquerade,
        }

    return {
        "equivalent": not cert.differences,
        "summary": cert.summary(),
        "kube_proxy_tables": [str(f) for f in cert.kube_tables],
        "kube_proxy_mode": cert.kube_mode,
        "outcomes": [
            {
                "service": o.probe.ref,
                "family": str(o.probe.family),
                "frontend": o.probe.kind,
                "address": str(o.probe.dst),
                "port": o.probe.port,
                "protocol": str(o.probe.proto),
                "client": o.probe.client.kind,
                "source": str(o.probe.client.addr),
                "kube_proxy": result(o.kube),
                "nlproxy": result(o.ours),
                "differs": o.differs,
                **({"by_design": o.why} if o.why else {}),
                **({"words": o.words()} if o.differs else {}),
            }
            for o in cert.outcomes
        ],
    }


def certify(
    kube: Mapping[Family, Ruleset | None],
    ours: Mapping[Family, Ruleset],
    snapshot: ClusterSnapshot,
    config: ProxyConfig,
) -> Certificate:
    """:func:`compare`, as a certificate."""
    found = [rs for rs in kube.values() if rs is not None]
    return Certificate(
        outcomes=tuple(compare(kube, ours, snapshot, config)),
        kube_tables=tuple(f for f, rs in kube.items() if rs is not None),
        kube_mode="iptables" if any(mode(rs) == "iptables" for rs in found) else "nftables",
    )
