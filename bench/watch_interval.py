"""Run ``python -m nlproxy ARGS`` with the generation watch changed, for a measurement only (the
command line offers no such setting): how much of the idle daemon's CPU the watch's wake-ups
are, and what a look from a plain thread would cost instead.

    .venv/bin/python bench/watch_interval.py S MODE --netns NS run --kubeconfig KC ...

S: seconds between looks (``nft/monitor.py``'s ``POLL_SECONDS`` is 0.25). MODE: ``loop`` (as
shipped: ``GenerationWatch.run`` sleeps on the event loop) or ``thread`` (a sketch of the
alternative: a plain thread looks, and calls into the event loop only when the generation
moved; it shares the watch's socket with ``current()`` on the loop, which the real thing must
not: measure idle with it, nothing else).

``bench_api_path.py --watch-interval S [--watch-thread]`` runs its daemons so.
"""

from __future__ import annotations

import runpy
import sys
import threading
from collections.abc import Callable
from typing import Any


def threaded_run(watch: Any, on_moved: Callable[[int, int], None], task_status: Any) -> Any:
    import trio

    from nlproxy.nft.dump import ReadbackError

    async def run() -> None:
        token = trio.lowlevel.current_trio_token()
        stop = threading.Event()

        def poll() -> None:
            while not stop.wait(watch.interval):
                try:
                    span = watch.look()
                except (ReadbackError, OSError):
                    continue
                if span is not None:
                    try:
                        trio.from_thread.run_sync(on_moved, *span, trio_token=token)
                    except trio.RunFinishedError:
                        return

        thread = threading.Thread(target=poll, name="generation-watch", daemon=True)
        thread.start()
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            stop.set()
            thread.join()
            watch._sock.close()

    return run()


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
    if mode == "thread":

        def run(
            self: Any,
            on_moved: Callable[[int, int], None],
            *,
            task_status: Any = trio.TASK_STATUS_IGNORED,
        ) -> Any:
            return threaded_run(self, on_moved, task_status)

        monitor.GenerationWatch.run = run  # type: ignore[method-assign]
    sys.argv = ["nlproxy", *args]
    runpy.run_module("nlproxy", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
