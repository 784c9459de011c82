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
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nlproxy.cluster.model import (
    Change,
    Endpoint,
    EndpointPort,
    EndpointSlice,
    IPFamily,
    Node,
    ObjectRef,
    Protocol,
    Replace,
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
from nlproxy.sync.syncer import Syncer
from tests import netns

NODE = "node-0"
SERVICE_BASE = IPv4Address("10.96.0.0")
POD_BASE = IPv4Address("10.128.0.0")
CONFIG = ProxyConfig(
    node_name=NODE,
    cluster_cidrs=(IPv4Network("10.128.0.0/9"),),
    service_cidrs=(IPv4Network("10.96.0.0/12"),),
)


def _key(i: int) -> ServiceKey:
    return ServiceKey(namespace=f"ns-{i % 50}", name=f"svc-{i:06d}")


def service(i: int) -> Service:
    key = _key(i)
    ref = ServicePortRef(
        namespace=key.namespace, name=key.name, port_name="http", protocol=Protocol.TCP
    )
    return Service(
        key=key,
        type=ServiceType.CLUSTER_IP,
        cluster_ips=(IPv4Address(SERVICE_BASE + 1 + i),),
        ports=(ServicePort(ref=ref, port=80, target_port=8080),),
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


def _up(obj: Service | EndpointSlice | Node) -> Upsert:
    match obj:
        case Service():
            ref = ObjectRef(kind="Service", namespace=obj.key.namespace, name=obj.key.name)
        case EndpointSlice():
            ref = ObjectRef(kind="EndpointSlice", namespace=obj.namespace, name=obj.name)
        case _:
            ref = ObjectRef(kind="Node", namespace="", name=obj.name)
    return Upsert(ref=ref, obj=obj)


def lists(
    services: int, endpoints: int, changed: int | None = None, *, taints: tuple[str, ...] = ()
) -> list[Change]:
    """A Replace per kind of freshly built objects; ``changed``: that Service lost an endpoint;
    ``taints``: this Node's taint keys."""
    node = Node(name=NODE, addresses=(IPv4Address("192.168.77.1"),), taint_keys=taints)
    return [
        Replace(kind="Node", changes=(_up(node),)),
        Replace(kind="Service", changes=tuple(_up(service(i)) for i in range(services))),
        Replace(
            kind="EndpointSlice",
            changes=tuple(
                _up(eps_slice(i, endpoints, 0 if i == changed else None)) for i in range(services)
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
