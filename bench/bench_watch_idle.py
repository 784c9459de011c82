"""The generation watch alone, idle: the CPU of a process that runs nothing but the watch, looked
for by the native shim's thread (``thread``, as shipped), from a Python thread (``pythread``,
the watch before it) and from the event loop (``loop``, the first watch), side by side.

For each round and mode (their order rotated every round), a child process enters trio, starts
the watch on a fresh namespace where nothing commits, and after a second of warm-up reads its
own ``/proc/self/stat`` (user + system, all threads; whole ticks) and the threads'
``schedstat`` (the scheduler's exact runtime) over ``--seconds`` seconds of idling. The figures
per mode are the CPU per minute by each; the host's load average and its ``NFNLGRP_NFTABLES``
listeners are printed beside it (the machine may be shared).

    .venv/bin/python bench/bench_watch_idle.py --seconds 60 --rounds 3 --interval 0.5

``--daemon``: instead, the whole idle daemon, this checkout's and ``--base DIR``'s alternately
(``bench_api_path.py``'s daemon on the in-repo API server, ``--services`` x ``--endpoints``):
10 s after its first sync, the ``schedstat`` of each of its threads over ``--seconds`` seconds,
split into the event loop's (main) thread, the watch's (the thread that woke at least once per
look) and the others. ``bench_api_path.py``'s idle figures come from ``/proc/PID/stat``, whole
ticks (0.005 s/min over 120 s); these are exact.

    .venv/bin/python bench/bench_watch_idle.py --daemon --base ../wt-base --seconds 60
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import gen  # noqa: E402
from bench.listeners import nftables_listeners  # noqa: E402
from nlproxy.nft.monitor import POLL_SECONDS  # noqa: E402
from tests.netns import namespace  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
MODES = ("loop", "pythread", "thread")


def cpu_s() -> float:
    """This process's user + system CPU seconds, all threads."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def run_ns() -> float:
    """This process's CPU seconds from the scheduler's own clock (``schedstat``, every thread):
    exact, where ``/proc/self/stat`` counts whole ticks, which a wake-up that lands on one pays
    in full."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            total += int(f.read().split()[0])
    return total / 1e9


async def py_thread_run(
    watch: Any,
    on_moved: Callable[[int, int], None],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The watch before the shim's thread: a plain Python thread that looks every
    ``watch.interval`` seconds and hands a move to the event loop."""
    token = trio.lowlevel.current_trio_token()
    send, recv = trio.open_memory_channel[tuple[int, int]](math.inf)
    stop = threading.Event()

    def poll() -> None:
        with contextlib.suppress(trio.RunFinishedError):
            while not stop.wait(watch.interval):
                with contextlib.suppress(OSError):
                    span = watch.look()
                    if span is not None:
                        token.run_sync_soon(send.send_nowait, span)

    threading.Thread(target=poll, name="generation-watch", daemon=True).start()
    task_status.started()
    try:
        async for after, upto in recv:
            on_moved(after, upto)
    finally:
        stop.set()


def child(mode: str, ns: str, seconds: float, interval: float) -> None:
    """Run the watch in ``mode`` for ``seconds`` and print its CPU as one JSON line."""
    from bench.watch_interval import loop_run
    from nlproxy.nft.monitor import GenerationWatch

    async def main() -> None:
        watch = GenerationWatch(netns_name=ns, interval=interval)
        moves: list[tuple[int, int]] = []
        async with trio.open_nursery() as nursery:
            if mode == "thread":
                await nursery.start(watch.run, lambda a, b: moves.append((a, b)))
            elif mode == "pythread":
                await nursery.start(py_thread_run, watch, lambda a, b: moves.append((a, b)))
            else:
                await nursery.start(loop_run, watch, lambda a, b: moves.append((a, b)))
            await trio.sleep(1.0)
            looks, t0, c0, r0 = watch.looks, time.monotonic(), cpu_s(), run_ns()
            await trio.sleep(seconds)
            c1, t1, r1 = cpu_s(), time.monotonic(), run_ns()
            nursery.cancel_scope.cancel()
        print(
            json.dumps(
                {
                    "bench": "watch_idle",
                    "mode": mode,
                    "interval_s": interval,
                    "seconds": round(t1 - t0, 1),
                    "looks": watch.looks - looks,
                    "moves": len(moves),
                    "cpu_s_per_min": round((c1 - c0) / (t1 - t0) * 60, 4),
                    "schedstat_s_per_min": round((r1 - r0) / (t1 - t0) * 60, 4),
                }
            )
        )

    trio.run(main)


def thread_runtimes(pid: int) -> dict[str, tuple[int, int]]:
    """Each thread of ``pid``: (runtime ns, wake-ups), from its ``schedstat``."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            run, _, wakes = f.read().split()[:3]
            out[tid] = (int(run), int(wakes))
    return out


def daemon_idle(tree: Path, kubeconfig: Path, seconds: float, interval: float) -> dict[str, Any]:
    """The idle daemon of ``tree``: CPU per minute of its threads, by kind."""
    from bench import bench_api_path as api_path

    with api_path.pods_ns() as ns:
        child = api_path.Child(tree, api_path.daemon_args(ns, kubeconfig))
        try:
            child.first("sync.applied", 300)
            time.sleep(10)
            pid = child.proc.pid
            load = [round(x, 2) for x in os.getloadavg()]
            before, t0 = thread_runtimes(pid), time.monotonic()
            time.sleep(seconds)
            after, t1 = thread_runtimes(pid), time.monotonic()
        finally:
            child.stop()
    per_min = 60 / (t1 - t0)
    kinds = {"loop": 0.0, "watch": 0.0, "other": 0.0}
    for tid, (run, wakes) in after.items():
        run0, wakes0 = before.get(tid, (0, 0))
        if tid == str(pid):
            kind = "loop"
        elif wakes - wakes0 >= 0.9 * (t1 - t0) / interval:
            kind = "watch"
        else:
            kind = "other"  # threads that ended within the window are not counted
        kinds[kind] += (run - run0) / 1e9 * per_min
    return {
        "idle_s": round(t1 - t0, 1),
        "cpu_s_per_min": round(sum(kinds.values()), 4),
        **{f"{k}_s_per_min": round(v, 4) for k, v in kinds.items()},
        "loadavg_1_5_15": load,
    }


def daemons(args: argparse.Namespace) -> None:
    from bench import bench_api_path as api_path
    from bench import checkout_run
    from tests.kube.apiserver import ApiServer
    from tests.kube.conftest import TOKEN, write_kubeconfig

    trees = [("head", ROOT)] + ([("base", args.base.resolve())] if args.base else [])
    checkout_run.prepare(tree for _, tree in trees)
    cluster = gen.Cluster(services=args.services, endpoints=args.endpoints)
    api = ApiServer(token=TOKEN)
    api.start()
    try:
        api_path.populate(api, cluster)
        with tempfile.TemporaryDirectory(prefix="nlpwi-") as tmp:
            kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", api)
            for r in range(args.rounds):
                for name, tree in trees if r % 2 == 0 else trees[::-1]:
                    fig = daemon_idle(tree, kubeconfig, args.seconds, POLL_SECONDS)
                    rec = {"bench": "watch_idle_daemon", "tree": name, "round": r,
                           "services": args.services, "endpoints": args.endpoints,
                           **fig, "nftables_listeners": nftables_listeners()}  # fmt: skip
                    print(json.dumps(rec), flush=True)
    finally:
        api.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--interval", type=float, default=0.25, help="seconds between looks")
    p.add_argument("--child", nargs=2, metavar=("MODE", "NS"), help=argparse.SUPPRESS)
    p.add_argument("--daemon", action="store_true", help="the whole idle daemon instead")
    p.add_argument("--base", type=Path, help="--daemon: another checkout (its .venv built)")
    p.add_argument("--services", type=int, default=10_000)
    p.add_argument("--endpoints", type=int, default=10)
    args = p.parse_args(argv)
    if args.daemon:
        daemons(args)
        return 0
    if args.child:
        child(args.child[0], args.child[1], args.seconds, args.interval)
        return 0
    from bench import checkout_run

    checkout_run.prepare([ROOT])
    timing = ["--seconds", str(args.seconds), "--interval", str(args.interval)]
    with namespace("wi") as ns:
        for r in range(args.rounds):
            modes = MODES[r % len(MODES) :] + MODES[: r % len(MODES)]
            for mode in modes:
                argv = [Path(__file__).resolve(), *timing, "--child", mode, ns]
                fig = checkout_run.json_result("bench_watch_idle", ROOT, argv)
                fig.update(round=r, load=os.getloadavg()[0], listeners=nftables_listeners())
                print(json.dumps(fig), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
