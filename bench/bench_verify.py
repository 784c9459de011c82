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

``--restart-once``: instead, ``run --once`` restarted with nothing changed (the tables' restart
records vouch for them: nothing planned, read back or diffed), as a child process: wall, user and
sys seconds per round (after a cold run into a fresh namespace), with the load average. With
``--baseline DIR`` (a source tree of another nlproxy, e.g. ``git archive main`` with its shim
built) the same rounds run that tree's ``nlproxy`` too, interleaved, and a ratio row follows::

    .venv/bin/python bench/bench_verify.py --restart-once --baseline /tmp/base --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_incremental import CONFIG, cluster, namespace
from nlproxy.nft.monitor import NftMonitor
from nlproxy.proxy.naming import TABLE as TABLE_NAME
from nlproxy.sync.kernel import real as real_kernel
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


def restart_once(services: int, endpoints: int, rounds: int, baseline: Path | None) -> None:
    """``run --once`` cold, then restarted unchanged, per tree; the restart is measured."""
    from bench import gen
    from bench.measure import BenchError, netns, nlproxy_argv, run_measured, sync_applied

    root = Path(__file__).resolve().parent.parent
    trees = {"after": root, **({"before": baseline} if baseline is not None else {})}
    c = gen.Cluster(services=services, endpoints=endpoints)
    base = {"bench": "verify", "what": "restart_once", "services": services}
    walls: dict[str, list[float]] = {label: [] for label in trees}
    cpus: dict[str, list[float]] = {label: [] for label in trees}
    with tempfile.TemporaryDirectory() as tmp:
        manifests = Path(tmp) / "m"
        gen.write_manifests(c, manifests, "json")
        for n in range(rounds):
            for label, tree in trees.items():
                env = {**os.environ, "PYTHONPATH": str(tree)}
                with netns("rstonce") as ns:
                    argv = nlproxy_argv(ns, manifests)
                    for phase in ("cold", "restart"):
                        u = run_measured(argv, timeout=900, env=env)
                        if u.rc != 0:
                            raise BenchError(f"run --once {label} {phase}: {u.stderr[-400:]}")
                    line = sync_applied(u.stderr)
                    walls[label].append(u.wall)
                    cpus[label].append(u.user + u.sys)
                    print(
                        json.dumps(
                            {
                                **base,
                                "endpoints": endpoints,
                                "variant": label,
                                "round": n,
                                **u.figures(),
                                "cpu_s": round(u.user + u.sys, 3),
                                "ops": line.get("ops"),
                                "unchanged": line.get("unchanged"),
                                "loadavg_1m": round(os.getloadavg()[0], 2),
                            }
                        ),
                        flush=True,
                    )
    if baseline is not None:
        before_wall, after_wall = (statistics.median(walls[k]) for k in ("before", "after"))
        before_cpu, after_cpu = (statistics.median(cpus[k]) for k in ("before", "after"))
        ratio = {
            "variant": "ratio",
            "wall_before_over_after": round(before_wall / max(after_wall, 1e-6), 2),
            "cpu_before_over_after": round(before_cpu / max(after_cpu, 1e-6), 2),
            "median_wall_s": {"before": round(before_wall, 3), "after": round(after_wall, 3)},
            "median_cpu_s": {"before": round(before_cpu, 3), "after": round(after_cpu, 3)},
        }
        print(json.dumps({**base, "endpoints": endpoints, **ratio}), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--restart-once", action="store_true", help="see the module docstring")
    parser.add_argument("--baseline", type=Path, metavar="DIR", help="another nlproxy's tree")
    args = parser.parse_args(argv)
    if args.restart_once:
        restart_once(args.services, args.endpoints, args.rounds, args.baseline)
        return 0
    snap = cluster(args.services, args.endpoints, nodeport_every=0).snapshot()
    with namespace() as ns:
        syncer = Syncer(CONFIG, real_kernel(ns))
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
