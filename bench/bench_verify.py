"""What one tick of the periodic verify costs an idle daemon, at S services x E endpoints.

Side by side on the same programmed namespace and the same long-lived ``Syncer``:

- ``read-back``: what every tick cost before, and still costs after a drift or a failed sync:
  the tables are read back and compared with the plan (``Syncer.verify`` + ``Syncer.sync``);
- ``quiet``: the tick when the drift monitor has processed every transaction up to the kernel's
  generation (``NftMonitor.saw_every_commit``: one GETGEN request) and the sync finds nothing
  to do.

Each row gives CPU seconds per tick (median of ``--rounds``) and per minute at the default 60 s
sync period, and the last row the ratio. Run as root:

    .venv/bin/python bench/bench_verify.py --services 10000 --endpoints 10
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_incremental import CONFIG, cluster, namespace
from nlproxy.nft.monitor import NftMonitor
from nlproxy.proxy.naming import TABLE as TABLE_NAME
from nlproxy.sync.syncer import Syncer

PERIOD = 60.0
"""The daemon's default sync period: one verify tick a minute."""


def cpu(tick: Callable[[], None], rounds: int) -> float:
    """Median CPU seconds (this process, all threads) of ``tick``."""
    samples = []
    for _ in range(rounds):
        t = time.process_time()
        tick()
        samples.append(time.process_time() - t)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    snap = cluster(args.services, args.endpoints, nodeport_every=0).snapshot()
    with namespace() as ns:
        syncer = Syncer(CONFIG, netns=ns)
        try:
            syncer.sync(snap)
            monitor = NftMonitor(TABLE_NAME, netns_name=ns)  # after the first sync, as the daemon

            def read_back() -> None:
                syncer.verify()
                syncer.sync(snap)

            def quiet() -> None:
                if not monitor.saw_every_commit():
                    raise AssertionError("the monitor missed a transaction in an idle namespace")
                syncer.sync(snap)

            rows = {"read-back": cpu(read_back, args.rounds), "quiet": cpu(quiet, args.rounds)}
        finally:
            syncer.close()
    base = {"bench": "verify", "services": args.services, "endpoints": args.endpoints}
    for variant, seconds in rows.items():
        per_minute = seconds * 60.0 / PERIOD
        print(
            json.dumps(
                {
                    **base,
                    "variant": variant,
                    "cpu_s_per_tick": round(seconds, 4),
                    "cpu_s_per_minute": round(per_minute, 4),
                }
            ),
            flush=True,
        )
    ratio = rows["read-back"] / max(rows["quiet"], 1e-6)
    print(json.dumps({**base, "variant": "ratio", "read_back_over_quiet": round(ratio, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
