"""Incremental sync: a one-endpoint change at S services x E endpoints, in place vs full path.

For each variant, a fresh network namespace and a long-lived ``Syncer``: one cold sync of the
whole cluster, then single-endpoint changes on different services (first one endpoint removed
from each of C/2 services, then each put back), every change through the cluster state as the
daemon sees it. Variants:

- ``incremental``: the changed services come from ``ClusterState.apply`` (``changed=``);
- ``incremental-scan``: ``changed`` left out, the Syncer finds them by identity (what callers
  that pass nothing get);
- ``full``: ``Syncer(incremental=False)``, every service planned (unchanged ones replayed) and
  the whole table diffed, as before in-place updates.

Prints one JSON line per change (plan, diff, commit and sync ms, operations), then per variant
the p50/p99 of each, then the ratios full / incremental. Run as root:

    .venv/bin/python bench/bench_incremental.py --services 10000 --endpoints 10
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nlproxy.cluster.model import (
    Endpoint,
    EndpointPort,
    EndpointSlice,
    IPFamily,
    Node,
    ObjectRef,
    Protocol,
    Service,
    ServiceKey,
    ServicePort,
    ServicePortRef,
    ServiceType,
    Upsert,
)
from nlproxy.cluster.state import ClusterState
from nlproxy.proxy.config import ProxyConfig
from nlproxy.sync.kernel import real as real_kernel
from nlproxy.sync.syncer import Syncer, SyncResult
from tests import netns

NODE = "node-0"
SERVICE_BASE = int(IPv4Address("10.96.0.0"))
POD_BASE = int(IPv4Address("10.128.0.0"))
CONFIG = ProxyConfig(
    node_name=NODE,
    cluster_cidrs=(IPv4Network("10.128.0.0/9"),),
    service_cidrs=(IPv4Network("10.96.0.0/12"),),
)


def _key(i: int) -> ServiceKey:
    return ServiceKey(namespace=f"ns-{i % 50}", name=f"svc-{i:06d}")


def service(i: int, nodeport: bool) -> Service:
    key = _key(i)
    ref = ServicePortRef(
        namespace=key.namespace, name=key.name, port_name="http", protocol=Protocol.TCP
    )
    sp = ServicePort(ref=ref, port=80, target_port=8080, node_port=30000 + i if nodeport else None)
    return Service(
        key=key,
        type=ServiceType.NODE_PORT if nodeport else ServiceType.CLUSTER_IP,
        cluster_ips=(IPv4Address(SERVICE_BASE + 1 + i),),
        ports=(sp,),
    )


def eps_slice(i: int, endpoints: int, skip: int | None = None) -> EndpointSlice:
    key = _key(i)
    eps = tuple(
        Endpoint(
            ip=IPv4Address(POD_BASE + i * 64 + j),
            ready=True,
            serving=True,
            terminating=False,
            node_name=f"node-{j % 3}",
        )
        for j in range(endpoints)
        if j != skip
    )
    return EndpointSlice(
        namespace=key.namespace,
        name=f"{key.name}-abcde",
        service=key,
        family=IPFamily.IPV4,
        ports=(EndpointPort(name="http", port=8080, protocol=Protocol.TCP),),
        endpoints=eps,
    )


def upsert_of(obj: Service | EndpointSlice | Node) -> Upsert:
    match obj:
        case Service():
            ref = ObjectRef(kind="Service", namespace=obj.key.namespace, name=obj.key.name)
        case EndpointSlice():
            ref = ObjectRef(kind="EndpointSlice", namespace=obj.namespace, name=obj.name)
        case Node():
            ref = ObjectRef(kind="Node", namespace="", name=obj.name)
    return Upsert(ref=ref, obj=obj)


def cluster(services: int, endpoints: int, nodeport_every: int) -> ClusterState:
    state = ClusterState(NODE)
    node = Node(name=NODE, zone=None, addresses=(IPv4Address("192.168.77.1"),))
    changes = [upsert_of(node)]
    for i in range(services):
        changes.append(upsert_of(service(i, bool(nodeport_every) and i % nodeport_every == 0)))
        changes.append(upsert_of(eps_slice(i, endpoints)))
    state.apply(changes)
    return state


@contextmanager
def namespace() -> Iterator[str]:
    name = netns.create(netns.unique_name("bench-incr"))
    try:
        yield name
    finally:
        netns.delete(name)


def _row(variant: str, result: SyncResult, wall_ms: float, **extra: object) -> dict[str, object]:
    return {
        "bench": "incremental",
        "variant": variant,
        **extra,
        "path": "incremental" if result.incremental else "full",
        "plan_ms": round(result.plan_ms, 3),
        "diff_ms": round(result.diff_ms, 3),
        "commit_ms": round(result.commit_ms, 3),
        "sync_ms": round(wall_ms, 3),
        "ops": result.total_ops,
    }


def run_variant(variant: str, args: argparse.Namespace) -> list[dict[str, object]]:
    state = cluster(args.services, args.endpoints, args.nodeport_every)
    rows = []
    with namespace() as ns:
        syncer = Syncer(CONFIG, real_kernel(ns), incremental=variant != "full")
        try:
            t = time.perf_counter()
            cold = syncer.sync(state.snapshot())
            row = _row(variant, cold, (time.perf_counter() - t) * 1000, change="cold")
            print(json.dumps(row), flush=True)
            half = args.changes // 2
            targets = [(k * 7919 + 13) % args.services for k in range(half)]
            plan = [(i, "remove") for i in targets] + [(i, "add") for i in targets]
            for n, (i, what) in enumerate(plan):
                skip = args.endpoints // 2 if what == "remove" else None
                changed = state.apply([upsert_of(eps_slice(i, args.endpoints, skip))])
                given = changed if variant == "incremental" else None
                t = time.perf_counter()
                result = syncer.sync(state.snapshot(), changed=given)
                wall = (time.perf_counter() - t) * 1000
                row = _row(variant, result, wall, change=n, op=what, service=str(_key(i)))
                print(json.dumps(row), flush=True)
                rows.append(row)
        finally:
            syncer.close()
    return rows


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))], 3)


def summary(variant: str, rows: list[dict[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {"bench": "incremental", "variant": variant, "summary": True}
    for key in ("plan_ms", "diff_ms", "commit_ms", "sync_ms", "ops"):
        values = [float(r[key]) for r in rows]  # type: ignore[arg-type]
        out[f"{key}_p50"] = round(statistics.median(values), 3)
        out[f"{key}_p99"] = _pct(values, 0.99)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--services", type=int, default=10_000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--changes", type=int, default=20)
    ap.add_argument("--nodeport-every", type=int, default=0, help="every Nth service a NodePort")
    ap.add_argument(
        "--variants", default="incremental,incremental-scan,full", help="comma-separated"
    )
    args = ap.parse_args()
    summaries = {}
    for variant in args.variants.split(","):
        summaries[variant] = summary(variant, run_variant(variant, args))
        print(json.dumps(summaries[variant]), flush=True)
    full = summaries.get("full")
    for variant, s in summaries.items():
        if full is None or variant == "full":
            continue
        ratios: dict[str, object] = {"bench": "incremental", "ratio": f"full/{variant}"}
        for key in ("plan_ms_p50", "diff_ms_p50", "commit_ms_p50", "sync_ms_p50", "sync_ms_p99"):
            ours = float(s[key])  # type: ignore[arg-type]
            ratios[key] = round(float(full[key]) / ours, 1) if ours else None  # type: ignore[arg-type]
        print(json.dumps(ratios), flush=True)


if __name__ == "__main__":
    main()
