"""Run ``python -m nlproxy ARGS`` with every thread profiled by cProfile, and write the merged
profile to OUT (``pstats`` format) when the process ends (SIGTERM included: the daemon ends
normally on it; its ``os._exit`` writes first). A SIGUSR2 marks a moment: what ran after the
last mark is also written, to ``OUT.since-mark`` (call counts and times only, no callers): the
idle minutes of a daemon, say.

The main thread is profiled from the start; each thread started later (trio's worker threads,
the inspector's) gets its own profiler on its first event. cProfile slows the process down
about twofold: the shares are what to read, not the seconds.

    .venv/bin/python bench/profile_run.py OUT.pstats --netns NS run --kubeconfig KC ...
    .venv/bin/python -m pstats OUT.pstats      # then: sort tottime, stats 30

``bench_api_path.py --profile PREFIX`` uses it for the daemon's first sync and its idle minutes.
"""

from __future__ import annotations

import contextlib
import cProfile
import os
import pstats
import runpy
import signal
import sys
import threading
from types import FrameType
from typing import Any

PROFILES: list[cProfile.Profile] = []
LOCK = threading.Lock()


def _thread_start(frame: FrameType, event: str, arg: Any) -> None:
    """The first profile event of a new thread: hand the thread to a profiler of its own."""
    sys.setprofile(None)
    prof = cProfile.Profile()
    with LOCK:
        PROFILES.append(prof)
    prof.enable()


Row = tuple[int, int, float, float]
"""Per function: primitive calls, calls, own time, cumulative time."""


class Snapshot:
    """Merged figures of every thread's profiler, in the form ``pstats.Stats`` loads."""

    def __init__(self, stats: dict[Any, tuple[int, int, float, float, dict[Any, Any]]]) -> None:
        self.stats = stats

    def create_stats(self) -> None:
        pass


def snapshot() -> dict[Any, Row]:
    """Every thread's figures so far, summed per function (profiling goes on)."""
    with LOCK:
        profiles = list(PROFILES)
    merged: dict[Any, Row] = {}
    for prof in profiles:
        with contextlib.suppress(Exception):  # a thread's profiler that never ran
            prof.snapshot_stats()  # type: ignore[attr-defined]
            for func, (cc, nc, tt, ct, _) in prof.stats.items():  # type: ignore[attr-defined]
                a, b, c, d = merged.get(func, (0, 0, 0.0, 0.0))
                merged[func] = (a + cc, b + nc, c + tt, d + ct)
    return merged


MARK: dict[Any, Row] | None = None


def _mark(*_: object) -> None:
    global MARK
    MARK = snapshot()


def write(rows: dict[Any, Row], out: str) -> None:
    stats = {f: (*r, {}) for f, r in rows.items() if r[1] > 0}
    pstats.Stats(Snapshot(stats)).dump_stats(out)  # type: ignore[arg-type]


def dump(out: str) -> None:
    final = snapshot()
    write(final, out)
    if MARK is not None:
        zero = (0, 0, 0.0, 0.0)
        since = {
            f: tuple(x - y for x, y in zip(r, MARK.get(f, zero), strict=True))
            for f, r in final.items()
        }
        write(since, f"{out}.since-mark")  # type: ignore[arg-type]


def main() -> None:
    out, args = sys.argv[1], sys.argv[2:]
    sys.argv = ["nlproxy", *args]
    main_prof = cProfile.Profile()
    PROFILES.append(main_prof)
    threading.setprofile(_thread_start)
    # SIGTERM before the daemon installs its own handler still ends here, with a profile.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGUSR2, _mark)
    real_exit = os._exit

    def exit_now(status: int) -> None:  # nlproxy ends at once (_fastexit): write first
        main_prof.disable()
        dump(out)
        real_exit(status)

    os._exit = exit_now  # type: ignore[assignment]
    main_prof.enable()
    try:
        runpy.run_module("nlproxy", run_name="__main__", alter_sys=True)
    finally:
        main_prof.disable()
        dump(out)


if __name__ == "__main__":
    main()
