"""What round-robin and consistent hashing cost next to random choice, and what the hash ring moves.

Three parts, JSON lines each:

- ``cost``: S services x N endpoints (N = 2, 10, 100) programmed into a fresh namespace by a
  ``Syncer`` once per algorithm: kernel objects per service (chains, sets, elements) and the
  kernel (system) CPU time and wall time of the first sync, per service, side by side with
  random as ratios; then one endpoint of one service is replaced (a new address), and one
  goes: the operations of each sync (by kind, from the planner's diff), whether it was
  incremental and its commit time (one batch).
- ``budget``: the elements 10,000 services would hold if every one opted in, per N.
- ``wait``: how long an unrelated Service's change waits behind one big opted-in Service on a
  node with 200 other Services: the syncs that create the big Service, change one of its
  endpoints (a new address) and remove its first one, then the sync of another Service's
  change (a change that arrives while the big sync runs waits for it, then its own:
  ``worst_wait_s``). Cases: the attack of issue 26
  (20 ports x 1000 endpoints, consistent hashing: past the budget, so random), the largest
  Services within the budget (4 ports x 128 endpoints; one port of 500: 16384 elements; one of
  600 is a 65536-slot table, past it), and
  20 ports x 200 endpoints with the budget and with it lifted (side by side: what the budget
  saves).
- ``burst``: eight Services at the budget created at once, synced as the daemon does (with
  the per-sync quota, and without it), another Service changing in every sync: the longest
  sync (what that change may wait) and the time until every table is built.
- ``disruption``: for each N from 1 to 64, the share of table slots (what a uniform hash
  moves) and of 4000 simulated clients (hashed as the kernel does) that change endpoint between
  N and N+1 endpoints (three random draws each), as a ratio to the bound 2/(N+1), and the
  largest endpoint's share of the slots against the mean.

Run as root (the cost part creates namespaces):

    .venv/bin/python bench/bench_lb.py --services 200
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from ipaddress import IPv4Address
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_incremental import CONFIG, cluster, eps_slice, namespace, upsert_of
from nlproxy.cluster.model import (
    Endpoint,
    EndpointPort,
    EndpointSlice,
    IPFamily,
    LoadBalancing,
    Protocol,
    Service,
    ServiceKey,
    ServicePort,
    ServicePortRef,
    ServiceType,
)
from nlproxy.log import configure
from nlproxy.nft.ir import Element, Family, Operation, Rule, Ruleset
from nlproxy.nft.jhash import nft_jhash
from nlproxy.nft.packed import PackedRun
from nlproxy.nft.reconcile import diff
from nlproxy.proxy import budget as lb_budget
from nlproxy.proxy.hashring import lookup_table, table_size
from nlproxy.proxy.planner import plan
from nlproxy.sync.kernel import real as real_kernel
from nlproxy.sync.syncer import Syncer, SyncResult, as_programmed

ALGORITHMS = (LoadBalancing.RANDOM, LoadBalancing.ROUND_ROBIN, LoadBalancing.CONSISTENT_HASH)


def _objects(rs: Ruleset) -> dict[str, int]:
    return {
        "chains": len(rs.chains),
        "sets": len(rs.sets),
        "rules": sum(len(r) for r in rs.rules.values()),
        "elements": sum(len(e) for e in rs.elements.values()),
    }


def _sys() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def cost(services: int, endpoints: int, algorithm: LoadBalancing) -> dict[str, object]:
    """What the tables cost, every Service opted in: the budget is lifted for this part."""
    with _budget_lifted():
        return _cost(services, endpoints, algorithm)


@contextmanager
def _budget_lifted() -> Iterator[None]:
    saved = lb_budget.SERVICE_BUDGET, lb_budget.NODE_BUDGET
    lb_budget.SERVICE_BUDGET = lb_budget.NODE_BUDGET = 1 << 40
    try:
        yield
    finally:
        lb_budget.SERVICE_BUDGET, lb_budget.NODE_BUDGET = saved


def _cost(services: int, endpoints: int, algorithm: LoadBalancing) -> dict[str, object]:
    config = replace(CONFIG, load_balancing=algorithm)
    state = cluster(services, endpoints, nodeport_every=0)
    snap = state.snapshot()
    base = _objects(plan(cluster(0, 0, nodeport_every=0).snapshot(), config).rulesets[Family.IP])
    with namespace() as ns:
        syncer = Syncer(config, real_kernel(ns))
        try:
            t, s = time.perf_counter(), _sys()
            first = syncer.sync(snap)
            wall, kernel = time.perf_counter() - t, _sys() - s
            assert first.plan is not None
            objects = _objects(first.plan.rulesets[Family.IP])
            changes = {}
            for what, slice_ in (
                ("replaced", replaced(endpoints)),  # a pod restarted with a new address
                ("removed", eps_slice(0, endpoints, skip=endpoints // 2)),
            ):
                before = as_programmed(syncer.sync(state.snapshot()).plan.rulesets[Family.IP])  # type: ignore[union-attr]
                state.apply([upsert_of(slice_)])
                changed = syncer.sync(state.snapshot())
                assert changed.plan is not None
                changes[what] = _change(changed, diff(changed.plan.rulesets[Family.IP], before))
        finally:
            syncer.close()
    per_service = {k: round((v - base[k]) / services, 1) for k, v in objects.items()}
    return {
        "bench": "lb",
        "part": "cost",
        "algorithm": str(algorithm),
        "services": services,
        "endpoints": endpoints,
        "per_service": per_service,
        "sync_s": round(wall, 3),
        "kernel_s": round(kernel, 3),
        "kernel_ms_per_service": round(1000 * kernel / services, 3),
        **changes,
    }


def replaced(endpoints: int) -> EndpointSlice:
    """Service 0's slice with its middle endpoint at a new address."""
    s = eps_slice(0, endpoints)
    eps = list(s.endpoints)
    eps[endpoints // 2] = msgspec.structs.replace(
        eps[endpoints // 2], ip=IPv4Address("10.255.255.1")
    )
    return msgspec.structs.replace(s, endpoints=tuple(eps))


def _change(result: SyncResult, ops: list[Operation]) -> dict[str, object]:
    """One sync's operations by kind (the planner's diff of the same change) and its commit;
    a sync is one batch per family, and only ``ip`` changes here."""
    kinds: Counter[str] = Counter()
    for op in ops:
        if isinstance(op.obj, PackedRun):  # elements held as the kernel's bytes, one per key
            kinds[f"{op.verb} element"] += len(op.obj.keys)
        else:
            kind = "element" if isinstance(op.obj, Element) else type(op.obj).__name__.lower()
            kinds[f"{op.verb} {kind}"] += 1
    return {
        "incremental": result.incremental,
        "ops": result.total_ops,
        "commit_ms": round(result.commit_ms, 2),
        "kinds": dict(sorted(kinds.items())),
        "rules_changed": sum(1 for op in ops if isinstance(op.obj, Rule)),
    }


def budget(endpoints: int) -> dict[str, object]:
    n = 10_000
    return {
        "bench": "lb",
        "part": "budget",
        "services": n,
        "endpoints": endpoints,
        "consistent_hash_elements": n * table_size(endpoints),
        "random_elements": n * endpoints,
        "ratio": round(table_size(endpoints) / endpoints, 1),
    }


def _big(
    ports: int, endpoints: int, moved: int | None = None, name: str = "big", index: int = 0
) -> tuple[Service, EndpointSlice]:
    """``lb/big``: ``ports`` TCP ports, consistent hashing, ``endpoints`` endpoints (the one at
    index ``moved`` at a new address)."""
    key = ServiceKey(namespace="lb", name=name)
    sps = tuple(
        ServicePort(
            ref=ServicePortRef(namespace="lb", name=name, port_name=f"p{j}", protocol=Protocol.TCP),
            port=80 + j,
            target_port=8080,
        )
        for j in range(ports)
    )
    svc = Service(
        key=key,
        type=ServiceType.CLUSTER_IP,
        cluster_ips=(IPv4Address("10.111.255.254") - index,),
        ports=sps,
        load_balancing=LoadBalancing.CONSISTENT_HASH,
        created="2026-01-01T00:00:00Z",
    )
    base = IPv4Address("10.200.0.1") + 65536 * index
    eps = tuple(
        Endpoint(
            ip=base + (j if j != moved else 60000),
            ready=True,
            serving=True,
            terminating=False,
            node_name="node-1",
        )
        for j in range(endpoints)
    )
    sl = EndpointSlice(
        namespace="lb",
        name=f"{name}-abcde",
        service=key,
        family=IPFamily.IPV4,
        ports=tuple(
            EndpointPort(name=f"p{j}", port=8080, protocol=Protocol.TCP) for j in range(ports)
        ),
        endpoints=eps,
    )
    return svc, sl


def _timed(syncer: Syncer, state: object) -> tuple[float, SyncResult]:
    t = time.perf_counter()
    result = syncer.sync(state.snapshot())  # type: ignore[attr-defined]
    return time.perf_counter() - t, result


def wait(case: str, ports: int, endpoints: int, *, budget: bool = True) -> dict[str, object]:
    with _budget_lifted() if not budget else nullcontext():
        state = cluster(200, 10, nodeport_every=0)
        with namespace() as ns:
            syncer = Syncer(CONFIG, real_kernel(ns))
            try:
                syncer.sync(state.snapshot())
                state.apply([upsert_of(x) for x in _big(ports, endpoints)])
                create_s, created = _timed(syncer, state)
                fallbacks = dict(syncer.balancing.fallbacks)
                moved = _big(ports, endpoints, moved=endpoints // 2)[1]
                state.apply([upsert_of(moved)])
                change_s, changed = _timed(syncer, state)
                state.apply(
                    [upsert_of(msgspec.structs.replace(moved, endpoints=moved.endpoints[1:]))]
                )
                remove_s, removed = _timed(syncer, state)
                state.apply([upsert_of(replaced(10))])  # service 0: one endpoint at a new address
                other_s, _ = _timed(syncer, state)
            finally:
                syncer.close()
    big_key = ServiceKey(namespace="lb", name="big")
    elements = 0
    if created.plan is not None:
        elements = sum(
            len(els)
            for name, els in created.plan.rulesets[Family.IP].elements.items()
            if name.startswith("lb-")
        )
    return {
        "bench": "lb",
        "part": "wait",
        "case": case,
        "budget": budget,
        "ports": ports,
        "endpoints": endpoints,
        "fell_back": big_key in fallbacks,
        "lb_elements": elements,
        "create_s": round(create_s, 3),
        "create_ops": created.total_ops,
        "change_s": round(change_s, 3),
        "change_ops": changed.total_ops,
        "remove_s": round(remove_s, 3),
        "remove_ops": removed.total_ops,
        "other_change_s": round(other_s, 3),
        "worst_wait_s": round(max(create_s, change_s, remove_s) + other_s, 3),
    }


def burst(count: int, *, quota: bool) -> dict[str, object]:
    """``count`` Services at the budget (4 ports x 128 endpoints) created at once, synced as
    the daemon does (again while tables are deferred), with one change of another Service
    in every sync: the longest sync is what that change may wait."""
    state = cluster(200, 10, nodeport_every=0)
    syncs = []
    with namespace() as ns:
        syncer = Syncer(CONFIG, real_kernel(ns), quota=lb_budget.SYNC_QUOTA if quota else None)
        try:
            syncer.sync(state.snapshot())
            for i in range(count):
                state.apply([upsert_of(x) for x in _big(4, 128, name=f"big{i}", index=i + 1)])
            t0 = time.perf_counter()
            while True:
                state.apply([upsert_of(eps_slice(0, 10, skip=len(syncs) % 10))])
                took, result = _timed(syncer, state)
                syncs.append(took)
                if not result.deferred:
                    break
            total = time.perf_counter() - t0
            fallbacks = len(syncer.balancing.fallbacks)
        finally:
            syncer.close()
    return {
        "bench": "lb",
        "part": "burst",
        "services": count,
        "quota": quota,
        "syncs": len(syncs),
        "node_budget_fallbacks": fallbacks,
        "longest_sync_s": round(max(syncs), 3),
        "all_built_s": round(total, 3),
    }


WAIT_CASES = (
    ("attack 20x1000", 20, 1000, True),
    ("4x128 (at the Service budget)", 4, 128, True),
    ("1x500 (one 16384 table)", 1, 500, True),
    ("1x600 (one 65536 table, past it)", 1, 600, True),
    ("20x200", 20, 200, True),
    ("20x200", 20, 200, False),
)


def _eps(count: int, rng: random.Random) -> list[tuple[IPv4Address, int]]:
    return sorted({(IPv4Address(rng.getrandbits(32)), 8080) for _ in range(count)})


def disruption(clients: int = 4000, trials: int = 3) -> list[dict[str, object]]:
    """For N = 1…64: clients moved between N and N+1 endpoints (the added one drawn at random,
    ``trials`` times), against the bound 2/(N+1), and the largest endpoint share."""
    rng = random.Random(1)
    sources = [rng.getrandbits(32).to_bytes(4, "big") for _ in range(clients)]
    rows = []
    for count in range(1, 65):
        size = table_size(count + 1)
        assert table_size(count) == size, "no resize below 65 endpoints"
        slots = [nft_jhash(s, size, 0x5EED) for s in sources]
        ratios, sampled, spread = [], [], []
        for _ in range(trials):
            more = _eps(count + 1, rng)
            extra = more[rng.randrange(count + 1)]
            fewer = [b for b in more if b != extra]
            before = [fewer[i] for i in lookup_table(fewer, size)]
            after = [more[i] for i in lookup_table(more, size)]
            # Slots moved: exactly the share of clients a uniform hash moves.
            moved = sum(1 for a, b in zip(before, after, strict=True) if a != b) / size
            ratios.append(moved * (count + 1) / 2)
            sampled.append(sum(1 for s in slots if before[s] != after[s]) / clients)
            spread.append(max(Counter(after).values()) * (count + 1) / size)
        rows.append(
            {
                "bench": "lb",
                "part": "disruption",
                "endpoints": count,
                "table": size,
                "worst_moved_vs_bound": round(max(ratios), 3),
                "clients_worst_moved_pct": round(100 * max(sampled), 2),
                "bound_pct": round(200 / (count + 1), 2),
                "largest_share_vs_mean": round(max(spread), 2),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=200)
    parser.add_argument("--endpoints", type=int, nargs="+", default=[2, 10, 100])
    parser.add_argument("--skip-kernel", action="store_true", help="only the pure parts")
    parser.add_argument("--skip-wait", action="store_true", help="no wait part")
    args = parser.parse_args(argv)
    configure(level="warning")  # the over-budget warnings to stderr, the figures to stdout
    for n in args.endpoints:
        if not args.skip_kernel:
            rows = [cost(args.services, n, a) for a in ALGORITHMS]
            random_kernel = float(rows[0]["kernel_s"])  # type: ignore[arg-type]
            for row in rows:
                # CPU time is counted in clock ticks: no ratio below 20 ms.
                ratio = float(row["kernel_s"]) / random_kernel if random_kernel >= 0.02 else None  # type: ignore[arg-type]
                row["kernel_vs_random"] = None if ratio is None else round(ratio, 1)
                print(json.dumps(row), flush=True)
        print(json.dumps(budget(n)), flush=True)
    if not (args.skip_kernel or args.skip_wait):
        waits = [wait(case, p, e, budget=b) for case, p, e, b in WAIT_CASES]
        lifted = waits[-1]["worst_wait_s"]
        for row in waits:
            row["wait_vs_budget_lifted"] = round(float(row["worst_wait_s"]) / float(lifted), 3)  # type: ignore[arg-type]
            print(json.dumps(row), flush=True)
        bursts = [burst(8, quota=q) for q in (True, False)]
        for row in bursts:
            row["longest_vs_no_quota"] = round(
                float(row["longest_sync_s"]) / float(bursts[1]["longest_sync_s"]),  # type: ignore[arg-type]
                3,
            )
            print(json.dumps(row), flush=True)
    rows = disruption()
    for row in rows:
        print(json.dumps(row), flush=True)
    worst = max(rows, key=lambda r: float(r["worst_moved_vs_bound"]))  # type: ignore[arg-type]
    print(json.dumps({**worst, "part": "disruption-worst"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
