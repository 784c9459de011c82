"""A relist after an API server restart: the same objects again, and the same with one change.

A long-lived ``Syncer`` in a fresh network namespace programs S Services x E endpoints once
through the cluster state, as the daemon does. Then, as a relist delivers them, a ``Replace``
per kind (Node, Service, EndpointSlice) of freshly built copies equal by value to what the
state holds, and one sync; then the same with one Service's endpoint removed meanwhile; then
with this Node tainted meanwhile (a field only ``/healthz`` reads: a restarting API server's
node controller taints a Node whose kubelet it has not heard from); then with the taint gone
and that Service changed back. Run as root.

Prints one JSON line per case: the state's ``apply`` (ms and how many Services it reported
changed), the sync's plan and total ms, whether it was incremental, and the operations sent.
The CPU after the lists is ``apply_ms + sync_ms``.

    .venv/bin/python bench/bench_relist.py --services 10000 --endpoints 10
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from ipaddress import IPv4Address
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_incremental import CONFIG, NODE, eps_slice, upsert_of
from bench_incremental import service as _service

from nlproxy.cluster.model import (
    Change,
    Node,
    Replace,
    Service,
)
from nlproxy.cluster.state import ClusterState
from nlproxy.sync.kernel import real as real_kernel
from nlproxy.sync.syncer import Syncer
from tests import netns


def service(i: int) -> Service:
    """bench_incremental's Service ``i``, a ClusterIP one."""
    return _service(i, nodeport=False)


def lists(
    services: int, endpoints: int, changed: int | None = None, *, taints: tuple[str, ...] = ()
) -> list[Change]:
    """A Replace per kind of freshly built objects; ``changed``: that Service lost an endpoint;
    ``taints``: this Node's taint keys."""
    node = Node(name=NODE, addresses=(IPv4Address("192.168.77.1"),), taint_keys=taints)
    return [
        Replace(kind="Node", changes=(upsert_of(node),)),
        Replace(kind="Service", changes=tuple(upsert_of(service(i)) for i in range(services))),
        Replace(
            kind="EndpointSlice",
            changes=tuple(
                upsert_of(eps_slice(i, endpoints, 0 if i == changed else None))
                for i in range(services)
            ),
        ),
    ]


def case(
    what: str, state: ClusterState, syncer: Syncer, changes: list[Change]
) -> dict[str, object]:
    t0 = time.perf_counter()
    c0 = time.process_time()
    changed = state.apply(changes)
    t1 = time.perf_counter()
    result = syncer.sync(state.snapshot(), changed=changed)
    t2 = time.perf_counter()
    cpu = time.process_time() - c0
    return {
        "case": what,
        "apply_ms": round((t1 - t0) * 1000, 1),
        "changed": len(changed),
        "plan_ms": round(result.plan_ms, 1),
        "sync_ms": round((t2 - t1) * 1000, 1),
        "cpu_after_lists_ms": round(cpu * 1000, 1),
        "incremental": result.incremental,
        "ops": result.total_ops,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--services", type=int, default=10000)
    p.add_argument("--endpoints", type=int, default=10)
    args = p.parse_args()
    s, e = args.services, args.endpoints
    ns = netns.create(netns.unique_name("bench-relist"))
    try:
        syncer = Syncer(CONFIG, real_kernel(ns))
        state = ClusterState(NODE)
        print(json.dumps(case("cold", state, syncer, lists(s, e))), flush=True)
        syncer.settle()
        gc.freeze()
        tainted = ("example.com/t",)
        cases = [
            ("relist-same", lists(s, e)),
            ("relist-one-changed", lists(s, e, changed=s // 2)),
            ("relist-node-tainted", lists(s, e, changed=s // 2, taints=tainted)),
            ("relist-node-untainted-one-changed", lists(s, e)),
        ]
        for what, changes in cases:
            print(json.dumps(case(what, state, syncer, changes)), flush=True)
            syncer.settle()
        syncer.close()
    finally:
        netns.delete(ns)


if __name__ == "__main__":
    main()
