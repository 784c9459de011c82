"""Initial list of N Services + N EndpointSlices from the in-repo API server: the kube source's
raw-JSON path (``json.loads`` + ``parse.to_change``) against the ``kubernetes`` client's
generated models, side by side. Prints JSON lines: seconds per variant and kind, and the ratio.

    .venv/bin/python bench/bench_kube.py [--services 10000] [--endpoints 10] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kubernetes

from nlproxy.cluster.kube import kinds
from nlproxy.cluster.kube_client import Client
from nlproxy.cluster.kube_http import Http, list_kind
from nlproxy.cluster.model import Upsert
from tests.kube.apiserver import ApiServer
from tests.objects import endpoint, endpoint_slice, service

PAGE = 500


def populate(server: ApiServer, services: int, endpoints: int) -> None:
    for i in range(services):
        name = f"svc-{i:05}"
        ip = f"10.{96 + i // 65536}.{i // 256 % 256}.{i % 256}"
        server.store.put("services", service(name, ip, namespace=f"ns-{i % 50}"))
        ips = tuple(
            f"10.{128 + i // 25000}.{i // 100 % 250}.{(i % 100) * 2 + e}" for e in range(endpoints)
        )
        slice_ = endpoint_slice(
            name, [endpoint(ip, "node-a") for ip in ips], name=f"{name}-x", namespace=f"ns-{i % 50}"
        )
        server.store.put("endpointslices", slice_)


def raw_list(http: Http, kind: str) -> int:
    spec = next(s for s in kinds("bench-node") if s.kind == kind)
    listing = list_kind(http, spec, PAGE)
    assert all(isinstance(c, Upsert) for c in listing.changes)
    return len(listing.changes)


def pages(http: Http, kind: str, decode: bool) -> int:
    """Fetch every page; ``decode`` runs ``json.loads`` (the continue token needs it anyway,
    so ``http_only`` finds it with a cheap search instead)."""
    spec = next(s for s in kinds("bench-node") if s.kind == kind)
    count, cont = 0, ""
    while True:
        params = [*spec.params(), ("limit", str(PAGE))] + ([("continue", cont)] if cont else [])
        raw = http.get(spec, params, 60)
        data = raw.read()
        raw.release_conn()
        if decode:
            body = json.loads(data)
            count += len(body["items"])
            cont = body["metadata"].get("continue", "")
        else:
            count += data.count(b'"uid": ')  # one per item
            found = re.search(rb'"continue": "([^"]*)"', data)
            cont = found.group(1).decode() if found else ""
        if not cont:
            return count


def model_list(client: Any, kind: str) -> int:
    if kind == "Service":
        call = kubernetes.client.CoreV1Api(client).list_service_for_all_namespaces
    else:
        call = kubernetes.client.DiscoveryV1Api(client).list_endpoint_slice_for_all_namespaces
    spec = next(s for s in kinds("bench-node") if s.kind == kind)
    count, cont = 0, None
    while True:
        page = call(limit=PAGE, _continue=cont, label_selector=spec.label_selector)
        count += len(page.items)
        cont = page.metadata.var_continue
        if not cont:
            return count


def best_of(repeat: int, fn: Callable[[], int]) -> tuple[float, int]:
    times, count = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        count = fn()
        times.append(time.perf_counter() - start)
    return min(times), count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    server = ApiServer()
    populate(server, args.services, args.endpoints)
    server.start()
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=server.url))
    # The source's own client, on the same configuration: one connection pool for every run,
    # as the generated models' ApiClient keeps one.
    ours = Client(client.configuration)
    http = Http(ours)
    try:
        variants: dict[str, Callable[[str], int]] = {
            "http_only": lambda k: pages(http, k, decode=False),
            "raw_json": lambda k: pages(http, k, decode=True),
            "raw_json+to_change": lambda k: raw_list(http, k),
            "generated_models": lambda k: model_list(client, k),
        }
        totals = dict.fromkeys(variants, 0.0)
        for kind in ("Service", "EndpointSlice"):
            for label, fn in variants.items():
                seconds, count = best_of(args.repeat, lambda f=fn, k=kind: f(k))
                totals[label] += seconds
                print(
                    json.dumps(
                        {
                            "bench": "kube_initial_list",
                            "variant": label,
                            "kind": kind,
                            "objects": count,
                            "endpoints_per_slice": args.endpoints,
                            "seconds": round(seconds, 4),
                        }
                    )
                )
        floor = totals["http_only"]  # serving and transfer, the same for every variant
        decode = {k: v - floor for k, v in totals.items()}
        print(
            json.dumps(
                {
                    "bench": "kube_initial_list",
                    "variant": "total",
                    "seconds": {k: round(v, 4) for k, v in totals.items()},
                    "decode_seconds_over_http": {k: round(v, 4) for k, v in decode.items()},
                    "models_over_raw_json": round(
                        totals["generated_models"] / totals["raw_json"], 2
                    ),
                    "models_decode_over_raw_json_decode": round(
                        decode["generated_models"] / decode["raw_json"], 2
                    ),
                    "models_over_source_path": round(
                        totals["generated_models"] / totals["raw_json+to_change"], 2
                    ),
                }
            )
        )
    finally:
        ours.close()
        client.close()
        server.stop()


if __name__ == "__main__":
    main()
