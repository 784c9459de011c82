"""What settling frontend claims (``cluster/claims.py``) costs the cluster state.

At S services x E endpoints from the manifests generator: applying every object to a fresh
``ClusterState`` and taking its snapshot (a cold start's state work), then one EndpointSlice
change, each with claims settled and with a state whose claims do nothing, side by side in one
run. Each row gives milliseconds (best of ``--rounds``) and the ratio with/without; a last row
gives the bytes the state's own structures hold after the cold start (``tracemalloc``, the parsed
objects built beforehand and not counted), with and without claims: the difference is what the
claims keep. No kernel:

    .venv/bin/python bench/bench_claims.py --services 10000 --endpoints 10
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from collections.abc import Iterable, Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import gen
from nlproxy.cluster import state as state_mod
from nlproxy.cluster.claims import Claims
from nlproxy.cluster.model import Change, Service, ServiceKey
from nlproxy.cluster.parse import to_change


class NoClaims(Claims):
    """Claims that never refuse anything: the state as it was before they existed."""

    def update(
        self, keys: Iterable[ServiceKey], services: Mapping[ServiceKey, Service]
    ) -> set[ServiceKey]:
        del keys, services
        return set()


def _time(changes: list[Change], one: list[Change], claims: type[Claims]) -> tuple[float, float]:
    state_mod.Claims = claims  # type: ignore[misc]
    state = state_mod.ClusterState("n1")
    t = time.perf_counter()
    state.apply(changes)
    state.snapshot()
    cold = time.perf_counter() - t
    t = time.perf_counter()
    state.apply(one)
    state.snapshot()
    return cold * 1000, (time.perf_counter() - t) * 1000


def _held(changes: list[Change], claims: type[Claims]) -> int:
    """Bytes allocated and still held once a fresh state took ``changes`` (the state's own
    structures: the objects in ``changes`` exist already)."""
    state_mod.Claims = claims  # type: ignore[misc]
    tracemalloc.start()
    try:
        state = state_mod.ClusterState("n1")
        state.apply(changes)
        state.snapshot()
        held, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del state
    return held


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    c = gen.Cluster(services=args.services, endpoints=args.endpoints)
    services = [to_change(gen.service_doc(c, i), "Service") for i in range(args.services)]
    slices = [
        to_change(d, "EndpointSlice") for i in range(args.services) for d in gen.slice_docs(c, i)
    ]
    changes = [*services, *slices]
    best: dict[str, list[float]] = {}
    for _ in range(args.rounds):  # interleaved, so both see the same machine
        for name, claims in (("with claims", Claims), ("without", NoClaims)):
            cold, one = _time(changes, [slices[0]], claims)
            prev = best.get(name, [float("inf"), float("inf")])
            best[name] = [min(prev[0], cold), min(prev[1], one)]
    held = {
        name: _held(changes, claims) for name, claims in (("with", Claims), ("without", NoClaims))
    }
    state_mod.Claims = Claims  # type: ignore[misc]
    for i, what in enumerate(("cold apply + snapshot", "one slice change")):
        row = {
            "bench": "claims",
            "what": what,
            "services": args.services,
            "endpoints": args.endpoints,
            "ms_with": round(best["with claims"][i], 3),
            "ms_without": round(best["without"][i], 3),
            "ratio": round(best["with claims"][i] / best["without"][i], 2),
        }
        print(json.dumps(row), flush=True)
    kib = 1 << 10
    row = {
        "bench": "claims",
        "what": "state memory after the cold apply",
        "services": args.services,
        "endpoints": args.endpoints,
        "kib_with": round(held["with"] / kib, 1),
        "kib_without": round(held["without"] / kib, 1),
        "claims_kib": round((held["with"] - held["without"]) / kib, 1),
    }
    print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
