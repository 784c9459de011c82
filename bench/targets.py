"""Issue 18's targets and per-stage profile, computed from the benchmarks' JSON lines.

Sits after the measurements in ``bench/run.py`` (beside ``report.py``): reads records, computes
nothing but ratios and margins, and never judges by raising. Each target row says its goal, the
value this run measured, the ratio to the goal (or to the tool measured beside it), whether it
was met or by how much it was missed, and for a missed one the stage of the profile that costs
the most. A target whose record is absent is "not measured", never met.

Where each figure comes from (the script and its record):

- ``bench_kube_cold.py``: ``kube_cold``/``cold_start`` (spawn → first sync from the in-repo API
  server) and ``kube_cold``/``burst`` (B slice updates; converged after the last write);
- ``bench_coldpath.py``: ``coldpath_cli`` (``run --once`` cold / restart, JSON / YAML, and
  ``iptables-legacy-restore`` of the same cluster, rounds interleaved), ``coldpath_stages``
  (the same steps in-process, stage by stage) and ``burst_stages`` (a burst and a read-back
  verify through one long-lived ``Syncer``);
- ``bench_daemon.py``: ``daemon``/``first_sync``, ``rss``, ``idle_cpu``, ``idle_rss`` and
  ``verify_change`` (a change written while a read-back verify runs);
- ``bench_cli.py``: ``cli-summary`` for ``version``, ``conntrack list`` and ``rules``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

Rec = dict[str, Any]

S, E = 10_000, 10  # the reference cluster
BIG_S, BIG_E = 44_000, 5

# Stages of the profile, in the order of the pipeline, with the record key that holds each.
STAGES: tuple[tuple[str, str], ...] = (
    ("list/read", "read_s"),
    ("decode", "decode_s"),
    ("parse", "parse_s"),
    ("state", "state_s"),
    ("plan", "plan_s"),
    ("diff", "diff_s"),
    ("validate", "validate_s"),
    ("encode", "encode_s"),
    ("commit", "commit_s"),
    ("read-back", "readback_s"),
    ("verify", "verify_s"),
)


@dataclass(frozen=True, slots=True)
class Measured:
    """One target's figure: ``value`` against ``goal`` (smaller is better), a reference tool's
    figure when one ran beside it, and the profile (stage → seconds) behind the value."""

    value: float
    unit: str
    goal: float
    reference: tuple[str, float] | None = None
    profile: dict[str, float] | None = None
    note: str = ""


def _find(records: Iterable[Rec], **match: Any) -> list[Rec]:
    return [r for r in records if all(r.get(k) == v for k, v in match.items())]


def _last(records: Iterable[Rec], **match: Any) -> Rec | None:
    found = _find(records, **match)
    return found[-1] if found else None


def _median(records: Sequence[Rec], key: str) -> float | None:
    values = [r[key] for r in records if isinstance(r.get(key), int | float)]
    return statistics.median(values) if values else None


def _stages(rec: Rec | None) -> dict[str, float] | None:
    """The stages of a ``coldpath_stages`` / ``burst_stages`` record that it measured."""
    if rec is None:
        return None
    return {name: rec[key] for name, key in STAGES if isinstance(rec.get(key), int | float)}


def _once(records: Sequence[Rec], fmt: str, phase: str, s: int, e: int) -> Measured | None:
    runs = _find(records, bench="coldpath_cli", format=fmt, phase=phase, services=s, endpoints=e)
    wall = _median([r for r in runs if not r.get("error")], "wall")
    if wall is None:
        return None
    ref_runs = _find(
        records, bench="coldpath_cli", format="iptables-legacy", services=s, endpoints=e
    )
    ref = _median(ref_runs, "wall") if phase == "cold" else None
    stages = _last(records, bench="coldpath_stages", format=fmt, phase=phase, services=s)
    goal = {("json", "cold"): 1.0, ("yaml", "cold"): 2.0}.get((fmt, phase), 1.0)
    if (s, e) == (BIG_S, BIG_E):
        goal = 5.0
    ops = _median(runs, "ops")
    return Measured(
        value=wall,
        unit="s",
        goal=goal,
        reference=("iptables-legacy-restore", ref) if ref is not None else None,
        profile=_stages(stages),
        note=f"{len(runs)} run(s), median" + (f"; ops {ops:g}" if ops is not None else ""),
    )


def _api_start(
    records: Sequence[Rec], what: str, rest: str, note: tuple[str, str]
) -> Measured | None:
    """The daemon on the API, spawn -> first commit: the lists, then ``rest``."""
    r = _last(records, bench="kube_cold", what=what, services=S, endpoints=E)
    if r is None or "to_first_commit_s" not in r:
        return None
    lists = r["to_lists_s"]
    return Measured(
        value=r["to_first_commit_s"],
        unit="s",
        goal=1.0,
        profile={
            "list/read+decode+parse (source.synced)": lists,
            rest: round(r["to_first_commit_s"] - lists, 3),
        },
        note=f"{note[0]} {r.get(note[1])}",
    )


def api_cold(records: Sequence[Rec]) -> Measured | None:
    return _api_start(
        records, "cold_start", "state+plan+diff+encode+commit", ("lists per kind (ms)", "list_ms")
    )


def api_restart(records: Sequence[Rec]) -> Measured | None:
    return _api_start(records, "restart", "state+plan+read-back+diff", ("ops", "first_commit_ops"))


def _restart_ops(runs: Sequence[Rec], key: str) -> list[int]:
    return [r[key] for r in runs if isinstance(r.get(key), int)]


def restart_ops(records: Sequence[Rec]) -> Measured | None:
    once = _find(
        records, bench="coldpath_cli", format="json", phase="restart", services=S, endpoints=E
    )
    api = _find(records, bench="kube_cold", what="restart", services=S, endpoints=E)
    ops = _restart_ops(once, "ops") + _restart_ops(api, "first_commit_ops")
    if not ops:
        return None
    return Measured(value=max(ops), unit="ops", goal=0.0, note=f"most of {len(ops)} restart(s)")


def verify_change(records: Sequence[Rec]) -> Measured | None:
    runs = _find(records, bench="daemon", what="verify_change", services=S, endpoints=E)
    runs = [r for r in runs if "seconds" in r]
    if not runs:
        return None
    during = [r for r in runs if r.get("during_read_back")]
    usual = _last(records, bench="daemon", what="event_to_commit")
    worst = max(runs, key=lambda r: r["seconds"])
    profile = None
    waited = worst.get("verify_done_after_write_s")
    if isinstance(waited, int | float) and waited > 0:
        profile = {
            "waiting for the read-back verify to finish": waited,
            "its own sync after the verify": round(worst["seconds"] - waited, 3),
        }
    return Measured(
        value=worst["seconds"],
        unit="s",
        goal=worst.get("min_sync_period_s", 0.1),
        profile=profile,
        note=f"worst of {len(runs)}; {len(during)} landed while the read-back ran"
        + (f"; a change with no verify: p50 {usual['p50_ms']} ms" if usual else ""),
    )


def burst(records: Sequence[Rec]) -> Measured | None:
    r = _last(records, bench="kube_cold", what="burst", updates=5000, services=S)
    if r is None or "converged_s" not in r:
        return None
    after = round(r["converged_s"] - r["replay_s"], 3)
    stages = _last(records, bench="burst_stages", what="burst", services=S)
    return Measured(
        value=after,
        unit="s",
        goal=1.0,
        profile=_stages(stages),
        note=f"replayed in {r['replay_s']} s, {r['syncs']} syncs, {r['ops']} ops",
    )


def idle_cpu(records: Sequence[Rec]) -> Measured | None:
    r = _last(records, bench="daemon", what="idle_cpu", services=S, endpoints=E)
    if r is None:
        return None
    return Measured(
        value=r["cpu_s_per_minute"],
        unit="s CPU/min",
        goal=0.1,
        reference=("kube-proxy 1.36 (issue 18)", 0.022),
        note=f"over {r['seconds']:g} s idle",
    )


def rss_first(records: Sequence[Rec]) -> Measured | None:
    r = _last(records, bench="daemon", what="first_sync", services=S, endpoints=E)
    if r is None or "rss_mb" not in r:
        return None
    return Measured(value=r["rss_mb"], unit="MiB", goal=150.0, note="VmRSS at /healthz 200")


def rss_peak(records: Sequence[Rec]) -> Measured | None:
    if _last(records, bench="daemon", what="first_sync", services=S, endpoints=E) is None:
        return None  # the daemon's other records carry no size: only a run at 10k x 10 counts
    peaks = [
        r["peak_rss_mb"]
        for r in _find(records, bench="daemon")
        if isinstance(r.get("peak_rss_mb"), int | float) and r.get("stage") != "imports"
    ]
    if not peaks:
        return None
    return Measured(value=max(peaks), unit="MiB", goal=200.0, note="VmHWM, whole run")


def rss_flat(records: Sequence[Rec]) -> Measured | None:
    r = _last(records, bench="daemon", what="idle_rss", services=S, endpoints=E)
    if r is None or not r.get("samples_mb"):
        return None
    samples = r["samples_mb"]
    growth = round(max(samples) - samples[0], 1)
    return Measured(
        value=growth,
        unit="MiB growth",
        goal=5.0,
        note=f"over {r['seconds']:g} s idle (not an hour), {len(samples)} samples, "
        f"{samples[0]}..{samples[-1]} MiB",
    )


def _cli(records: Sequence[Rec], command: str, **size: int) -> Rec | None:
    return _last(records, bench="cli-summary", command=command, **size)


def version(records: Sequence[Rec]) -> Measured | None:
    r = _cli(records, "version")
    if r is None:
        return None
    return Measured(value=r["wall_s"], unit="s", goal=0.1, note="median wall")


def conntrack_list(records: Sequence[Rec]) -> Measured | None:
    r = _cli(records, "conntrack list", flows=100_000)
    if r is None:
        return None
    return Measured(
        value=r["ratio"],
        unit="x conntrack -L",
        goal=1.5,
        note=f"{r.get('flows')} flows; "
        f"rounds {r['ratio_per_round_min']}..{r['ratio_per_round_max']}",
    )


def rules(records: Sequence[Rec]) -> Measured | None:
    r = _cli(records, "rules", services=S, endpoints=E)
    if r is None:
        return None
    return Measured(
        value=r["ratio"],
        unit="x nft list ruleset",
        goal=1.0,
        note=f"rounds {r['ratio_per_round_min']}..{r['ratio_per_round_max']}",
    )


def once_vs_legacy(records: Sequence[Rec]) -> Measured | None:
    m = _once(records, "yaml", "cold", S, E)
    if m is None or m.reference is None:
        return None
    return Measured(
        value=round(m.value / m.reference[1], 2),
        unit="x iptables-legacy-restore",
        goal=1.0,
        profile=m.profile,
        note=f"{m.value:.2f} s / {m.reference[1]:.2f} s",
    )


TARGETS: tuple[tuple[str, str, Callable[[Sequence[Rec]], Measured | None]], ...] = (
    ("api-cold", "API cold start 10kx10, spawn -> first sync", api_cold),
    ("once-json", "run --once cold 10kx10, JSON", lambda r: _once(r, "json", "cold", S, E)),
    ("once-yaml", "run --once cold 10kx10, YAML", lambda r: _once(r, "yaml", "cold", S, E)),
    ("once-vs-legacy", "run --once YAML / iptables-legacy-restore, same cluster", once_vs_legacy),
    (
        "once-44k",
        "run --once cold 44kx5, JSON",
        lambda r: _once(r, "json", "cold", BIG_S, BIG_E),
    ),
    ("restart-api", "restart unchanged 10kx10 from the API, spawn -> first sync", api_restart),
    (
        "restart-once",
        "restart unchanged 10kx10, run --once JSON",
        lambda r: _once(r, "json", "restart", S, E),
    ),
    ("restart-ops", "restart unchanged 10kx10: operations sent", restart_ops),
    ("verify-change", "a change during a read-back verify, write -> programmed", verify_change),
    ("burst", "5,000-slice burst: last API write -> converged", burst),
    ("idle-cpu", "idle CPU at 10kx10", idle_cpu),
    ("rss-first", "RSS after the first sync 10kx10 (daemon, API)", rss_first),
    ("rss-peak", "RSS never above (peak over the daemon's run)", rss_peak),
    ("rss-flat", "RSS flat over idle (growth)", rss_flat),
    ("version", "nlproxy version", version),
    ("conntrack", "conntrack list at 100k flows", conntrack_list),
    ("rules", "rules at 10kx10", rules),
)


def _fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def evaluate(records: Sequence[Rec]) -> list[Rec]:
    """One row per target of issue 18, measured or not (a missing figure is never met)."""
    rows = []
    for key, name, measure in TARGETS:
        try:
            m = measure(records)
        except (KeyError, TypeError, ValueError) as exc:  # a malformed record: say so
            m, error = None, f"unreadable record: {exc!r}"
        else:
            error = ""
        row: Rec = {"bench": "target18", "id": key, "target": name}
        if m is None:
            rows.append({**row, "status": "not measured", "met": False, "note": error})
            continue
        met = m.value <= m.goal
        row |= {
            "goal": f"<= {_fmt(m.goal)} {m.unit}",
            "value": m.value,
            "unit": m.unit,
            "of_goal": round(m.value / m.goal, 2) if m.goal else None,
            "met": met,
            "status": "met" if met else f"missed by {_fmt(m.value - m.goal)} {m.unit}",
            "note": m.note,
        }
        if m.reference is not None:
            tool, figure = m.reference
            row["reference"] = tool
            row["reference_value"] = figure
            row["vs_reference"] = round(m.value / figure, 2) if figure else None
        if m.profile:
            row["profile"] = m.profile
            if not met:
                worst = max(m.profile, key=lambda k: m.profile[k] if m.profile else 0.0)
                row["costliest_stage"] = f"{worst} {_fmt(m.profile[worst])} s"
        rows.append(row)
    return rows


def table(rows: Sequence[Rec]) -> list[str]:
    """The TARGETS lines ``make bench`` prints."""
    lines = [
        "TARGETS, issue 18 (printed, never asserted; of goal = value / goal; vs tool = value / "
        "the tool's, same run)"
    ]
    for r in rows:
        if r["status"] == "not measured":
            lines.append(
                f"  NOT MEASURED  {r['target']}" + (f" ({r['note']})" if r["note"] else "")
            )
            continue
        mark = "met" if r["met"] else "MISSED"
        vs = ""
        if r.get("reference"):
            vs = f"; {r['reference']} {_fmt(r['reference_value'])}, vs tool x{r['vs_reference']}"
        cost = f"; costliest stage: {r['costliest_stage']}" if r.get("costliest_stage") else ""
        of = f", of goal x{r['of_goal']}" if r["of_goal"] is not None else ""
        lines.append(
            f"  {mark:<13} {r['target']}: {_fmt(r['value'])} {r['unit']} (goal {r['goal']}"
            f"{of}){vs}; {r['status']}{cost}" + (f" [{r['note']}]" if r.get("note") else "")
        )
    return lines


# The figures before this round of work (issue 18's table and text, bench/RESULTS.md of
# 2026-11-21/24), stage by stage where they were split; seconds.
BEFORE: dict[str, str] = {
    "cold run --once JSON 10kx10": "6.3 s: load+parse 4.0, plan 1.0, diff+encode+commit 2.2, "
    "validation ~1 (issue 18)",
    "cold run --once YAML 10kx10": "8.8 s wall, 0.29 s kernel (issue 18)",
    "restart run --once JSON 10kx10": "13.0 s, 0 ops, sync 3.8 (RESULTS 2026-11-21)",
    "burst 5,000 slices 10kx10": "+11.6 s after the last write, 6.8 s of it a verify's "
    "read-back of 220k elements (issue 18)",
    "verify tick 10kx10 (read-back + compare)": "2.89 s CPU per read-back tick "
    "(RESULTS 2026-11-24)",
    "cold from the API 10kx10": "4.17 s: lists 2.05, plan 0.52, kernel 1.80 (issue 18)",
}


def stage_rows(records: Sequence[Rec]) -> list[tuple[str, dict[str, float] | None, Rec | None]]:
    """(what, stages measured, its record) for the cold start, restart, burst and verify."""
    out: list[tuple[str, dict[str, float] | None, Rec | None]] = []
    for fmt in ("json", "yaml"):
        r = _last(records, bench="coldpath_stages", format=fmt, phase="cold", services=S)
        out.append((f"cold run --once {fmt.upper()} 10kx10", _stages(r), r))
    r = _last(records, bench="coldpath_stages", format="json", phase="restart", services=S)
    out.append(("restart run --once JSON 10kx10", _stages(r), r))
    r = _last(records, bench="burst_stages", what="burst", services=S)
    out.append(("burst 5,000 slices 10kx10", _stages(r), r))
    r = _last(records, bench="burst_stages", what="verify", services=S)
    out.append(("verify tick 10kx10 (read-back + compare)", _stages(r), r))
    cold = _last(records, bench="kube_cold", what="cold_start", services=S, endpoints=E)
    api = None
    if cold is not None and "to_lists_s" in cold:
        api = {"list/read": cold["to_lists_s"]}
    out.append(("cold from the API 10kx10", api, cold))
    return out


def stage_table(records: Sequence[Rec]) -> list[str]:
    """Where the time goes, stage by stage, this run beside the figures before."""
    names = [name for name, _ in STAGES]
    lines = [
        "WHERE THE TIME GOES at 10kx10, seconds per stage (in-process, this run; '-' not a "
        "stage of that path; parse = load - read - decode, timed apart)",
        "  " + f"{'':<42}" + "".join(f"{n:>10}" for n in names) + f"{'total':>9}",
    ]
    for what, stages, rec in stage_rows(records):
        if stages is None:
            lines.append(f"  {what:<42}not measured")
        else:
            cells = "".join(f"{stages[n]:>10.3f}" if n in stages else f"{'-':>10}" for n in names)
            total = rec.get("total_s") if rec else None
            if what.startswith("cold from the API") and rec:
                total = rec.get("to_first_commit_s")
            lines.append(f"  {what:<42}{cells}{total if total is not None else '-':>9}")
        lines.append(f"  {'':<42}before: {BEFORE.get(what, '-')}")
    return lines


def markdown(records: Sequence[Rec]) -> str:
    """The two tables as Markdown, for ``bench/RESULTS.md`` (``run.py --markdown``)."""
    out = [
        "| target | goal | measured | of goal | beside it (same run) | verdict | costliest stage |",
        "|---|---|---:|---:|---|---|---|",
    ]
    for r in evaluate(records):
        if r["status"] == "not measured":
            out.append(f"| {r['target']} | | | | | **not measured** {r['note']} | |")
            continue
        ref = ""
        if r.get("reference"):
            ref = f"{r['reference']} {_fmt(r['reference_value'])} (x{r['vs_reference']})"
        verdict = "met" if r["met"] else f"**{r['status']}**"
        out.append(
            f"| {r['target']} | {r['goal']} | {_fmt(r['value'])} {r['unit']} | "
            f"{'x' + str(r['of_goal']) if r['of_goal'] is not None else '-'} | {ref} | "
            f"{verdict} | {r.get('costliest_stage', '')} |"
        )
    names = [name for name, _ in STAGES]
    out += ["", "| 10k x 10, seconds | " + " | ".join(names) + " | total | before |"]
    out.append("|---" * (len(names) + 3) + "|")
    for what, stages, rec in stage_rows(records):
        cells = [f"{stages[n]:.3f}" if stages is not None and n in stages else "-" for n in names]
        total = rec.get("total_s") if rec else None
        if what.startswith("cold from the API") and rec:
            total = rec.get("to_first_commit_s")
        out.append(
            f"| {what} | " + " | ".join(cells) + f" | {total if total is not None else '-'} | "
            f"{BEFORE.get(what, '-')} |"
        )
    return "\n".join(out) + "\n"
