"""What recording kube-proxy's metrics costs a sync, next to planning the same cluster.

At S services x E endpoints (one in ``--local-every`` with ``internalTrafficPolicy: Local`` and
its endpoints on other nodes, so the no-local-endpoints gauge has something to count): the
planner's full plan, the no-local-endpoints recount after a full sync (every service) and
after an incremental one (one changed service), and one ``/metrics`` exposition. Each row gives
milliseconds (best of ``--rounds``) and the ratio to the plan. No kernel needed:

    .venv/bin/python bench/bench_metrics.py --services 10000 --endpoints 10
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import CollectorRegistry

from bench.bench_incremental import CONFIG, cluster
from nlproxy.cluster.model import ClusterSnapshot
from nlproxy.proxy.planner import plan
from nlproxy.serve.metrics import Metrics, NoLocalEndpoints


def best_ms(fn: Callable[[], object], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1000


def with_local_policy(snap: ClusterSnapshot, every: int) -> ClusterSnapshot:
    """Every ``every``-th service gets a Local internal policy and only remote endpoints."""
    chosen = {key for i, key in enumerate(sorted(snap.services)) if i % every == 0}
    services = {
        key: msgspec.structs.replace(svc, internal_policy_local=True) if key in chosen else svc
        for key, svc in snap.services.items()
    }
    slices = {
        key: tuple(
            msgspec.structs.replace(
                sl,
                endpoints=tuple(
                    msgspec.structs.replace(ep, node_name="elsewhere") for ep in sl.endpoints
                ),
            )
            for sl in group
        )
        if key in chosen
        else group
        for key, group in snap.slices.items()
    }
    return replace(snap, services=services, slices=slices)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--local-every", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    snap = with_local_policy(
        cluster(args.services, args.endpoints, nodeport_every=0).snapshot(), args.local_every
    )
    planned = plan(snap, CONFIG)
    metrics = Metrics(CollectorRegistry())
    tracker = NoLocalEndpoints(metrics.no_local_endpoints)
    one = {next(iter(snap.services))}
    figures = {
        "plan": best_ms(lambda: plan(snap, CONFIG), max(1, args.rounds // 2)),
        "no-local recount, full sync": best_ms(lambda: tracker.update(planned, None), args.rounds),
        "no-local recount, one service": best_ms(lambda: tracker.update(planned, one), args.rounds),
        "exposition": best_ms(metrics.exposition, args.rounds),
    }
    counted = metrics.registry.get_sample_value(
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
        {"ip_family": "IPv4", "traffic_policy": "internal"},
    )
    for what, ms in figures.items():
        row = {
            "bench": "metrics",
            "what": what,
            "services": args.services,
            "endpoints": args.endpoints,
            "ms": round(ms, 3),
            "ratio_to_plan": round(ms / figures["plan"], 5),
            "no_local_counted": counted,
        }
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
