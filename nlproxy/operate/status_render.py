"""``nlproxy status``'s output: the facts :mod:`nlproxy.operate.status` gathered, as lines or JSON.

Pure: no I/O, and the clock comes in as an argument. A fact the daemon does not export is shown
as unknown (text) or null (JSON), never as zero.
"""

from __future__ import annotations

from datetime import datetime

from nlproxy.operate.status import DaemonStatus, Durations

UNREACHABLE_SHOWN = 20
"""Unreachable endpoints listed by name; all of them are counted."""
SLOWEST_SHOWN = 5
"""Services listed by their last programming latency, the slowest."""


def _unknown(value: object) -> str:
    return "unknown (not exported)" if value is None else str(value)


def _ago(then: datetime, now: datetime) -> str:
    secs = max(0.0, (now - then).total_seconds())
    if secs < 120:
        return f"{secs:.0f}s ago"
    if secs < 7200:
        return f"{secs / 60:.0f}m ago"
    return f"{secs / 3600:.1f}h ago"


def render_text(st: DaemonStatus, now: datetime) -> str:
    """Human output: one line per fact, then the unreachable endpoints and foreign tables."""
    lines = [
        f"health   {st.healthz_port.address} ({st.healthz_port.flag})",
        f"metrics  {st.metrics_port.address} ({st.metrics_port.flag})",
        "",
    ]
    rows: list[tuple[str, str]] = [("up", "yes" if st.up else "NO")]
    if st.healthz_error is not None:
        rows.append(("ready", f"unknown: {st.healthz_error}"))
    else:
        word = "yes" if st.ready else "NO"
        extra = [f"healthz {st.healthz_code}"]
        if st.healthz.get("lastUpdated"):
            extra.append(f"last updated {st.healthz['lastUpdated']}")
        if st.healthz.get("nodeEligible") is False:
            extra.append("node NOT eligible for load balancer traffic")
        rows.append(("ready", f"{word} ({', '.join(extra)})"))
    if st.metrics_error is not None:
        rows.append(("metrics", f"unavailable: {st.metrics_error}"))
    else:
        rows += _metric_rows(st, now)
    width = max(len(k) for k, _ in rows)
    lines += [f"{k.ljust(width)}  {v}" for k, v in rows]
    if st.unreachable:
        lines += ["", "unreachable endpoints:"]
        lines += [
            f"  {u.service}  {u.endpoint}  {u.reason}" for u in st.unreachable[:UNREACHABLE_SHOWN]
        ]
        if len(st.unreachable) > UNREACHABLE_SHOWN:
            lines.append(f"  … and {len(st.unreachable) - UNREACHABLE_SHOWN} more")
    if st.programming:
        lines += ["", "slowest programmed (last change, to committed on this node):"]
        lines += [
            f"  {p.service}  {p.seconds:.3f} s  (from {_SINCE.get(p.since, p.since)})"
            for p in st.programming[:SLOWEST_SHOWN]
        ]
    if st.foreign_tables:
        lines += ["", "another service proxy's tables on this node (their rules may win):"]
        lines += [f"  {family} {table}" for family, table in st.foreign_tables]
    if st.beside_tables:
        lines += ["", "the service proxy this canary runs beside (expected, left alone):"]
        lines += [f"  {family} {table}" for family, table in st.beside_tables]
    if st.problem is not None:
        lines += ["", f"nlproxy is {st.problem}"]
    return "\n".join(lines)


_SINCE = {"trigger": "its EndpointSlice's trigger time", "seen": "when nlproxy saw it"}


def _duration_text(count: int | None, mean: float | None) -> str:
    if count is None:
        return _unknown(None)
    if mean is None:
        return f"{count} syncs"
    return f"mean {mean * 1000:.1f} ms over {count} syncs"


def _metric_rows(st: DaemonStatus, now: datetime) -> list[tuple[str, str]]:
    sync = st.sync
    last = "never" if sync.last is None else f"{sync.last:%Y-%m-%d %H:%M:%S} UTC"
    if sync.last is not None:
        last += f" ({_ago(sync.last, now)})"
    duration = _duration_text(sync.count, sync.mean_seconds)
    split = [
        f"{what} {_duration_text(d.count, d.mean_seconds)}"
        for what, d in (("full", sync.full), ("partial", sync.partial))
        if d is not None
    ]
    if split:
        duration += f" ({'; '.join(split)})"
    pending = (
        f"{_unknown(sync.pending_services)} service, "
        f"{_unknown(sync.pending_endpoints)} endpoint events"
    )
    if st.drift_repairs is None:
        drift = _unknown(None)
    else:
        total = sum(st.drift_repairs.values())
        by = ", ".join(f"{w}: {n}" for w, n in sorted(st.drift_repairs.items()))
        drift = f"{total} ({by})" if by else "0"
    foreign = _tables_text(st.foreign_tables)
    if st.nodeport_missing is None:
        nodeports = _unknown(None)
    elif st.nodeport_missing:
        fams = " and ".join(st.nodeport_missing)
        nodeports = f"{fams} NodePorts REFUSED: nodePortAddresses selects no {fams} address"
    else:
        nodeports = "ok"
    return [
        ("last sync", last),
        ("sync duration", duration),
        ("sync failures", _unknown(sync.failures)),
        ("pending changes", pending),
        ("rejected services", _unknown(st.rejected_services)),
        ("invalid objects", _unknown(st.invalid_objects)),
        ("drift repairs", drift),
        ("unreachable endpoints", _unknown(st.unreachable_count)),
        ("foreign proxy tables", foreign),
        *([("beside (canary)", _tables_text(st.beside_tables))] if st.beside_tables else []),
        ("nodeport addresses", nodeports),
    ]


def _tables_text(tables: tuple[tuple[str, str], ...] | None) -> str:
    return _unknown(None) if tables is None else ", ".join(f"{f} {t}" for f, t in tables) or "none"


def to_json(st: DaemonStatus) -> dict[str, object]:
    """``--json``: the same facts; None where the daemon does not export one."""
    sync = st.sync
    return {
        "up": st.up,
        "ready": st.ready,
        "problem": st.problem,
        "healthz": {
            "address": st.healthz_port.address,
            "code": st.healthz_code,
            "body": dict(st.healthz),
            "error": st.healthz_error,
        },
        "metrics": {"address": st.metrics_port.address, "error": st.metrics_error},
        "last_sync": None if sync.last is None else sync.last.isoformat(),
        "syncs": sync.count,
        "sync_duration_mean_seconds": sync.mean_seconds,
        "full_syncs": _durations_json(sync.full),
        "partial_syncs": _durations_json(sync.partial),
        "sync_failures": sync.failures,
        "pending_changes": {"services": sync.pending_services, "endpoints": sync.pending_endpoints},
        "rejected_services": st.rejected_services,
        "invalid_objects": st.invalid_objects,
        "drift_repairs": None if st.drift_repairs is None else dict(st.drift_repairs),
        "unreachable_endpoints": st.unreachable_count,
        "unreachable": [
            {"service": u.service, "endpoint": u.endpoint, "reason": u.reason}
            for u in st.unreachable
        ],
        "nodeport_addresses_missing": None
        if st.nodeport_missing is None
        else list(st.nodeport_missing),
        "foreign_proxy_tables": None
        if st.foreign_tables is None
        else [{"family": f, "table": t} for f, t in st.foreign_tables],
        "beside_proxy_tables": None
        if st.beside_tables is None
        else [{"family": f, "table": t} for f, t in st.beside_tables],
        "programming": None
        if st.programming is None
        else [
            {"service": p.service, "seconds": p.seconds, "since": p.since} for p in st.programming
        ],
    }


def _durations_json(d: Durations | None) -> dict[str, object] | None:
    return None if d is None else {"count": d.count, "mean_seconds": d.mean_seconds}
