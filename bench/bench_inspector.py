"""The daemon's reachability inspector at S Services x E endpoints, per source tree.

In a child process per tree and round (trees side by side on the same machine load), with a
node in memory (``inspect/fake.py``: the pods routed via a gateway, one pod range local on a
bridge, 16 pods blackholed), the monitor of ``inspect/reachability.py``:

* ``first``: a whole plan noted and its first pass (every endpoint new);
* ``routes``: a pass after a route event (every endpoint classified again);
* ``rebuild``: the same plan noted whole again (a full sync) and its pass;
* ``one_service``: one Service's endpoints replaced and its pass (median of ``--updates``);
* ``kept_mb``: what the monitor holds after the first pass (tracemalloc, a separate monitor,
  beyond the plan it was given).

Each timed stage gives CPU seconds (``time.process_time``); the record carries the load average.
Each child is its tree's ``python`` importing that tree's ``nlproxy`` from bytecode
(``checkout_run.py``).

    .venv/bin/python bench/bench_inspector.py --tree ../main --tree .
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _node() -> Any:
    """Pods via a gateway on eth0, the first /24 of them on this node's bridge, 16 pods behind a
    blackhole (unreachable)."""
    from ipaddress import ip_address, ip_network

    import gen

    from nlproxy.inspect.fake import FakeNode
    from nlproxy.inspect.rtnl import Link, NextHop, Route, Snapshot

    gw = ip_address("192.168.77.2")
    links = {
        2: Link(index=2, name="eth0", kind=None, admin_up=True, oper="UP"),
        3: Link(index=3, name="cni0", kind="bridge", admin_up=True, oper="UP"),
    }

    def route(dst: str, hop: NextHop, scope: int = 0) -> Route:
        net = ip_network(dst)
        return Route(dst=net, table=254, type=1, scope=scope, priority=0, nexthops=(hop,))

    routes = (
        route(str(gen.CLUSTER_CIDR), NextHop(oif=2, gateway=gw)),
        route("192.168.77.0/24", NextHop(oif=2, gateway=None), scope=253),
        route(f"{gen.POD_BASE}/24", NextHop(oif=3, gateway=None), scope=253),
        Route(dst=ip_network("10.128.1.0/28"), table=254, type=6, scope=0, priority=0, nexthops=()),
    )
    return FakeNode(Snapshot(links=links, routes=routes, neighbours={(2, gw): 2}))


def _child(manifests: Path, updates: int) -> dict[str, Any]:
    import gen
    import msgspec
    import trio
    from prometheus_client import CollectorRegistry

    from nlproxy.cluster.manifests import load_manifests
    from nlproxy.cluster.state import ClusterState
    from nlproxy.inspect.reachability import ReachabilityMonitor
    from nlproxy.proxy.config import ProxyConfig
    from nlproxy.proxy.endpoints import Backend
    from nlproxy.proxy.planner import plan

    config = ProxyConfig(node_name=gen.NODE_NAME, cluster_cidrs=(gen.CLUSTER_CIDR,))
    state = ClusterState(gen.NODE_NAME)
    state.apply(load_manifests(manifests).changes)
    ports = plan(state.snapshot(), config).ports
    node = _node()
    out: dict[str, Any] = {}

    def timed(fn: Any) -> float:
        c0 = time.process_time()
        trio.run(fn)
        return time.process_time() - c0

    monitor = ReachabilityMonitor(CollectorRegistry(), node=node)
    gc.collect()
    monitor.plan_changed(ports, None)
    out["first_cpu_s"] = round(timed(lambda: monitor._evaluate(full=False)), 4)
    out["routes_cpu_s"] = round(timed(lambda: monitor._evaluate(full=True)), 4)
    c0 = time.process_time()
    monitor.plan_changed(ports, None)
    out["rebuild_cpu_s"] = round(
        time.process_time() - c0 + timed(lambda: monitor._evaluate(full=False)), 4
    )
    refs = list(ports)
    spent = []
    for n in range(updates):  # a new address per update: one classified, one dropped
        ref = refs[(n * 7919) % len(refs)]
        old = ports[ref]
        ips = [b.ip for b in old.cluster_endpoints]
        ips[0] = gen.POD_BASE + 2**22 + n
        fresh = tuple(Backend(ip, b.port) for ip, b in zip(ips, old.cluster_endpoints, strict=True))
        ports[ref] = msgspec.structs.replace(old, cluster_endpoints=fresh)
        c0 = time.process_time()
        monitor.plan_changed(ports, {ref.service})
        spent.append(time.process_time() - c0 + timed(lambda: monitor._evaluate(full=False)))
    out["one_service_cpu_ms"] = round(statistics.median(spent) * 1000, 3)
    out["verdicts"] = len(monitor.verdicts)
    out["unreachable"] = len(monitor.unreachable)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    kept = ReachabilityMonitor(CollectorRegistry(), node=node)
    kept.plan_changed(ports, None)
    trio.run(lambda: kept._evaluate(full=False))
    gc.collect()
    out["kept_mb"] = round((tracemalloc.get_traced_memory()[0] - base) / 2**20, 2)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--services", type=int, default=10000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--updates", type=int, default=50)
    ap.add_argument("--tree", action="append", type=Path, help="source tree (repeatable)")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(_child(args.child, args.updates)))
        return 0
    sys.path[:0] = [str(HERE), str(HERE.parent)]
    import gen

    from bench import checkout_run

    trees = [t.resolve() for t in (args.tree or [HERE.parent])]
    c = gen.Cluster(services=args.services, endpoints=args.endpoints)
    size = {"services": c.services, "endpoints": c.endpoints}
    with tempfile.TemporaryDirectory(prefix="nlp-insp-") as tmp:
        gen.write_manifests(c, Path(tmp), "json")
        child = [Path(__file__).resolve(), "--child", tmp, "--updates", str(args.updates)]
        runs = checkout_run.rounds("bench_inspector", trees, args.rounds, child, path=[HERE])
        for n, i, figs in runs:
            rec = {"bench": "inspector", **size, "tree": str(trees[i]), "round": n, **figs}
            rec["loadavg"] = [round(x, 2) for x in os.getloadavg()]
            print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
