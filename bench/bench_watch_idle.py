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
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.listeners import nftables_listeners  # noqa: E402
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--interval", type=float, default=0.25, help="seconds between looks")
    p.add_argument("--child", nargs=2, metavar=("MODE", "NS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], args.seconds, args.interval)
        return 0
    with namespace("wi") as ns:
        for r in range(args.rounds):
            modes = MODES[r % len(MODES) :] + MODES[: r % len(MODES)]
            for mode in modes:
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--seconds",
                        str(args.seconds),
                        "--interval",
                        str(args.interval),
                        "--child",
                        mode,
                        ns,
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                fig = json.loads(out.strip().splitlines()[-1])
                fig.update(round=r, load=os.getloadavg()[0], listeners=nftables_listeners())
                print(json.dumps(fig), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
