"""``nlproxy explain``: why does my Service not work? Everything about one Service, joined.

Sits at the end of the flow, beside ``rules``, ``conntrack`` and ``inspect``, and only reads:
the Service and its EndpointSlices (from a manifests directory, or recovered from the
programmed maps when a node has no API access; ``manifests.py``), the elements and
chains programmed for it (read back from the kernel; ``rules.py``), its conntrack flows,
the inspector's verdict per endpoint, its frontends' packet and byte counts when ``run
--service-counters`` counts them, and, with a source address, a trace of a new connection
through the programmed rules (``trace.py``). It never changes rules, flows or routes,
and never execs anything. Rendering is ``explain_render.py``'s.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import ip_address
from pathlib import Path

from nlproxy.cluster.manifests import load_manifests
from nlproxy.cluster.model import ServiceKey
from nlproxy.conntrack.kernel import Conntrack, Flow, FlowFilter
from nlproxy.errors import ConfigError
from nlproxy.inspect.classify import Reachability, classify
from nlproxy.inspect.foreign import Leftovers, find
from nlproxy.inspect.rtnl import interface_addresses, interface_towards
from nlproxy.nft.counters import read_counters
from nlproxy.nft.ir import FAMILIES, Family, IPAddress, Ruleset, Set
from nlproxy.operate.manifests import ServiceFacts, service_facts
from nlproxy.operate.programmed import (
    FrontendReport,
    FrontKey,
    ServiceRules,
    kernel_frontends,
    service_rules,
)
from nlproxy.operate.rules import programmed
from nlproxy.operate.status import (
    Port,
    Programming,
    StatusError,
    from_samples,
    programming,
    scrape,
)
from nlproxy.operate.trace import TraceRow, nodeport_addresses, trace_frontends
from nlproxy.proxy import naming as n
from nlproxy.proxy.layout import proto_name
from nlproxy.proxy.skeleton import counter_sets

FLOWS_SHOWN = 5
"""Flows listed per frontend; all of them are counted."""
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def parse_service_key(text: str) -> ServiceKey:
    """``NS/NAME`` as a key.

    Raises:
        ConfigError: not ``NAMESPACE/NAME`` with DNS-style names.
    """
    ns, sep, name = text.partition("/")
    if not sep or not _NAME.fullmatch(ns) or not _NAME.fullmatch(name):
        raise ConfigError(f"service {text!r}", "is not NAMESPACE/NAME (lowercase DNS names)")
    return ServiceKey(namespace=ns, name=name)


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowGroup:
    """The conntrack flows to one frontend: how many, and the first few."""

    frontend: FrontendReport
    count: int
    flows: tuple[Flow, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointRow:
    frontends: tuple[str, ...]
    address: IPAddress
    port: int
    reach: Reachability


@dataclass(frozen=True, slots=True, kw_only=True)
class FrontendCount:
    """What ``--service-counters`` counted for one frontend since its element was created."""

    frontend: FrontendReport
    packets: int
    bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """The whole answer for one Service; ``problems`` empty means it works (exit 0).

    ``counts``: per programmed frontend, its service counters; None when they are off.
    """

    service: ServiceKey
    source: str
    facts: ServiceFacts | None
    rules: ServiceRules
    flows: tuple[FlowGroup, ...]
    endpoints: tuple[EndpointRow, ...]
    src: IPAddress | None
    traces: tuple[TraceRow, ...]
    problems: tuple[str, ...]
    counts: tuple[FrontendCount, ...] | None = None
    latency: Latency | None = None
    """Its last change's programming latency, as the running daemon reports it; None when no
    daemon was asked."""
    beside: tuple[str, ...] = ()
    """Another proxy's rules the daemon says it runs beside as a canary
    (``nlproxy_beside_proxy_tables``): expected there, not problems."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Latency:
    """What the daemon at ``asked`` (its metrics port) says of the Service's last change:
    ``last`` None when it does not answer, or has programmed no change of it."""

    asked: str
    answered: bool
    last: Programming | None


def explain(
    service: str,
    *,
    netns: str | None = None,
    port: str | None = None,
    src: str | None = None,
    manifests: Path | None = None,
    metrics: Port | None = None,
) -> Report:
    """Build the report for ``service`` (``NS/NAME``) on this node (or in ``netns``).

    Args:
        metrics: ask the daemon's metrics port how long the Service's last change took to
            program, and which proxy it runs beside as a canary; None: do not ask.
        port: only the service ports whose name or number (service or node port) is this.
        src: trace a new connection from this address to each frontend.
        manifests: read the Service and slices from this directory, not only the kernel.

    Raises:
        ConfigError: a bad ``NS/NAME``, ``--from`` or ``--port``, a manifests directory that
            cannot be read, or a Service that is neither programmed nor in the manifests.
        NlproxyError: the kernel refused a read-back, conntrack or rtnetlink dump (each
            names what it was reading).
    """
    key = parse_service_key(service)
    source = _parse_ip(src) if src is not None else None
    rulesets = {rs.table.family: rs for rs in programmed(FAMILIES, netns)}
    facts = _facts(manifests, key)
    frontends = _join(rulesets.values(), facts, str(key))
    if not frontends and (facts is None or facts.status == "absent"):
        where = f"nor defined in {manifests}" if manifests else "(no --manifests given)"
        raise ConfigError(f"service {key}", f"unknown: nothing is programmed for it {where}")
    frontends = _only_port(frontends, port, key)
    local = list(interface_addresses(netns))  # what ``fib … type local`` sees
    flows = _flows(netns, rulesets, frontends, local)
    endpoints = _endpoints(netns, frontends)
    foreign, beside = foreign_report(netns, metrics)
    traces = (
        trace_frontends(rulesets, frontends, source, local, interface_towards(source, netns))
        if source is not None
        else []
    )
    return Report(
        service=key,
        source=f"manifests {manifests}" if manifests else "kernel (recovered from the maps)",
        facts=facts,
        rules=service_rules(rulesets.values(), frontends),
        flows=tuple(flows),
        endpoints=tuple(endpoints),
        src=source,
        traces=tuple(traces),
        problems=(
            *_problems(facts, frontends, endpoints, traces, source),
            *_nodeport_gaps(rulesets, frontends),
            *foreign,
        ),
        counts=_counts(netns, rulesets, frontends),
        latency=None if metrics is None else _latency(metrics, netns, key),
        beside=beside,
    )


def _latency(metrics: Port, netns: str | None, key: ServiceKey) -> Latency:
    """The daemon's last programming latency of ``key`` (a short wait: it is on this node)."""
    known = programming(metrics, netns=netns, timeout=2.0, service=str(key))
    last = next((p for p in known or () if p.service == str(key)), None)
    return Latency(asked=metrics.address, answered=known is not None, last=last)


def _counts(
    netns: str | None, rulesets: dict[Family, Ruleset], frontends: Sequence[FrontendReport]
) -> tuple[FrontendCount, ...] | None:
    """The frontends' service counters, read from the kernel; None when counting is off."""
    on = [fam for fam, rs in rulesets.items() if _counting(rs)]
    if not on:
        return None
    readings = {fam: read_counters(fam, n.TABLE, counter_sets(fam), netns=netns) for fam in on}
    out = []
    for fe in frontends:
        sets = readings.get(fe.family, {})
        if fe.address is None:
            got = sets.get(n.NODEPORT_COUNTERS, {}).get((fe.proto, fe.port))
        else:
            got = sets.get(n.SERVICE_COUNTERS, {}).get((fe.address, fe.proto, fe.port))
        if got is not None:
            out.append(FrontendCount(frontend=fe, packets=got[0], bytes=got[1]))
    return tuple(out)


def _counting(rs: Ruleset) -> bool:
    s = rs.sets.get(n.SERVICE_COUNTERS)
    return isinstance(s, Set) and s.counter


def _parse_ip(text: str) -> IPAddress:
    try:
        return ip_address(text)
    except ValueError as exc:
        raise ConfigError("--from", f"{text!r} is not an IP address") from exc


def _facts(manifests: Path | None, key: ServiceKey) -> ServiceFacts | None:
    if manifests is None:
        return None
    if not manifests.is_dir():
        raise ConfigError("--manifests", f"{manifests} is not a directory")
    return service_facts(load_manifests(manifests), key)


def _join(
    rulesets: Iterable[Ruleset], facts: ServiceFacts | None, service: str
) -> list[FrontendReport]:
    """Programmed frontends, plus those the manifests ask for that are not programmed."""
    found: dict[FrontKey, FrontendReport] = {}
    for rs in rulesets:
        for fe in kernel_frontends(rs, service):
            found[fe.key] = fe
    for want in facts.frontends if facts is not None else ():
        have = found.get(want.key)
        kind = want.kind
        found[want.key] = dataclasses.replace(have, kind=kind) if have is not None else want
    return sorted(found.values(), key=_order)


def _order(fe: FrontendReport) -> tuple[str, int, int, str]:
    kinds = ("cluster-ip", "external-ip", "load-balancer", "external", "node-port")
    return (fe.ref, fe.family is Family.IP6, kinds.index(fe.kind), str(fe.address))


def _only_port(
    frontends: list[FrontendReport], port: str | None, key: ServiceKey
) -> list[FrontendReport]:
    if port is None:
        return frontends
    refs = {fe.ref for fe in frontends if port in (fe.port_name, str(fe.port))}
    if not refs:
        names = sorted({f"{fe.port_name or '-'} ({fe.port})" for fe in frontends})
        raise ConfigError("--port", f"{port!r} is no port of {key}: {', '.join(names)}")
    return [fe for fe in frontends if fe.ref in refs]


def _flows(
    netns: str | None,
    rulesets: dict[Family, Ruleset],
    frontends: Sequence[FrontendReport],
    local: Sequence[IPAddress],
) -> list[FlowGroup]:
    ct = Conntrack(netns)
    out = []
    for fe in frontends:
        dsts = (
            [fe.address]
            if fe.address is not None
            else nodeport_addresses(rulesets.get(fe.family), fe.family, local)
        )
        count, shown = 0, list[Flow]()
        for dst in dsts:
            flt = FlowFilter(proto=proto_name(fe.proto).lower(), orig_dst=dst, orig_dport=fe.port)
            for flow in ct.list(flt):
                count += 1
                if len(shown) < FLOWS_SHOWN:
                    shown.append(flow)
        out.append(FlowGroup(frontend=fe, count=count, flows=tuple(shown)))
    return out


def _endpoints(netns: str | None, frontends: Sequence[FrontendReport]) -> list[EndpointRow]:
    by_target: dict[tuple[IPAddress, int], list[str]] = {}
    for fe in frontends:
        for target in dict.fromkeys((*fe.endpoints, *fe.local_endpoints)):
            by_target.setdefault(target, []).append(fe.label)
    reach = classify([addr for addr, _ in by_target], netns=netns)
    ordered = sorted(by_target, key=lambda t: (t[0].version, int(t[0]), t[1]))
    return [
        EndpointRow(frontends=tuple(by_target[t]), address=t[0], port=t[1], reach=reach[t[0]])
        for t in ordered
    ]


def _problems(
    facts: ServiceFacts | None,
    frontends: Sequence[FrontendReport],
    endpoints: Sequence[EndpointRow],
    traces: Sequence[TraceRow],
    src: IPAddress | None,
) -> list[str]:
    out = list(facts.problems) if facts is not None else []
    if not any(fe.programmed for fe in frontends):
        out.append("not programmed at all: no element of the service is in the kernel")
    for fe in frontends:
        where = f"{fe.ref} {fe.label}"
        if not fe.programmed:
            out.append(f"{where}: not programmed")
        elif fe.no_endpoint == "reject":
            out.append(f"{where}: not programmed: no endpoints -> reject")
        elif fe.no_endpoint == "drop":
            out.append(f"{where}: no usable endpoints for its traffic policy -> drop")
    out.extend(
        f"endpoint {_hostport(e.address, e.port)} unreachable: {e.reach.reason}"
        for e in endpoints
        if not e.reach.reachable
    )
    out.extend(
        f"{t.frontend.ref} {t.frontend.label} from {src}: {t.verdict}: {t.diagnosis}"
        for t in traces
        if not t.ok
    )
    return out


def foreign_rules(found: Leftovers, beside: Collection[str] = ()) -> tuple[list[str], list[str]]:
    """Another proxy's rules as (problems, expected). At the same hooks and priority as
    nlproxy's, the older table's DNAT wins for new connections, and IPVS takes connections to
    its virtual servers before nftables sees them, whatever ``explain`` finds in nlproxy's: a
    problem. But a table in ``beside`` (``family table``: those the daemon says it runs beside
    as a canary, serving only its own Services) is expected there: its line is in the second
    list. So are the IPVS virtual servers, ipsets and device when the daemon runs beside
    KUBE-* chains in an iptables-nft table: they are that proxy's own in IPVS mode, which
    writes those chains too (beside an nftables-mode proxy they are another's). Pure."""
    problems, expected = [], []
    modes = {ft.mode for ft in found.tables if str(ft) in beside}
    for name, mode, describe, _ in found.items():
        if name in beside or (mode == "ipvs" and "iptables-nft" in modes):
            expected.append(describe)
            continue
        problems.append(
            f"another proxy's rules: {describe}: new connections to the addresses it also "
            "handles may follow its rules, not nlproxy's ('nlproxy cleanup --kube-proxy' "
            "removes them; docs/migrating.md)"
        )
    return problems, expected


def foreign_report(netns: str | None, metrics: Port | None) -> tuple[list[str], tuple[str, ...]]:
    """Another proxy's rules on the node: (problems, those the daemon at ``metrics`` runs
    beside as a canary). The daemon is asked only when there are tables to ask about."""
    found = find(netns)
    beside = _beside(metrics, netns) if metrics is not None and found.tables else frozenset()
    problems, expected = foreign_rules(found, beside)
    return problems, tuple(expected)


def _beside(metrics: Port, netns: str | None) -> frozenset[str]:
    """The tables (``family table``) the daemon at ``metrics`` runs beside as a canary, read
    from its ``/metrics`` as ``status`` reads them; empty when it is no canary or does not
    answer (a short wait: it is on this node)."""
    try:
        samples = scrape(metrics, netns=netns, timeout=2.0)
    except StatusError:
        return frozenset()
    said = from_samples(samples, metrics, metrics, code=None, body={}).beside_tables
    return frozenset(f"{family} {table}" for family, table in said or ())


def _nodeport_gaps(
    rulesets: Mapping[Family, Ruleset], frontends: Sequence[FrontendReport]
) -> list[str]:
    """A family whose programmed ``nodeport-ips`` set is empty refuses every NodePort."""
    out = []
    for family, rs in rulesets.items():
        empty = n.NODEPORT_IPS in rs.sets and not rs.elements.get(n.NODEPORT_IPS)
        if empty and any(fe.kind == "node-port" and fe.family is family for fe in frontends):
            v = 4 if family is Family.IP else 6
            out.append(
                f"IPv{v} NodePorts are refused: nodePortAddresses selects no IPv{v} address of "
                "this node (the nodeport-ips set is empty; the log names what was looked at)"
            )
    return out


def _hostport(addr: IPAddress, port: int) -> str:
    return f"[{addr}]:{port}" if addr.version == 6 else f"{addr}:{port}"
