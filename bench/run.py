"""``make bench``: every benchmark, side by side, as JSON lines, a table, targets and plots.

The entry point of ``bench/``: runs the control-plane benchmarks (``control.py``), the data-plane
benchmark (``dataplane.py``) and, when present, the other ``bench_*.py`` scripts, collects their
JSON lines into ``bench/results/<mode>.jsonl``, prints a summary table with the targets as ratios
(never asserted: machines are noisy) and draws ``bench/plots/<mode>-*.png``.

    .venv/bin/python bench/run.py            # full run, issue 18's targets included: ~40 min
    .venv/bin/python bench/run.py --quick    # small points only, under ~3 minutes
    .venv/bin/python bench/run.py --targets  # issue 18's targets only (10k x 10, 44k x 5): ~22 min

Issue 18's targets (``targets.py``) are printed as a TARGETS table, each with its goal, this
run's figure, the ratio, met or missed by how much and the costliest stage, followed by the
per-stage profile beside the figures before.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parent))

import control
import dataplane
import gen
import listeners
import report
import targets
from measure import PY, REPO, Sink, emit, log

BENCH = REPO / "bench"
ALL = ("nlproxy", "nlproxy-yaml", *control.BASELINES)
NO_YAML = ("nlproxy", *control.BASELINES)
DP_VARIANTS = ("nlproxy", "nft-1.31", "nft-1.36", "iptables-nft", "iptables-legacy")


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """What one mode runs."""

    points: tuple[control.Point, ...]
    change_label: str
    rounds: int
    timeout: float
    dp_services: tuple[int, ...]
    dp_count: int
    dp_budget: float
    others: tuple[tuple[str, tuple[str, ...]], ...]
    """(script, its arguments), run in this order."""


def _point(s: int, e: int, variants: Sequence[str]) -> control.Point:
    label = f"{s // 1000}kx{e}" if s >= 1000 else f"{s}x{e // 1000}k" if e >= 1000 else f"{s}x{e}"
    return control.Point(
        label=label, cluster=gen.Cluster(services=s, endpoints=e), variants=tuple(variants)
    )


KERNEL_FLOOR_RUNS = (
    # The kernel's time per element at 40k x 10 beside 10k x 10's (within 1.5x), and what a
    # large map's size hint changes in it.
    ("bench_listeners.py", ("--services", "40000", "--endpoints", "10", "--rounds", "1",
                            "--conditions", "none", "--writers", "nlproxy", "--no-extra")),
    ("bench_set_size.py", ("--services", "10000,40000", "--rounds", "2")),
    # The daemon from the API server beside run --once: CPU, kernel time and memory of the first
    # sync, RSS, idle CPU; --base DIR adds another checkout, alternating (run it by hand).
    ("bench_api_path.py", ("--services", "10000", "--endpoints", "10", "--rounds", "1",
                           "--idle", "120")),
)  # fmt: skip
"""Issue 35's figures (``bench/RESULTS.md``, "The kernel's floor")."""
QUICK_API_PATH = ("--services", "1000", "--endpoints", "10", "--rounds", "1", "--idle", "20",
                  "--settle", "2")  # fmt: skip


def full_plan(idle: int = 600) -> Plan:
    return Plan(
        points=(
            _point(1000, 10, ALL),
            _point(10_000, 10, ALL),
            _point(1, 100_000, NO_YAML),
            _point(44_000, 5, ("nlproxy", "iptables-nft", "iptables-legacy")),
        ),
        change_label="10kx10",
        rounds=5,
        timeout=300,
        dp_services=(10, 1000, 10_000, 30_000),
        dp_count=3000,
        dp_budget=15,
        others=(
            ("bench_commit.py", ("--services", "10000", "--endpoints", "10")),
            ("bench_listeners.py", ("--services", "10000", "--endpoints", "10")),
            *KERNEL_FLOOR_RUNS,
            ("bench_relist.py", ("--services", "10000", "--endpoints", "10")),
            ("bench_repair.py", ("--services", "10000", "--endpoints", "10")),
            ("bench_conntrack.py", ("--flows", "100000", "--rounds", "3")),
            ("bench_kube.py", ("--services", "10000", "--endpoints", "10", "--repeat", "1")),
            ("bench_kube_pages.py", ("--services", "10000", "--rounds", "3")),
            ("bench_incremental.py", ("--services", "10000", "--endpoints", "10")),
            ("bench_isolation.py", ("--services", "10000", "--endpoints", "10")),
            ("bench_verify.py", ("--services", "10000", "--endpoints", "10")),
            ("bench_plan.py", ("--services", "10000", "--endpoints", "10", "--rounds", "2")),
            ("bench_metrics.py", ("--services", "10000", "--endpoints", "10")),
            ("bench_claims.py", ("--services", "10000", "--endpoints", "10")),
            ("bench_reload.py", ("--services", "2000", "--endpoints", "10")),
            # Issue 36's shapes: ClientIP affinity at 20 ports x 1,000 endpoints (five layouts
            # and the nft -f reference), and one Service with 10,000 externalIPs.
            ("bench_affinity.py", ("--ports", "20", "--endpoints", "1000")),
            ("bench_external_ips.py", ("--external-ips", "1000", "10000")),
            *target_runs(idle),  # bench_daemon, bench_kube_cold and bench_cli among them
        ),
    )


def target_runs(idle: int) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """What measures issue 18's targets (``targets.py``), at 10k x 10 and 44k x 5, and the input
    side (``bench_input``; 44k x 5 and 50k x 1 beside ``iptables-legacy-restore``). The daemon's
    idle window is ``idle`` seconds (RSS and CPU over it: the issue's hour is not affordable)."""
    size = ("--services", "10000", "--endpoints", "10")
    return (
        ("bench_coldpath.py", (*size, "--rounds", "3", "--burst", "5000",
                               "--formats", "json,yaml,yaml-kubectl")),
        ("bench_input.py", (*size, "--rounds", "3")),
        ("bench_coldpath.py", ("--services", "44000", "--endpoints", "5", "--formats", "json",
                               "--skip-stages")),
        ("bench_coldpath.py", ("--services", "50000", "--endpoints", "1", "--formats", "json",
                               "--skip-stages")),
        ("bench_kube_cold.py", (*size, "--bursts", "5000", "--no-list", "--timeout", "300")),
        ("bench_cli.py", ("--flows", "100000", *size, "--rounds", "5")),
        ("bench_daemon.py", (*size, "--changes", "5", "--drift-changes", "3",
                             "--idle", str(idle), "--rss-every", "10")),
    )  # fmt: skip


def targets_plan(idle: int) -> Plan:
    return Plan(
        points=(),
        change_label="10kx10",
        rounds=0,
        timeout=300,
        dp_services=(),
        dp_count=0,
        dp_budget=0,
        others=target_runs(idle),
    )


def quick_plan() -> Plan:
    return Plan(
        points=(_point(1000, 10, ALL),),
        change_label="1kx10",
        rounds=5,
        timeout=120,
        dp_services=(10, 1000),
        dp_count=1000,
        dp_budget=5,
        others=(
            ("bench_commit.py", ("--services", "1000", "--endpoints", "10")),
            ("bench_listeners.py", ("--services", "1000", "--endpoints", "10", "--rounds", "1")),
            ("bench_relist.py", ("--services", "1000", "--endpoints", "10")),
            ("bench_set_size.py", ("--services", "1000", "--rounds", "1")),
            ("bench_api_path.py", QUICK_API_PATH),
            ("bench_repair.py", ("--services", "1000", "--endpoints", "10", "--rounds", "1")),
            ("bench_conntrack.py", ("--flows", "10000", "--rounds", "2")),
            ("bench_kube.py", ("--services", "1000", "--endpoints", "10", "--repeat", "1")),
            (
                "bench_incremental.py",
                ("--services", "1000", "--endpoints", "10", "--changes", "6"),
            ),
            ("bench_daemon.py", ("--services", "1000", "--endpoints", "10", "--changes", "5")),
            (
                "bench_kube_cold.py",
                ("--services", "1000", "--endpoints", "10", "--bursts", "1000"),
            ),
            ("bench_isolation.py", ("--services", "1000", "--endpoints", "10")),
            ("bench_verify.py", ("--services", "1000", "--endpoints", "10")),
            ("bench_metrics.py", ("--services", "1000", "--endpoints", "10")),
            ("bench_claims.py", ("--services", "1000", "--endpoints", "10")),
            ("bench_reload.py", ("--services", "500", "--endpoints", "10", "--rewrites", "4")),
            ("bench_affinity.py", ("--ports", "4", "--endpoints", "100")),
            ("bench_external_ips.py", ("--external-ips", "1000")),
            (
                "bench_cli.py",
                ("--flows", "10000", "--services", "1000", "--endpoints", "10"),
            ),
        ),
    )


def machine() -> dict[str, Any]:
    mem_kib = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    return {
        "bench": "machine",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "mem_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg": os.getloadavg()[0],
        "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "nftables_listeners": listeners.nftables_listeners(),
        "nft": _version("nft", "--version"),
        "iptables": _version("iptables", "--version"),
    }


def _version(*argv: str) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.stdout.strip()


def run_others(others: Sequence[tuple[str, tuple[str, ...]]], out: Sink, timeout: float) -> None:
    """The other benchmarks, when present: their JSON lines, tagged with the script."""
    for script, args in others:
        path = BENCH / script
        if not path.exists():
            emit(out, {"bench": "other", "script": script, "error": "not present"})
            continue
        log(f"running {script} {' '.join(args)}")
        try:
            proc = subprocess.run(
                [PY, str(path), *args],
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=REPO,
                check=False,
            )
        except subprocess.TimeoutExpired:
            emit(out, {"bench": "other", "script": script, "error": f"timeout {timeout}s"})
            continue
        for line in proc.stdout.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                emit(out, {"script": script, **rec})
        if proc.returncode != 0:
            emit(
                out,
                {
                    "bench": "other",
                    "script": script,
                    "rc": proc.returncode,
                    "error": proc.stderr.strip()[-400:],
                },
            )


class Tee:
    """Writes each JSON line to stdout and to the results file."""

    def __init__(self, *outs: TextIO) -> None:
        self.outs = outs

    def write(self, s: str) -> int:
        for o in self.outs:
            o.write(s)
        return len(s)

    def flush(self) -> None:
        for o in self.outs:
            o.flush()


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small points only (< ~3 minutes)")
    ap.add_argument(
        "--targets",
        action="store_true",
        help="issue 18's targets only, at 10k x 10 and 44k x 5 (~20 minutes with --idle 600)",
    )
    ap.add_argument(
        "--idle",
        type=int,
        default=600,
        metavar="S",
        help="the daemon's idle window for CPU and RSS, seconds (default 600)",
    )
    ap.add_argument(
        "--only", default="control,dataplane,others", help="comma-separated parts to run"
    )
    ap.add_argument("--points", help="control points to run (labels, e.g. 10kx10,44kx5)")
    ap.add_argument("--variants", help="control-plane variants to run (default: each point's)")
    ap.add_argument("--scripts", help="other scripts to run (names, e.g. bench_kube_cold.py)")
    ap.add_argument(
        "--append",
        action="store_true",
        help="add to the mode's results instead of replacing them (a re-measured figure "
        "replaces the older one in the summary)",
    )
    ap.add_argument(
        "--report-only", action="store_true", help="measure nothing: redo summary and plots"
    )
    ap.add_argument(
        "--markdown", action="store_true", help="also print issue 18's tables as Markdown"
    )
    ap.add_argument("--results", type=Path, default=BENCH / "results")
    ap.add_argument("--plots", type=Path, default=BENCH / "plots")
    return ap.parse_args(argv)


def measure_all(plan: Plan, parts: set[str], out: Sink, tmp: Path, mode: str) -> None:
    t0 = time.monotonic()
    emit(out, machine())
    if "control" in parts:
        control.run_points(plan.points, plan.change_label, tmp, out, plan.timeout, plan.rounds)
    if "dataplane" in parts:
        dataplane.run(
            plan.dp_services, DP_VARIANTS, tmp, out, plan.dp_count, plan.dp_budget, plan.timeout
        )
    if "others" in parts:
        run_others(plan.others, out, 120 if mode == "quick" else 900 + plan_idle(plan))
    emit(
        out,
        {
            "bench": "run",
            "mode": mode,
            "seconds": round(time.monotonic() - t0, 1),
            "loadavg_end_1_5_15": [round(x, 2) for x in os.getloadavg()],
        },
    )


def plan_idle(plan: Plan) -> int:
    """The longest ``--idle`` among the plan's scripts (their timeout must cover it)."""
    idle = [int(a[a.index("--idle") + 1]) for _, a in plan.others if "--idle" in a]
    return max(idle, default=0)


_OUTCOME = ("error", "date", "skipped", "timed_out")
_IDENTITY = (
    "services",
    "endpoints",
    "flows",
    "round",
    "changes",
    "change",
    "updates",
    "family",
    "sample",
    "objects",
)


def _identity(r: dict[str, Any]) -> tuple[Any, ...]:
    """What a record measures (its labels, not its figures): text fields and sizes."""
    return tuple(
        sorted(
            (k, str(v))
            for k, v in r.items()
            if k not in _OUTCOME
            and (isinstance(v, str | bool) or (k in _IDENTITY and isinstance(v, int)))
        )
    )


def latest(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each measurement once: a later record of the same kind replaces an earlier one."""
    by_key: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in records:
        key = _identity(r)
        by_key.pop(key, None)
        by_key[key] = r
    derived = ("target", "target18", "machine", "run")
    kept = [r for r in by_key.values() if r.get("bench") not in derived]
    for bench in ("machine", "run"):  # the last run's
        kept += [r for r in records[::-1] if r.get("bench") == bench][:1]
    return kept


def main(argv: Sequence[str] | None = None) -> int:
    args = _args(argv)
    if os.geteuid() != 0:
        print("bench: needs root (network namespaces, nftables)", file=sys.stderr)
        return 2
    mode = "quick" if args.quick else "targets" if args.targets else "full"
    plan = {
        "quick": quick_plan,
        "targets": lambda: targets_plan(args.idle),
        "full": lambda: full_plan(args.idle),
    }[mode]()
    if args.points:
        wanted = set(args.points.split(","))
        plan = replace(plan, points=tuple(p for p in plan.points if p.label in wanted))
    if args.scripts:
        wanted = set(args.scripts.split(","))
        plan = replace(plan, others=tuple(o for o in plan.others if o[0] in wanted))
    if args.variants:
        keep = set(args.variants.split(","))
        points = tuple(
            replace(p, variants=tuple(v for v in p.variants if v in keep)) for p in plan.points
        )
        plan = replace(plan, points=points)
    args.results.mkdir(parents=True, exist_ok=True)
    jsonl = args.results / f"{mode}.jsonl"
    if not args.report_only:
        with (
            jsonl.open("a" if args.append else "w") as f,
            tempfile.TemporaryDirectory(prefix="nlpb-") as tmp,
        ):
            measure_all(plan, set(args.only.split(",")), Tee(sys.stdout, f), Path(tmp), mode)
    records = latest([json.loads(line) for line in jsonl.read_text().splitlines()])
    if not args.report_only:
        with jsonl.open("a") as f:
            for t in report.targets(records, plan.change_label):
                emit(f, t)
            for t in targets.evaluate(records):
                emit(f, t)
    text = (
        report.targets_summary(records)
        if mode == "targets"
        else report.summary(records, plan.change_label, mode)
    )
    (args.results / f"{mode}.txt").write_text(text)
    print(text)
    if args.markdown:
        print(targets.markdown(records))
    report.plots(records, args.plots, mode)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
