"""Run ``python -m nlproxy ARGS`` with the generation watch changed, for a measurement only (the
command line offers no such setting): how much of the idle daemon's CPU the watch's wake-ups
are, looked for from a thread (as shipped) or from the event loop (as before).

    .venv/bin/python bench/watch_interval.py S MODE --netns NS run --kubeconfig KC ...

S: seconds between looks (``nft/monitor.py``'s ``POLL_SECONDS`` is 0.25). MODE: ``thread`` (as
shipped: ``GenerationWatch.run`` looks from a plain thread and wakes the event loop only when
the generation moved) or ``loop`` (the earlier watch: a task that sleeps on the event loop
between looks, :func:`loop_run`).

``bench_api_path.py --watch-interval S [--watch-thread]`` runs its daemons so;
``bench_watch_idle.py`` runs the two watches alone.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Callable
from typing import Any


async def loop_run(
    watch: Any, on_moved: Callable[[int, int], None], *, task_status: Any = None
) -> None:
    """The earlier watch: a look every ``watch.interval`` seconds from a task of the event
    loop (a trio sleep and wake-up per look)."""
    import trio

    from nlproxy.nft.dump import ReadbackError

    if task_status is not None:
        task_status.started()
    while True:
        await trio.sleep(watch.interval)
        try:
            span = watch.look()
        except (ReadbackError, OSError):
            continue
        if span is not None:
            on_moved(*span)


def main() -> None:
    interval, mode, args = float(sys.argv[1]), sys.argv[2], sys.argv[3:]
    if mode not in ("loop", "thread"):
        raise SystemExit(f"watch_interval.py: MODE is loop or thread, not {mode!r}")
    import trio

    from nlproxy.nft import monitor

    defaults = monitor.GenerationWatch.__init__.__kwdefaults__
    if defaults is None or "interval" not in defaults:
        raise SystemExit("watch_interval.py: this nlproxy's GenerationWatch has no interval")
    defaults["interval"] = interval
    if mode == "loop":

        def run(
            self: Any,
            on_moved: Callable[[int, int], None],
            *,
            task_status: Any = trio.TASK_STATUS_IGNORED,
        ) -> Any:
            return loop_run(self, on_moved, task_status=task_status)

        monitor.GenerationWatch.run = run  # type: ignore[method-assign]
    sys.argv = ["nlproxy", *args]
    runpy.run_module("nlproxy", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
