"""Bursts of changed Services through one long-lived Syncer: in place against planned afresh.

At S Services x E endpoints (``bench_incremental``'s cluster, a fresh network namespace), one
cold sync, then bursts of B changed EndpointSlices (one endpoint fewer, then back), each synced
at once. Every burst size runs both ways in turn on the same Syncer: ``in-place`` swaps the
changed services' fragments (``proxy/incremental.py``), ``replanned`` plans every service afresh
(unchanged ones replayed) and compares the changed services' objects with the last plan. Both
give the same ruleset; the figures say from which share of changed services on planning afresh
is cheaper (``incremental.REPLAN_SHARE``). Prints one JSON line per burst (CPU and wall seconds
of the sync, kernel operations), then per size the medians and the ratio replanned / in-place.
Run as root:

    .venv/bin/python bench/bench_burst.py --services 10000 --endpoints 10 --sizes 1000,5000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_incremental import CONFIG, cluster, eps_slice, namespace, upsert_of

from nlproxy.proxy import incremental
from nlproxy.sync import syncer as syncer_module
from nlproxy.sync.kernel import real as real_kernel

PATHS = {"in-place": float("inf"), "replanned": 0.0}


def _with_share(share: float) -> Callable[..., Any]:
    def update(*args: Any, **kwargs: Any) -> Any:
        return incremental.plan_update(*args, replan_share=share, **kwargs)

    return update


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--services", type=int, default=10_000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--sizes", default="1000,2500,5000,9000,10000", help="burst sizes")
    ap.add_argument("--rounds", type=int, default=2, help="bursts per size and path (even)")
    args = ap.parse_args()
    sizes = [min(int(s), args.services) for s in args.sizes.split(",") if s]
    state = cluster(args.services, args.endpoints, nodeport_every=0)
    rows: list[dict[str, Any]] = []
    flip = 0
    with namespace() as ns:
        syncer = syncer_module.Syncer(CONFIG, real_kernel(ns))
        try:
            syncer.sync(state.snapshot())
            for size in sizes:
                for r in range(args.rounds):
                    # Removals and restorals alternate: each path gets both, round by round.
                    order = list(PATHS.items())
                    for path, share in order if r % 2 == 0 else order[::-1]:
                        skip = 0 if flip % 2 == 0 else None  # one endpoint fewer, then back
                        flip += 1
                        slices = [
                            upsert_of(eps_slice(i, args.endpoints, skip)) for i in range(size)
                        ]
                        changed = state.apply(slices)
                        snapshot = state.snapshot()
                        syncer_module.plan_update = _with_share(share)  # type: ignore[assignment]
                        cpu, wall = time.process_time(), time.perf_counter()
                        result = syncer.sync(snapshot, changed=changed)
                        row = {
                            "bench": "burst",
                            "services": args.services,
                            "endpoints": args.endpoints,
                            "burst": size,
                            "path": path,
                            "cpu_s": round(time.process_time() - cpu, 3),
                            "wall_s": round(time.perf_counter() - wall, 3),
                            "plan_s": round(result.plan_ms / 1000, 3),
                            "ops": result.total_ops,
                            "deltas": result.incremental,
                        }
                        print(json.dumps(row), flush=True)
                        rows.append(row)
        finally:
            syncer_module.plan_update = incremental.plan_update
            syncer.close()
    for size in sizes:
        med = {
            path: statistics.median(
                r["cpu_s"] for r in rows if r["burst"] == size and r["path"] == path
            )
            for path in PATHS
        }
        out = {"bench": "burst", "summary": True, "burst": size, "share": size / args.services}
        out |= {f"{path}_cpu_s": round(v, 3) for path, v in med.items()}
        out["replanned_over_in_place"] = round(med["replanned"] / med["in-place"], 2)
        out["loadavg_1m"] = round(os.getloadavg()[0], 2)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
