"""``nlproxy explain`` output: a :class:`~nlproxy.operate.explain.Report` as headed text or one JSON
object.

The last step of ``explain``: sections in the order an operator asks the questions (what the
cluster says, what is programmed, counters, flows, endpoints, trace, programming latency, the
proxy a canary runs beside, verdict), columns aligned.
Pure: no I/O; it adds nothing the report does not hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nlproxy.conntrack.kernel import Flow
from nlproxy.nft.ir import IPAddress
from nlproxy.operate.explain import FLOWS_SHOWN, FlowGroup, Latency, Report
from nlproxy.operate.manifests import ServiceFacts
from nlproxy.operate.programmed import FrontendReport, ServiceRules
from nlproxy.operate.trace import TraceRow
from nlproxy.proxy import naming as n

INDENT = "  "


def table(rows: Sequence[Sequence[str]], indent: str = INDENT) -> list[str]:
    """Rows as aligned columns (the last column is not padded)."""
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return [
        (
            indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1]
        ).rstrip()
        for r in rows
    ]


def _hostport(addr: IPAddress, port: int) -> str:
    return f"[{addr}]:{port}" if addr.version == 6 else f"{addr}:{port}"


def _targets(fe: FrontendReport) -> str:
    eps = ", ".join(_hostport(a, p) for a, p in fe.endpoints) or "-"
    if fe.local_endpoints:
        eps += " (local: " + ", ".join(_hostport(a, p) for a, p in fe.local_endpoints) + ")"
    return eps


def _state(fe: FrontendReport) -> str:
    parts = []
    if fe.dispatch is not None:
        parts.append(f"goto {fe.dispatch}")
    if fe.no_endpoint is not None:
        parts.append(fe.no_endpoint)
    if fe.allowed is not None:
        parts.append("firewalled")
    return ", ".join(parts) or "not programmed"


def _service_section(report: Report) -> list[str]:
    out = [f"Service {report.service}", f"{INDENT}{'source':<16}{report.source}"]
    facts = report.facts
    if facts is None:
        out.append(f"{INDENT}(no --manifests: the Service is what the programmed maps say)")
        return out
    out.append(f"{INDENT}{'status':<16}{facts.status}")
    out.extend(f"{INDENT}{name:<16}{value}" for name, value in facts.fields)
    out.append("")
    out.append("EndpointSlices")
    if not facts.slices:
        out.append(f"{INDENT}(none)")
    for sl in facts.slices:
        if sl.status != "valid":
            out.append(f"{INDENT}{sl.name}  {sl.status}: {sl.problem}")
            continue
        out.append(f"{INDENT}{sl.name}  {sl.family}  ports {sl.ports or '-'}")
        out.extend(f"{INDENT * 2}{ep}" for ep in sl.endpoints or ("(no endpoints)",))
    return out


def _frontends_section(rules: ServiceRules) -> list[str]:
    rows = [("PORT", "FAMILY", "KIND", "FRONTEND", "PROGRAMMED", "ENDPOINTS")]
    rows += [
        (fe.ref, str(fe.family), fe.kind, fe.label, _state(fe), _targets(fe))
        for fe in rules.frontends
    ]
    out = ["Frontends", *table(rows)]
    chosen = dict.fromkeys((fe.ref, fe.algorithm) for fe in rules.frontends if fe.algorithm)
    out += [f"{INDENT}{ref} load balancing: {algorithm}" for ref, algorithm in chosen]
    for fe in rules.frontends:
        if fe.allowed is not None:
            ranges = ", ".join(str(r) for r in fe.allowed) or "none"
            out.append(f"{INDENT}{fe.label} allows sources {ranges}")
    return out


def _rules_section(rules: ServiceRules) -> list[str]:
    out = ["Rules (programmed)"]
    if not rules.elements:
        out.append(f"{INDENT}not programmed at all: no element of the service is in the kernel")
        return out
    last = None
    for el in rules.elements:
        if (el.family, el.set) != last:
            out.append(f"{INDENT}{el.family} {n.TABLE} map/set {el.set}")
            last = (el.family, el.set)
        out.append(f"{INDENT * 2}{el.text}")
    if not any(fe.dispatch for fe in rules.frontends):
        rejects = any(fe.no_endpoint == "reject" for fe in rules.frontends)
        why = "no endpoints -> reject" if rejects else "no usable endpoints -> drop"
        out.append(f"{INDENT}not programmed: {why} (no dispatch element)")
    last_family = None
    if rules.undecoded_rules:
        out.append(
            f"{INDENT}note: {rules.undecoded_rules} programmed rules could not be decoded; "
            "a trace treats them as matching nothing"
        )
    for ch in rules.chains:
        if ch.family != last_family:
            out.append(f"{INDENT}{ch.family} {n.TABLE} chains they lead to")
            last_family = ch.family
        out.extend(f"{INDENT}{line}" for line in ch.lines)
    return out


def _counters_section(report: Report) -> list[str]:
    rules = report.rules
    if not rules.counter_rules:
        out = [
            "Counters",
            f"{INDENT}rule counters off: the programmed rules carry no counter expressions",
        ]
    else:
        shown = [
            f"{c.family} chain {c.name}: {c.counters} rules" for c in rules.chains if c.counters
        ]
        out = [
            "Counters",
            f"{INDENT}on in {rules.counter_rules} rules; read-back does not carry their values "
            "(`nft list table` shows them)",
            *(f"{INDENT}{line}" for line in shown),
        ]
    if report.counts is None:
        return [*out, f"{INDENT}service counters off (`nlproxy run --service-counters` counts)"]
    rows = [("FRONTEND", "PORT", "PACKETS", "BYTES")]
    rows += [
        (c.frontend.label, c.frontend.ref, str(c.packets), str(c.bytes)) for c in report.counts
    ]
    return [
        *out,
        f"{INDENT}service counters (both directions, since each frontend's element was created):",
        *table(rows, INDENT * 2),
    ]


def _flow_line(flow: Flow) -> str:
    o, r = flow.orig, flow.reply
    answered = _hostport(r.src, r.sport)
    nat = "endpoint " + answered if (r.src, r.sport) != (o.dst, o.dport) else "not DNAT'd"
    timeout = f"  {flow.timeout}s" if flow.timeout is not None else ""
    return f"{_hostport(o.src, o.sport)} -> {_hostport(o.dst, o.dport)}  {nat}{timeout}"


def _conntrack_section(groups: Sequence[FlowGroup]) -> list[str]:
    out = ["Conntrack"]
    for g in groups:
        more = f" (first {FLOWS_SHOWN})" if g.count > len(g.flows) else ""
        out.append(f"{INDENT}{g.frontend.label}  flows: {g.count}{more}")
        out.extend(f"{INDENT * 2}{_flow_line(f)}" for f in g.flows)
    if not groups:
        out.append(f"{INDENT}(no frontends)")
    return out


def _endpoints_section(report: Report) -> list[str]:
    rows = [("ENDPOINT", "KIND", "REACHABLE", "REASON")]
    rows += [
        (
            _hostport(e.address, e.port),
            e.reach.kind,
            "yes" if e.reach.reachable else "NO",
            e.reach.reason,
        )
        for e in report.endpoints
    ]
    body = table(rows) if report.endpoints else [f"{INDENT}(no endpoints programmed)"]
    return ["Endpoints (inspector)", *body]


def _trace_section(report: Report) -> list[str]:
    rows = [("FRONTEND", "SENT TO", "VERDICT", "DNAT", "MASQ", "DIAGNOSIS")]
    rows += [
        (
            t.frontend.label,
            "-" if t.dst is None else str(t.dst),
            t.verdict,
            ", ".join(t.endpoints) or "-",
            "-" if t.verdict == "-" else "yes" if t.masquerade else "no",
            t.diagnosis or ("other family" if t.verdict == "-" and t.ok else "ok"),
        )
        for t in report.traces
    ]
    return [f"Trace from {report.src} (programmed rules)", *table(rows)]


def render_text(report: Report) -> str:
    """The report as headed, aligned sections."""
    sections = [
        _service_section(report),
        _frontends_section(report.rules),
        _rules_section(report.rules),
        _counters_section(report),
        _conntrack_section(report.flows),
        _endpoints_section(report),
    ]
    if report.src is not None:
        sections.append(_trace_section(report))
    if report.latency is not None:
        sections.append(["Programming", f"{INDENT}{_latency_text(report.latency)}"])
    if report.beside:
        sections.append(_beside_section(report.beside))
    verdict = ["Verdict"]
    if report.problems:
        verdict += [f"{INDENT}PROBLEM: {p}" for p in report.problems]
    elif report.src is not None:
        verdict.append(f"{INDENT}OK: reachable from {report.src} through every frontend")
    else:
        verdict.append(f"{INDENT}OK: every frontend has endpoints, every endpoint is reachable")
    sections.append(verdict)
    return "\n\n".join("\n".join(s) for s in sections) + "\n"


def _beside_section(beside: Sequence[str]) -> list[str]:
    """Another proxy's rules the daemon runs beside as a canary: expected, not a problem."""
    lines = ["Beside (canary)"]
    lines.append(f"{INDENT}the service proxy this canary runs beside (expected, left alone):")
    return lines + [f"{INDENT}{INDENT}{b}" for b in beside]


def _latency_text(lat: Latency) -> str:
    if not lat.answered:
        return f"unknown: no daemon answered /programming at {lat.asked}"
    if lat.last is None:
        return f"the daemon at {lat.asked} has programmed no change of it since it started"
    since = "its EndpointSlice's trigger time" if lat.last.since == "trigger" else "it saw it"
    return f"its last change was committed {lat.last.seconds:.3f} s after {since}"


def _latency_json(lat: Latency | None) -> dict[str, Any] | None:
    if lat is None:
        return None
    last = lat.last
    return {
        "asked": lat.asked,
        "answered": lat.answered,
        "seconds": None if last is None else last.seconds,
        "since": None if last is None else last.since,
    }


def _frontend_json(fe: FrontendReport) -> dict[str, Any]:
    return {
        "port": fe.ref,
        "family": str(fe.family),
        "kind": fe.kind,
        "address": None if fe.address is None else str(fe.address),
        "port_number": fe.port,
        "protocol": fe.label.rpartition("/")[2],
        "programmed": fe.programmed,
        "state": fe.state,
        "dispatch": fe.dispatch,
        "no_endpoint": fe.no_endpoint,
        "endpoints": [_hostport(a, p) for a, p in fe.endpoints],
        "local_endpoints": [_hostport(a, p) for a, p in fe.local_endpoints],
        "allowed_sources": None if fe.allowed is None else [str(r) for r in fe.allowed],
        "load_balancing": fe.algorithm or None,
    }


def _trace_json(t: TraceRow) -> dict[str, Any]:
    return {
        "frontend": t.frontend.label,
        "port": t.frontend.ref,
        "sent_to": None if t.dst is None else str(t.dst),
        "verdict": t.verdict,
        "endpoints": list(t.endpoints),
        "masquerade": t.masquerade,
        "ok": t.ok,
        "diagnosis": t.diagnosis,
    }


def _facts_json(facts: ServiceFacts | None) -> dict[str, Any] | None:
    if facts is None:
        return None
    slices = [
        {
            "name": s.name,
            "status": s.status,
            "family": s.family,
            "ports": s.ports,
            "endpoints": list(s.endpoints),
            "problem": s.problem,
        }
        for s in facts.slices
    ]
    return {"status": facts.status, "fields": dict(facts.fields), "slices": slices}


def report_to_json(report: Report) -> dict[str, Any]:
    """The report as one JSON-ready object, the same sections as the text."""
    rules = report.rules
    return {
        "service": str(report.service),
        "source": report.source,
        "manifests": _facts_json(report.facts),
        "frontends": [_frontend_json(fe) for fe in rules.frontends],
        "rules": {
            "programmed": bool(rules.elements),
            "elements": [
                {"family": str(e.family), "set": e.set, "element": e.text} for e in rules.elements
            ],
            "chains": [
                {"family": str(c.family), "name": c.name, "text": list(c.lines)}
                for c in rules.chains
            ],
            "undecoded_rules": rules.undecoded_rules,
        },
        "counters": _counters_json(report),
        "conntrack": [
            {
                "frontend": g.frontend.label,
                "port": g.frontend.ref,
                "count": g.count,
                "flows": [f.as_dict() for f in g.flows],
            }
            for g in report.flows
        ],
        "endpoints": [
            {
                "endpoint": _hostport(e.address, e.port),
                "frontends": list(e.frontends),
                "kind": e.reach.kind,
                "reachable": e.reach.reachable,
                "reason": e.reach.reason,
            }
            for e in report.endpoints
        ],
        "trace": None
        if report.src is None
        else {"from": str(report.src), "results": [_trace_json(t) for t in report.traces]},
        "programming": _latency_json(report.latency),
        "beside_proxy_rules": list(report.beside),
        "problems": list(report.problems),
        "ok": not report.problems,
    }


def _counters_json(report: Report) -> dict[str, Any]:
    """Rule counters; ``service`` (per frontend) only when service counters are on."""
    rules = report.rules
    out: dict[str, Any] = {"enabled": bool(rules.counter_rules), "rules": rules.counter_rules}
    if report.counts is not None:
        out["service"] = [
            {"frontend": c.frontend.label, "port": c.frontend.ref, "packets": c.packets,
             "bytes": c.bytes}
            for c in report.counts
        ]  # fmt: skip
    return out
