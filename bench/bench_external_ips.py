"""What one Service with many externalIPs costs the cluster state (its claims settled).

One Service holding N externalIPs (``--external-ips``) applied to a fresh ``ClusterState``,
then the same Service with one address more: milliseconds, best of ``--rounds``, per N, so the
growth shows (linear: each address is looked up, not compared with every other). No kernel:

    .venv/bin/python bench/bench_external_ips.py --external-ips 1000 10000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nlproxy.cluster.parse import to_change
from nlproxy.cluster.state import ClusterState


def _service(count: int) -> dict[str, Any]:
    ips = [f"203.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}" for i in range(1, count + 1)]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "many", "namespace": "default", "resourceVersion": "1"},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": "10.96.0.50",
            "clusterIPs": ["10.96.0.50"],
            "ports": [{"name": "tcp", "protocol": "TCP", "port": 80, "targetPort": 8080}],
            "externalIPs": ips,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--external-ips", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    for count in args.external_ips:
        first = to_change(_service(count), "Service")
        again = to_change(_service(count + 1), "Service")
        best = [float("inf"), float("inf")]
        for _ in range(args.rounds):
            state = ClusterState("n1")
            t = time.perf_counter()
            state.apply([first])
            best[0] = min(best[0], time.perf_counter() - t)
            t = time.perf_counter()
            state.apply([again])
            best[1] = min(best[1], time.perf_counter() - t)
        row = {
            "bench": "external_ips",
            "external_ips": count,
            "apply_ms": round(best[0] * 1000, 3),
            "change_ms": round(best[1] * 1000, 3),
        }
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
