"""Run ``python -m nlproxy ARGS`` with the generation watch polling every S seconds instead of
``nft/monitor.py``'s ``POLL_SECONDS``, for a measurement only (the command line offers no such
setting): how much of the idle daemon's CPU the watch's wake-ups are.

    .venv/bin/python bench/watch_interval.py S --netns NS run --kubeconfig KC ...

``bench_api_path.py --watch-interval S`` runs its daemons so.
"""

from __future__ import annotations

import runpy
import sys


def main() -> None:
    interval, args = float(sys.argv[1]), sys.argv[2:]
    from nlproxy.nft import monitor

    defaults = monitor.GenerationWatch.__init__.__kwdefaults__
    if defaults is None or "interval" not in defaults:
        raise SystemExit("watch_interval.py: this nlproxy's GenerationWatch has no interval")
    defaults["interval"] = interval
    sys.argv = ["nlproxy", *args]
    runpy.run_module("nlproxy", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
