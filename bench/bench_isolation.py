"""What leaving out a service the kernel refuses costs, at S services x E endpoints.

A clash the kernel refuses (two LoadBalancer services on one address and port with overlapping
source ranges) is added to a large cluster, in two situations, each in a fresh namespace with a
long-lived ``Syncer``:

- ``cold``: the clash is there from the first sync (every service is new, so a bisection would
  search all of them);
- ``steady``: the cluster is programmed, then the clashing service arrives (one changed service).

and two ways of finding the culprit: ``attributed`` (from the operation the kernel's error names,
the normal path) and ``bisected`` (attribution switched off, as when an error names no planned
object: check-only batches over the changed services). Each row gives the sync's wall time, next
to a clean sync of the same cluster without the clash. Run as root:

    .venv/bin/python bench/bench_isolation.py --services 10000 --endpoints 10
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import nlproxy.sync.syncer
from bench.bench_incremental import CONFIG, cluster, namespace
from nlproxy.cluster.model import (
    ClusterSnapshot,
    Protocol,
    Service,
    ServiceKey,
    ServicePort,
    ServicePortRef,
    ServiceType,
)
from nlproxy.sync.kernel import real as real_kernel
from nlproxy.sync.syncer import Syncer

LB = IPv4Address("192.0.2.50")


def clashing(i: int, ranges: str) -> Service:
    key = ServiceKey(namespace="clash", name=f"lb-{i}")
    ref = ServicePortRef(namespace="clash", name=key.name, port_name="http", protocol=Protocol.TCP)
    return Service(
        key=key,
        type=ServiceType.LOAD_BALANCER,
        cluster_ips=(IPv4Address("10.111.0.1") + i,),
        ports=(ServicePort(ref=ref, port=80, target_port=8080),),
        load_balancer_ips=(LB,),
        load_balancer_source_ranges=(IPv4Network(ranges),),
    )


def with_services(snap: ClusterSnapshot, *services: Service) -> ClusterSnapshot:
    extra = {s.key: s for s in services}
    return ClusterSnapshot(
        services={**snap.services, **extra},
        slices=dict(snap.slices),
        node=snap.node,
        service_cidrs=snap.service_cidrs,
    )


def timed(syncer: Syncer, snap: ClusterSnapshot) -> tuple[float, dict[str, object]]:
    t = time.perf_counter()
    result = syncer.sync(snap)
    return time.perf_counter() - t, {"ops": result.total_ops, "excluded": len(result.excluded)}


def run(situation: str, how: str, base: ClusterSnapshot) -> dict[str, object]:
    a, b = clashing(0, "10.0.0.0/8"), clashing(1, "10.1.0.0/16")
    saved = nlproxy.sync.syncer.owners
    if how == "bisected":
        nlproxy.sync.syncer.owners = lambda *_: []  # type: ignore[assignment]
    try:
        with namespace() as ns:
            syncer = Syncer(CONFIG, real_kernel(ns))
            try:
                if situation == "cold":
                    wall, info = timed(syncer, with_services(base, a, b))
                else:
                    syncer.sync(with_services(base, a))
                    wall, info = timed(syncer, with_services(base, a, b))
            finally:
                syncer.close()
    finally:
        nlproxy.sync.syncer.owners = saved
    return {"situation": situation, "how": how, "seconds": round(wall, 3), **info}


def clean(situation: str, base: ClusterSnapshot) -> dict[str, object]:
    a = clashing(0, "10.0.0.0/8")
    with namespace() as ns:
        syncer = Syncer(CONFIG, real_kernel(ns))
        try:
            if situation == "cold":
                wall, info = timed(syncer, with_services(base, a))
            else:
                syncer.sync(base)
                wall, info = timed(syncer, with_services(base, a))
        finally:
            syncer.close()
    return {"situation": situation, "how": "no clash", "seconds": round(wall, 3), **info}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--endpoints", type=int, default=10)
    args = parser.parse_args(argv)
    base = cluster(args.services, args.endpoints, nodeport_every=0).snapshot()
    for situation in ("cold", "steady"):
        rows = [clean(situation, base)]
        rows += [run(situation, how, base) for how in ("attributed", "bisected")]
        for row in rows:
            print(json.dumps({"bench": "isolation", "services": args.services, **row}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
