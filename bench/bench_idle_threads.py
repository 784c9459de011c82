"""Where an idle daemon's CPU goes: per thread and per second, beside its log lines.

The daemon runs on the in-repo API server at S Services x E endpoints (as ``bench_api_path.py``'s
``daemon`` run: same cluster, arguments and namespace), until its first ``sync.applied``, then
``--settle`` seconds; then, for ``--idle`` seconds, every thread's CPU is read from
``/proc/PID/task/TID/schedstat`` every ``--every`` seconds (this bench's own reading costs the
daemon nothing). For each tree (this checkout and ``--base DIR``) one JSON line:

- ``idle_cpu_s_per_min``: the whole process over the idle (``/proc/PID/stat``, threads gone
  included), and ``idle_worst_window_s_per_min``: its costliest 10-second window, per minute;
- ``threads``: per thread (``tid``, ``comm``, the syscall it waits in at the end: 7 poll, 232
  epoll_wait, 202 futex...) its CPU per minute from ``schedstat`` (nanoseconds: a brief wake-up
  counts, where ``stat``'s 10 ms ticks miss it), the readings in which it ran at all
  (``active_ticks``: at ``--every`` 0.5, a thread that wakes every 0.5 s has them all), and its
  worst reading, and how many times a minute it ran (``wakeups_per_min``: its context
  switches, a count that does not depend on how dear the machine makes each wake-up; the
  process's total beside ``idle_cpu_s_per_min``). Worker threads that came and went are listed
  as far as they were seen;
- ``spikes``: the readings whose process CPU is above ``--spike`` seconds, each with the threads
  that ran in it and the log lines written in it (``events``: the counts over the whole idle).

With ``--config`` the daemon also follows a ``--config`` file laid out as a ConfigMap volume
(``config.conf`` -> ``..data/config.conf``), as the shipped DaemonSet runs it; nothing changes
it during the idle.

A wake-up after a long sleep costs far more than the work it does on this kind of machine (a
bare ``poll()`` timeout: ~30 us every 5 ms, 150-600 us every 0.5 s, caches cold): the figure
that matters is how many wake-ups each thread makes.

    .venv/bin/python bench/bench_idle_threads.py --base ../wt-base --idle 120
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import checkout_run, gen  # noqa: E402
from bench.bench_api_path import TICK, Child, daemon_args, pods_ns, populate  # noqa: E402
from bench.bench_daemon import stamp  # noqa: E402
from tests.kube.apiserver import ApiServer  # noqa: E402
from tests.kube.conftest import TOKEN, write_kubeconfig  # noqa: E402


def task_cpu(pid: int) -> dict[int, float]:
    """Each thread's CPU seconds now, to the nanosecond (``schedstat``'s time on a CPU)."""
    out: dict[int, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0]) / 1e9
        except (OSError, IndexError, ValueError):
            continue
    return out


def task_wakeups(pid: int) -> dict[int, int]:
    """Each thread's context switches so far (``voluntary_`` plus ``nonvoluntary_ctxt_switches``):
    how many times it ran, a count that does not depend on how cold the machine makes a wake-up."""
    out: dict[int, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                out[int(tid)] = sum(int(ln.split()[1]) for ln in f if "ctxt_switches:" in ln)
        except (OSError, IndexError, ValueError):
            continue
    return out


def process_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def comm(pid: int, tid: int) -> str:
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return "?"


def syscall(pid: int, tid: int) -> str:
    """The syscall number a thread waits in (``/proc/.../syscall``'s first field)."""
    try:
        return Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split()[0]
    except (OSError, IndexError):
        return "?"


CONFIG = """apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
"""


def config_volume(root: Path) -> Path:
    """A ConfigMap volume's layout holding :data:`CONFIG`; the path the daemon is given."""
    data = root / "..2026_01_01_00_00_00.000000001"
    data.mkdir(parents=True)
    (data / "config.conf").write_text(CONFIG)
    (root / "..data").symlink_to(data.name)
    (root / "config.conf").symlink_to("..data/config.conf")
    return root / "config.conf"


def run(
    tree: Path, kubeconfig: Path, args: argparse.Namespace, config: Path | None = None
) -> dict[str, Any]:
    extra = ["--config", str(config)] if config is not None else []
    with pods_ns() as ns:
        child = Child(tree, daemon_args(ns, kubeconfig) + extra)
        try:
            child.first("sync.applied", args.timeout)
            time.sleep(args.settle)
            pid = child.proc.pid
            start = time.time()
            ticks: list[tuple[float, float, dict[int, float]]] = [
                (start, process_cpu(pid), task_cpu(pid))
            ]
            first_wakes = task_wakeups(pid)
            wakes = dict(first_wakes)  # each thread's last count seen (threads come and go)
            while time.time() - start < args.idle:
                time.sleep(args.every)
                ticks.append((time.time(), process_cpu(pid), task_cpu(pid)))
                wakes.update(task_wakeups(pid))
            end = ticks[-1][0]
            names = {tid: comm(pid, tid) for tid in ticks[-1][2]}
            waits = {tid: syscall(pid, tid) for tid in ticks[-1][2]}
        finally:
            child.stop()
    with child.cond:
        lines = [e for e in child.lines if start <= stamp(e) <= end]
    per: dict[int, list[float]] = {}
    for (_, _, a), (_, _, b) in itertools.pairwise(ticks):
        for tid, cpu in b.items():
            per.setdefault(tid, []).append(cpu - a.get(tid, 0.0))
    span = end - start
    threads = sorted(
        (
            {
                "tid": tid,
                "comm": names.get(tid, "?"),
                "waits_in_syscall": waits.get(tid, "?"),
                "s_per_min": round(sum(d) / span * 60, 4),
                "wakeups_per_min": round(
                    (wakes.get(tid, 0) - first_wakes.get(tid, 0)) / span * 60, 1
                ),
                "active_ticks": sum(1 for x in d if x > 0),
                "worst_tick_s": round(max(d, default=0.0), 3),
            }
            for tid, d in per.items()
        ),
        key=lambda t: -float(t["s_per_min"]),
    )
    spikes = []
    for (t0, c0, a), (t1, c1, b) in itertools.pairwise(ticks):
        if c1 - c0 < args.spike:
            continue
        spikes.append(
            {
                "at_s": round(t0 - start, 1),
                "cpu_s": round(c1 - c0, 3),
                "threads": {
                    str(t): round(v - a.get(t, 0.0), 3) for t, v in b.items() if v > a.get(t, 0.0)
                },
                "events": [e.get("event") for e in lines if t0 - 0.05 <= stamp(e) <= t1 + 0.05],
            }
        )
    windows = []  # each reading's last 10 s (as near as the readings fall), per minute
    i = 0
    for t, c, _ in ticks:
        while ticks[i][0] < t - 10:
            i += 1
        if t - ticks[0][0] >= 10 and t > ticks[i][0]:
            windows.append((c - ticks[i][1]) / (t - ticks[i][0]) * 60)
    total = ticks[-1][1] - ticks[0][1]
    events: dict[str, int] = {}
    for e in lines:
        events[str(e.get("event"))] = events.get(str(e.get("event")), 0) + 1
    return {
        "pid": pid,
        "every_s": args.every,
        "wakeups_per_min": round(
            sum(n - first_wakes.get(t, 0) for t, n in wakes.items()) / span * 60, 1
        ),
        "idle_s": round(span, 1),
        "idle_cpu_s_per_min": round(total / span * 60, 4),
        "idle_worst_window_s_per_min": round(max(windows, default=0.0), 4),
        "threads": threads,
        "spikes": spikes,
        "events": events,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--services", type=int, default=10_000)
    p.add_argument("--endpoints", type=int, default=10)
    p.add_argument("--base", type=Path, help="another checkout (its .venv and shim built)")
    p.add_argument("--settle", type=float, default=10.0)
    p.add_argument("--idle", type=float, default=60.0)
    p.add_argument("--every", type=float, default=1.0, help="seconds between two readings")
    p.add_argument("--spike", type=float, default=0.03, help="CPU s in one reading to list")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument(
        "--config", action="store_true", help="follow a --config file, as the DaemonSet does"
    )
    args = p.parse_args(argv)
    trees = [("head", ROOT)] + ([("base", args.base.resolve())] if args.base else [])
    checkout_run.prepare(tree for _, tree in trees)
    cluster = gen.Cluster(services=args.services, endpoints=args.endpoints)
    api = ApiServer(token=TOKEN)
    api.start()
    try:
        populate(api, cluster)
        with tempfile.TemporaryDirectory(prefix="nlpit-") as tmp:
            kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", api)
            config = config_volume(Path(tmp) / "config") if args.config else None
            for name, tree in trees:
                load = [round(x, 2) for x in os.getloadavg()]
                fig = run(tree, kubeconfig, args, config)
                rec = {
                    "bench": "idle_threads",
                    "tree": name,
                    "services": args.services,
                    "endpoints": args.endpoints,
                    "config": args.config,
                    **fig,
                    "loadavg_1_5_15": load,
                }
                print(json.dumps(rec), flush=True)
    finally:
        api.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
