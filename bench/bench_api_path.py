"""The daemon's path from the API server beside ``run --once`` from a file, for two trees side by
side, alternating in one run: CPU, kernel time, kernel memory and RSS of the first sync, then the
daemon's idle CPU.

For each round, condition and tree (this checkout and ``--base DIR``, their order swapped every
round), on the same cluster (``gen.Cluster``, S Services x E endpoints):

- ``once``: ``nlproxy run --once`` from a JSON ``List`` into a fresh namespace;
- ``daemon``: ``nlproxy run --kubeconfig`` on the in-repo API server (``tests/kube``, the real
  list/watch protocol) into a fresh namespace with a route to the pods (the inspector checks
  every endpoint), until its first ``sync.applied``, then ``--settle`` seconds, then ``--idle``
  seconds of nothing happening.

A thread samples the child's ``/proc/PID/stat`` (user and system CPU, all threads), ``VmRSS``
and the host's ``SUnreclaim`` every 5 ms. Figures, per run:

- ``cpu_s``: user + system CPU seconds from spawn to the first ``sync.applied`` (``once``: to
  exit); ``to_lists_cpu_s`` and ``after_lists_cpu_s`` (daemon): before and after the source's
  lists are complete (``source.synced``);
- ``apply_sys_s`` / ``apply_user_s``: system and user CPU of the process over the first sync's
  apply (the ``duration_ms - plan_ms`` before the ``sync.applied`` line: diff, encode, the
  commit and what follows it): the kernel's time for the commit, with what a thread reading
  notifications pays meanwhile; ``apply_ms`` the window's length;
- ``sunreclaim_rise_mib``: the highest ``SUnreclaim`` in that window over its value at the
  window's start (the kernel's transient memory for the commit, and any other writer's);
- ``rss_first_sync_mb`` (sampled at the ``sync.applied`` line), ``rss_settled_mb`` and
  ``peak_rss_mb`` (VmHWM) after ``--settle``;
- ``idle_cpu_s_per_min`` over ``--idle`` seconds, with ``idle_worst_window_s_per_min``: the
  costliest 10-second window, per minute (a spike: a verify's plan), and
  ``idle_loop_thread_s_per_min``: the event loop's (main) thread's share;
- ``nftables_listeners``: members of ``NFNLGRP_NFTABLES`` on the host once the first sync is
  done (a daemon that keeps a standing monitor counts itself), and the load average.

Conditions: ``none`` (nothing of this bench's listens) and ``listener`` (a member of the group in
another namespace, reading what it gets: a foreign ``nft monitor``), for the whole run.

    .venv/bin/python bench/bench_api_path.py --base ../wt-base --services 10000 --endpoints 10
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import checkout_run, gen  # noqa: E402
from bench.bench_daemon import free_ports, stamp  # noqa: E402
from bench.bench_listeners import listener, sunreclaim_kib  # noqa: E402
from bench.listeners import nftables_listeners  # noqa: E402
from tests.kube.apiserver import ApiServer  # noqa: E402
from tests.kube.conftest import TOKEN, write_kubeconfig  # noqa: E402
from tests.netns import namespace as netns  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
EVERY = 0.005
WATCH_INTERVAL: float | None = None
WATCH_MODE = "loop"
"""``--watch-interval``: the daemons' generation watch polls this often (``watch_interval.py``)."""


class Sampler:
    """(wall time, user s, system s, RSS MiB, SUnreclaim KiB) of ``pid`` every ``EVERY`` s."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, float, float, float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        stat = f"/proc/{self.pid}/stat"
        statm = f"/proc/{self.pid}/statm"
        while not self._stop.is_set():
            try:
                with open(stat) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                with open(statm) as f:
                    rss = int(f.read().split()[1]) * PAGE / 2**20
            except (OSError, IndexError):
                return
            t = time.time()
            self.samples.append(
                (t, int(fields[11]) / TICK, int(fields[12]) / TICK, rss, sunreclaim_kib())
            )
            time.sleep(EVERY)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, t: float) -> tuple[float, float, float, float, int]:
        """The last sample taken at or before ``t`` (the first one if none)."""
        i = bisect.bisect_right(self.samples, (t, float("inf")))
        return self.samples[max(i - 1, 0)]

    def cpu(self, t: float) -> float:
        _, u, s, _, _ = self.at(t)
        return u + s

    def window(self, start: float, end: float) -> dict[str, float]:
        """System and user seconds over [start, end], and SUnreclaim's highest rise in it."""
        _, u0, s0, _, m0 = self.at(start)
        _, u1, s1, _, _ = self.at(end + 0.02)  # the line is written just after the apply
        inside = [s[4] for s in self.samples if start <= s[0] <= end + 0.02]
        return {
            "apply_sys_s": round(s1 - s0, 3),
            "apply_user_s": round(u1 - u0, 3),
            "sunreclaim_rise_mib": round((max(inside, default=m0) - m0) / 1024, 1),
        }


class Child:
    """An ``nlproxy`` process of ``tree`` with its JSON log lines collected as they come."""

    def __init__(self, tree: Path, argv: list[str], profile: Path | None = None) -> None:
        self.spawned = time.time()
        if profile is not None:
            how = [str(ROOT / "bench" / "profile_run.py"), str(profile)]
        elif WATCH_INTERVAL is not None:
            how = [str(ROOT / "bench" / "watch_interval.py"), str(WATCH_INTERVAL), WATCH_MODE]
        else:
            how = ["-m", "nlproxy"]
        self.proc = checkout_run.spawn(
            tree,
            [*how, "--log-format", "json", *argv],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
        )
        self.sampler = Sampler(self.proc.pid)
        self.lines: list[dict[str, Any]] = []
        self.tail: list[str] = []
        self.cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.tail = [*self.tail[-5:], line.rstrip()]
            with contextlib.suppress(json.JSONDecodeError):
                ev = json.loads(line)
                if isinstance(ev, dict):
                    with self.cond:
                        self.lines.append(ev)
                        self.cond.notify_all()

    def first(self, event: str, timeout: float) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            return next((e for e in self.lines if e.get("event") == event), None)

        with self.cond:
            self.cond.wait_for(lambda: found() is not None or self.proc.poll() is not None, timeout)
            ev = found()
        if ev is None:
            raise RuntimeError(f"no {event} (rc {self.proc.poll()}): {self.tail}")
        return ev

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.sampler.stop()


def apply_window(child: Child, applied: dict[str, Any]) -> dict[str, float]:
    end = stamp(applied)
    apply_ms = float(applied.get("duration_ms", 0.0)) - float(applied.get("plan_ms", 0.0))
    return {
        "apply_ms": round(apply_ms, 1),
        **child.sampler.window(end - apply_ms / 1000, end),
    }


def run_once(tree: Path, manifests: Path, timeout: float) -> dict[str, Any]:
    with netns("nlpap") as ns:
        child = Child(
            tree,
            [
                "--netns", ns, "run", "--once", "--manifests", str(manifests),
                "--node-name", gen.NODE_NAME, "--cluster-cidr", str(gen.CLUSTER_CIDR),
                "--service-cidr", str(gen.SERVICE_CIDR),
            ],
        )  # fmt: skip
        try:
            applied = child.first("sync.applied", timeout)
            listeners = nftables_listeners()
            # The process's CPU at exit: the last sample before it ended.
            rc = child.proc.wait(timeout=timeout)
            child._reader.join(timeout=5)
        finally:
            child.stop()
        _, u, s, _, _ = child.sampler.samples[-1]
        rss = max(x[3] for x in child.sampler.samples)
        return {
            "rc": rc,
            "cpu_s": round(u + s, 3),
            "sys_s": round(s, 3),
            "ops": applied.get("ops"),
            **apply_window(child, applied),
            "peak_rss_mb": round(rss, 1),
            "nftables_listeners": listeners,
        }


@contextlib.contextmanager
def pods_ns() -> Iterator[str]:
    with netns("nlpad") as ns:
        for cmd in (
            ["link", "add", "pods0", "type", "veth", "peer", "name", "pods1"],
            ["link", "set", "pods1", "up"],
            ["link", "set", "pods0", "up"],
            ["route", "add", str(gen.CLUSTER_CIDR), "dev", "pods0"],
        ):
            subprocess.run(["ip", "-n", ns, *cmd], check=True)
        yield ns


def daemon_args(ns: str, kubeconfig: Path) -> list[str]:
    """``nlproxy run``'s arguments for the bench's cluster, in namespace ``ns``."""
    healthz, metrics = free_ports(2)
    return [
        "--netns", ns, "run", "--kubeconfig", str(kubeconfig),
        "--node-name", gen.NODE_NAME, "--cluster-cidr", str(gen.CLUSTER_CIDR),
        "--service-cidr", str(gen.SERVICE_CIDR),
        "--healthz-bind-address", f"127.0.0.1:{healthz}",
        "--metrics-bind-address", f"127.0.0.1:{metrics}",
    ]  # fmt: skip


def run_daemon(
    tree: Path,
    kubeconfig: Path,
    settle: float,
    idle: float,
    timeout: float,
    profile: Path | None = None,
) -> dict[str, Any]:
    with pods_ns() as ns:
        child = Child(
            tree,
            daemon_args(ns, kubeconfig),
            profile,
        )
        try:
            applied = child.first("sync.applied", timeout)
            synced = child.first("source.synced", 5)
            listeners = nftables_listeners()
            time.sleep(settle)
            s = child.sampler
            t_applied, t_synced = stamp(applied), stamp(synced)
            spawn_cpu = s.samples[0][1] + s.samples[0][2]  # the first sample: ~0
            fig: dict[str, Any] = {
                "cpu_s": round(s.cpu(t_applied + 0.02) - spawn_cpu, 3),
                "to_lists_cpu_s": round(s.cpu(t_synced) - spawn_cpu, 3),
                "after_lists_cpu_s": round(s.cpu(t_applied + 0.02) - s.cpu(t_synced), 3),
                "to_first_sync_s": round(t_applied - child.spawned, 3),
                "after_lists_s": round(t_applied - t_synced, 3),
                "ops": applied.get("ops"),
                **apply_window(child, applied),
                "rss_first_sync_mb": round(s.at(t_applied + 0.02)[3], 1),
                "rss_settled_mb": round(s.samples[-1][3], 1),
                "peak_rss_mb": round(max(x[3] for x in s.samples), 1),
                "nftables_listeners": listeners,
            }
            if idle:
                if profile is not None:
                    child.proc.send_signal(signal.SIGUSR2)  # profile_run.py: the idle starts
                fig.update(idle_cpu(child, idle))
        finally:
            child.stop()
        return fig


def thread_cpu(pid: int, tid: int) -> float:
    """User + system CPU seconds of one thread of ``pid`` (0.0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def idle_cpu(child: Child, seconds: float) -> dict[str, Any]:
    s = child.sampler
    pid = child.proc.pid
    start = time.time()
    main0 = thread_cpu(pid, pid)  # the event loop's thread
    time.sleep(seconds)
    main1 = thread_cpu(pid, pid)
    end = time.time()
    total = s.cpu(end) - s.cpu(start)
    windows = []
    t = start
    while t + 10 <= end:
        windows.append(s.cpu(t + 10) - s.cpu(t))
        t += 10
    with child.cond:
        syncs = [e for e in child.lines if e.get("event") == "sync.applied" and stamp(e) >= start]
    return {
        "idle_s": round(end - start, 1),
        "idle_cpu_s_per_min": round(total / (end - start) * 60, 4),
        "idle_worst_window_s_per_min": round(max(windows, default=0.0) * 6, 4),
        "idle_loop_thread_s_per_min": round((main1 - main0) / (end - start) * 60, 4),
        "idle_syncs": len(syncs),
        "idle_worst_plan_ms": max((e.get("plan_ms", 0.0) for e in syncs), default=0.0),
        "idle_rss_mb": round(s.samples[-1][3], 1),
    }


def populate(api: ApiServer, cluster: gen.Cluster) -> None:
    api.store.put("nodes", gen.node_doc())
    for i in range(cluster.services):
        api.store.put("services", gen.service_doc(cluster, i))
        for doc in gen.slice_docs(cluster, i):
            api.store.put("endpointslices", doc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--services", type=int, default=10_000)
    p.add_argument("--endpoints", type=int, default=10)
    p.add_argument("--base", type=Path, help="another checkout (its .venv and shim built)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--conditions", default="none,listener")
    p.add_argument("--runs", default="once,daemon", help="which of once,daemon to run")
    p.add_argument("--settle", type=float, default=10.0)
    p.add_argument("--idle", type=float, default=0.0, help="idle seconds (condition none only)")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument(
        "--profile",
        type=Path,
        metavar="PREFIX",
        help="instead: this checkout's daemon under cProfile (profile_run.py), twice: stopped at "
        "its first sync (PREFIX.first-sync), then with --idle (PREFIX.idle.since-mark: the idle)",
    )
    p.add_argument(
        "--watch-interval",
        type=float,
        metavar="S",
        help="the daemons' generation watch polls every S seconds (watch_interval.py; a tree "
        "without the watch fails)",
    )
    p.add_argument(
        "--watch-thread",
        action="store_true",
        help="with --watch-interval: the looks from a plain thread, as shipped (else from the "
        "event loop, as before: watch_interval.py)",
    )
    args = p.parse_args(argv)
    if args.watch_thread and args.watch_interval is None:
        p.error("--watch-thread: needs --watch-interval")
    if args.watch_interval is not None:
        global WATCH_INTERVAL, WATCH_MODE
        WATCH_INTERVAL = args.watch_interval
        WATCH_MODE = "thread" if args.watch_thread else "loop"
    trees = [("head", ROOT)] + ([("base", args.base.resolve())] if args.base else [])
    runs = args.runs.split(",")
    checkout_run.prepare(tree for _, tree in trees)
    cluster = gen.Cluster(services=args.services, endpoints=args.endpoints)
    size = {"services": args.services, "endpoints": args.endpoints}
    api = ApiServer(token=TOKEN)
    api.start()
    try:
        populate(api, cluster)
        with tempfile.TemporaryDirectory(prefix="nlpap-") as tmp:
            if args.profile is not None:
                kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", api)
                prefix = args.profile.resolve()
                for stage, idle in (("first-sync", 0.0), ("idle", args.idle)):
                    out = prefix.with_name(f"{prefix.name}.{stage}")
                    fig = run_daemon(ROOT, kubeconfig, args.settle if idle else 0.0, idle,
                                     args.timeout, out)  # fmt: skip
                    print(json.dumps({"bench": "api_path_profile", "stage": stage,
                                      "profile": str(out), **size, **fig,
                                      "loadavg_1_5_15": os.getloadavg()}), flush=True)  # fmt: skip
                return 0
            manifests = Path(tmp) / "m"
            gen.write_manifests(cluster, manifests, "json")
            kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", api)
            for rnd in range(args.rounds):
                order = trees if rnd % 2 == 0 else trees[::-1]
                for cond in args.conditions.split(","):
                    with netns("nlpal") as other:
                        ctx = listener(other) if cond == "listener" else contextlib.nullcontext()
                        with ctx:
                            for name, tree in order:
                                for what in runs:
                                    load = [round(x, 2) for x in os.getloadavg()]
                                    try:
                                        if what == "once":
                                            fig = run_once(tree, manifests, args.timeout)
                                        else:
                                            fig = run_daemon(
                                                tree,
                                                kubeconfig,
                                                args.settle,
                                                args.idle if cond == "none" else 0.0,
                                                args.timeout,
                                            )
                                    except RuntimeError as e:
                                        fig = {"error": str(e)[-400:]}
                                    rec = {
                                        "bench": "api_path",
                                        "run": what,
                                        "tree": name,
                                        "condition": cond,
                                        "round": rnd,
                                        **size,
                                        **fig,
                                        "loadavg_1_5_15": load,
                                    }
                                    print(json.dumps(rec), flush=True)
    finally:
        api.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
