"""Turn the benchmark JSON lines into a summary table, target ratios and plots.

Sits after the measurements in ``bench/run.py``: reads records, computes nothing new but ratios,
and never judges: a target missed is printed as such, not raised.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import plot
import targets as issue18

Rec = dict[str, Any]


def _find(records: Iterable[Rec], **match: Any) -> list[Rec]:
    return [r for r in records if all(r.get(k) == v for k, v in match.items())]


def _one(records: Iterable[Rec], **match: Any) -> Rec | None:
    found = _find(records, **match)
    return found[0] if found else None


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 2)


def _ok(rec: Rec | None) -> bool:
    return rec is not None and rec.get("rc") in (0, 3) and not rec.get("timed_out")


def targets(records: Sequence[Rec], change_label: str) -> list[Rec]:
    """The brief's targets as measured values and ratios (``met`` is informative only)."""
    out: list[Rec] = []
    cold = [r for r in records if r.get("bench") == "cold_sync"]
    nl = _one(cold, point=change_label, variant="nlproxy")
    nft = _one(cold, point=change_label, variant="nft-1.31")
    if _ok(nl) and nl is not None:
        speedup = _ratio(nft["wall"], nl["wall"]) if _ok(nft) and nft else None
        out.append(
            {
                "target": f"cold {change_label}: nft-1.31 wall / nlproxy wall",
                "value": speedup,
                "goal": ">= 20",
                "met": speedup is not None and speedup >= 20,
            }
        )
        over_sys = _ratio(nl["wall"], nl["sys"])
        out.append(
            {
                "target": f"cold {change_label}: nlproxy wall / nlproxy sys (kernel share)",
                "value": over_sys,
                "goal": "<= 1.5",
                "met": over_sys is not None and over_sys <= 1.5,
            }
        )
    inproc = _one(records, bench="one_endpoint_inprocess", point=change_label)
    if inproc:
        v = inproc["wall_ms_median"]
        out.append(
            {
                "target": f"one endpoint changed at {change_label}, in-process sync (ms)",
                "value": v,
                "goal": "<= 5",
                "met": v <= 5,
            }
        )
    restart = _one(records, bench="restart_unchanged", point=change_label)
    if restart:
        ops = restart.get("ops")
        out.append(
            {
                "target": f"restart unchanged at {change_label}: ops",
                "value": ops,
                "goal": "== 0",
                "met": ops == 0,
            }
        )
    fp = [r for r in records if r.get("bench") == "first_packet" and r.get("variant") == "nlproxy"]
    fp = [r for r in fp if "p50_us" in r]
    if len(fp) >= 2:
        lo, hi = min(fp, key=lambda r: r["services"]), max(fp, key=lambda r: r["services"])
        v = _ratio(hi["p50_us"], lo["p50_us"])
        out.append(
            {
                "target": f"first packet p50 at {hi['services']} / at {lo['services']} services",
                "value": v,
                "goal": "<= 1.10",
                "met": v is not None and v <= 1.10,
            }
        )
    fp = [r for r in fp if "p50_over_direct" in r]
    if len(fp) >= 2:
        lo, hi = min(fp, key=lambda r: r["services"]), max(fp, key=lambda r: r["services"])
        v = _ratio(hi["p50_over_direct"], lo["p50_over_direct"])
        out.append(
            {
                "target": f"first packet p50/direct-to-pod at {hi['services']} over the same at "
                f"{lo['services']} services",
                "value": v,
                "goal": "<= 1.10",
                "met": v is not None and v <= 1.10,
            }
        )
    big = _one(cold, point="44kx5", variant="nlproxy")
    if big:
        out.append(
            {
                "target": "cold 44k services (x5 endpoints), nlproxy wall (s)",
                "value": big["wall"],
                "goal": "<= 30",
                "met": _ok(big) and big["wall"] <= 30,
            }
        )
    return [{"bench": "target", **t} for t in out]


def _cold_table(records: Sequence[Rec]) -> list[str]:
    lines = [
        "COLD FULL SYNC (fresh namespace each; wall/user/sys s, peak RSS MiB; x = wall / "
        "nlproxy wall)"
    ]
    cold = [r for r in records if r.get("bench") == "cold_sync"]
    for point in dict.fromkeys(r["point"] for r in cold):
        rows = _find(cold, point=point)
        base = _one(rows, variant="nlproxy")
        lines.append(f"  {point}")
        for r in rows:
            state = "TIMEOUT" if r.get("timed_out") else "" if _ok(r) else f"rc={r.get('rc')}"
            x = _ratio(r["wall"], base["wall"]) if base and _ok(base) else None
            ops = f" ops={r['ops']}" if "ops" in r else ""
            lines.append(
                f"    {r['variant']:<16}{r['wall']:>9.2f}{r['user']:>9.2f}{r['sys']:>9.2f}"
                f"{r['rss_mib']:>8.0f}  x{x if x is not None else '-':<6}{ops} {state}"
            )
    return lines


def _change_table(records: Sequence[Rec]) -> list[str]:
    lines = ["ONE ENDPOINT CHANGED / RESTART UNCHANGED"]
    for r in _find(records, bench="one_endpoint_inprocess"):
        lines.append(  # noqa: PERF401 - one formatted line per record reads better
            f"  {r['point']} nlproxy in-process Syncer: median {r['wall_ms_median']} ms "
            f"(max {r['wall_ms_max']}; plan {r['plan_ms_median']}, apply "
            f"{r['apply_ms_median']}, other {r.get('other_ms_median')}), ops {r['ops']}"
        )
    for r in _find(records, bench="cold_stages"):
        lines.append(  # noqa: PERF401
            f"  {r['point']} nlproxy cold sync in-process stages: load JSON {r['load_json_s']} s, "
            f"state {r['state_s']} s, sync {r['sync_s']} s (plan {r['plan_s']}, diff+commit "
            f"{r['apply_s']}), ops {r['ops']}"
        )
    for r in _find(records, bench="one_endpoint_nft"):
        lines.append(  # noqa: PERF401
            f"  {r['point']} {r['variant']} partial sync via nft -f: median "
            f"{r['wall_ms_median']} ms (sys {r['sys_ms_median']}, user {r['user_ms_median']})"
        )
    for bench in ("one_endpoint_once", "restart_unchanged"):
        for r in _find(records, bench=bench):
            lines.append(  # noqa: PERF401
                f"  {r['point']} nlproxy run --once, {bench}: wall {r['wall']} s, "
                f"ops {r.get('ops')}, sync {r.get('sync_ms')} ms"
            )
    return lines


def _latency_table(records: Sequence[Rec]) -> list[str]:
    fp = [r for r in records if r.get("bench") == "first_packet"]
    lines = [
        "FIRST-PACKET TCP CONNECT LATENCY to the last service (p50 / p99 us; in brackets p50 over "
        "direct-to-pod p50 in the same topology with the rules loaded)"
    ]
    variants = list(dict.fromkeys(r["variant"] for r in fp))
    lines.append("  " + f"{'services':>9}" + "".join(f"{v:>22}" for v in variants))
    for s in sorted({r["services"] for r in fp}):
        cells = []
        for v in variants:
            r = _one(fp, services=s, variant=v)
            if not r or "p50_us" not in r:
                cells.append("-")
                continue
            norm = f" [{r['p50_over_direct']}]" if "p50_over_direct" in r else ""
            cells.append(f"{r['p50_us']:.0f}/{r['p99_us']:.0f}{norm}")
        lines.append("  " + f"{s:>9}" + "".join(f"{c:>22}" for c in cells))
    return lines


def _others(records: Sequence[Rec], most: int = 12) -> list[str]:
    """Other scripts' records; a script with many (one per change or round) shows only its
    summaries and ratios (all of them are in the JSON lines)."""
    lines = []
    scripts = dict.fromkeys(r["script"] for r in records if "script" in r)
    for script in scripts:
        recs = _find(records, script=script)
        if len(recs) > most:
            recs = [
                r
                for r in recs
                if r.get("summary") or "ratio" in r or "summary" in str(r.get("bench"))
            ] or recs[-most:]
        lines += ["  " + ", ".join(f"{k}={v}" for k, v in r.items())[:200] for r in recs]
    return lines


def summary(records: Sequence[Rec], change_label: str, mode: str) -> str:
    lines = [_machine_line(records, mode), ""]
    lines += [*_cold_table(records), "", *_change_table(records), ""]
    lines += [*_latency_table(records), "", "OTHER BENCHMARKS"]
    lines += _others(records)
    lines += ["", "EARLIER TARGETS (printed, never asserted)"]
    for t in targets(records, change_label):
        mark = "met" if t["met"] else "MISSED"
        lines.append(f"  {mark:<7}{t['target']}: {t['value']} (goal {t['goal']})")
    lines += ["", *issue18.stage_table(records), "", *issue18.table(issue18.evaluate(records))]
    return "\n".join(lines) + "\n"


def _machine_line(records: Sequence[Rec], mode: str) -> str:
    m = _one(records, bench="machine") or {}
    run = _one(records, bench="run") or {}
    return (
        f"nlproxy benchmarks ({mode}) {m.get('date')}: {m.get('nproc')} CPUs, "
        f"{m.get('mem_gib')} GiB, kernel {m.get('kernel')}, load average (1/5/15 min) "
        f"{m.get('loadavg_1_5_15', m.get('loadavg'))} at the start, "
        f"{run.get('loadavg_end_1_5_15')} at the end, {run.get('seconds')} s"
    )


def targets_summary(records: Sequence[Rec]) -> str:
    """``run.py --targets``: issue 18's per-stage profile and its TARGETS table."""
    lines = [_machine_line(records, "targets"), ""]
    lines += [*issue18.stage_table(records), ""]
    failed = [r for r in records if r.get("bench") == "other" and r.get("error")]
    lines += [f"  FAILED {r['script']}: {str(r['error'])[-200:]}" for r in failed]
    lines += issue18.table(issue18.evaluate(records))
    return "\n".join(lines) + "\n"


def plots(records: Sequence[Rec], directory: Path, mode: str) -> list[Path]:
    """Cold sync wall vs services, first-packet p50 and p99 vs services."""
    made = []
    cold = [r for r in records if r.get("bench") == "cold_sync" and _ok(r) and r["services"] > 1]
    series: dict[str, list[tuple[float, float]]] = {}
    for r in cold:
        series.setdefault(r["variant"], []).append((r["services"], r["wall"]))
    if series:
        path = directory / f"{mode}-cold-sync.png"
        plot.line_chart(
            path,
            "COLD FULL SYNC, WALL SECONDS",
            series,
            xlabel="services",
            ylabel="seconds (log)",
            logy=True,
        )
        made.append(path)
    fp = [r for r in records if r.get("bench") == "first_packet" and "p50_us" in r]
    for key in ("p50_us", "p99_us"):
        series = {}
        for r in fp:
            series.setdefault(r["variant"], []).append((r["services"], r[key]))
        if series:
            path = directory / f"{mode}-first-packet-{key[:3]}.png"
            plot.line_chart(
                path,
                f"FIRST-PACKET CONNECT {key[:3].upper()}, US",
                series,
                xlabel="services",
                ylabel="microseconds",
                logy=key == "p99_us",
            )
            made.append(path)
    return made
