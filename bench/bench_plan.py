"""Plan → diff → validate → encode at S Services x E endpoints, stage by stage, per source tree.

The whole-cluster paths' Python work without the kernel: the cluster is loaded and put in a
snapshot (not timed here: ``bench_coldpath.py`` does), then, in a child process per tree and
round (so trees compare side by side in one run on the same machine load):

* ``plan``: the planner, and the objects alive after it (``gc.get_objects()``, against the count
  before planning: what the plan costs the collector; gc does not track bytes, so the packed
  elements' key and data bytes are counted apart), and the RSS then;
* ``diff_cold``: the diff against nothing (the cold start's operations);
* ``validate`` and ``encode``: what ``NftBackend.apply`` does before sending (no kernel);
* ``remember``: the programmed copy the syncer keeps after a commit (``as_programmed``);
* ``diff_restart``: the diff of the plan against that copy (an unchanged restart's compare,
  without the read-back);
* ``free``: dropping the plan, the operations and the copy.

Each stage gives wall and CPU seconds (``time.process_time``); the record carries the load
average. ``--tree`` names the source trees (default: this one); each child is its tree's
``python`` importing that tree's ``nlproxy`` from bytecode (``checkout_run.py``), so
``--tree /work/main --tree .`` is the before/after of a change.

    .venv/bin/python bench/bench_plan.py --services 10000 --endpoints 10 --tree ../main --tree .
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _child(manifests: Path) -> dict[str, Any]:
    """The stages, in this process (``nlproxy`` imported from ``sys.path``)."""
    import gen

    from nlproxy.cluster.manifests import load_manifests
    from nlproxy.cluster.state import ClusterState
    from nlproxy.nft.encode import Batch
    from nlproxy.nft.ir import FAMILIES, Table
    from nlproxy.nft.reconcile import diff
    from nlproxy.nft.validate import validate
    from nlproxy.proxy.config import ProxyConfig
    from nlproxy.proxy.planner import plan
    from nlproxy.sync.syncer import as_programmed

    config = ProxyConfig(
        node_name=gen.NODE_NAME,
        cluster_cidrs=(gen.CLUSTER_CIDR,),
        service_cidrs=(gen.SERVICE_CIDR,),
    )
    state = ClusterState(gen.NODE_NAME)
    state.apply(load_manifests(manifests).changes)
    snapshot = state.snapshot()
    gc.collect()
    gc.disable()  # as Syncer.sync does
    out: dict[str, Any] = {}

    def stage(name: str, fn: Callable[[], Any]) -> Any:
        w0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        out[f"{name}_s"] = round(time.perf_counter() - w0, 3)
        out[f"{name}_cpu_s"] = round(time.process_time() - c0, 3)
        return result

    before = len(gc.get_objects())
    planned = stage("plan", lambda: plan(snapshot, config))
    out["objects_after_plan"] = len(gc.get_objects()) - before
    # gc does not track bytes: count the packed keys and data (trees that have them) apart
    out["packed_bytes_objects"] = sum(
        2 * len(els.raw)
        for rs in planned.rulesets.values()
        for els in rs.elements.values()
        if hasattr(els, "raw")
    )
    out["rss_after_plan_mb"] = _rss_mb()
    ops = stage("diff_cold", lambda: {f: diff(planned.rulesets[f], None) for f in FAMILIES})
    out["ops"] = sum(map(_count, ops.values()))

    def tables() -> dict[Any, Table]:
        return {f: planned.rulesets[f].table for f in FAMILIES}

    stage("validate", lambda: [validate(t, ops[f]) for f, t in tables().items()])

    def encode() -> int:
        messages = 0
        for f, t in tables().items():
            batch = Batch(t, {}, 1)
            batch.add(ops[f])
            batch.finish()
            messages += batch.messages
        return messages

    out["messages"] = stage("encode", encode)
    kept = stage("remember", lambda: {f: as_programmed(planned.rulesets[f]) for f in FAMILIES})
    again = stage("diff_restart", lambda: {f: diff(planned.rulesets[f], kept[f]) for f in FAMILIES})
    out["restart_ops"] = sum(map(_count, again.values()))

    def free() -> None:
        nonlocal planned, ops, kept, again
        del planned, ops, kept, again
        gc.collect()

    stage("free", free)
    parts = ("plan", "diff_cold", "validate", "encode", "remember", "free")
    out["cold_total_cpu_s"] = round(sum(out[f"{p}_cpu_s"] for p in parts), 3)
    return out


def _rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as f:
        return round(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def _count(ops: list[Any]) -> int:
    """Kernel operations: a packed run (where the tree has them) counts its elements."""
    return sum(len(op.obj.keys) if hasattr(op.obj, "keys") else 1 for op in ops)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--services", type=int, default=10000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--tree", action="append", type=Path, help="source tree (repeatable)")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(_child(args.child)))
        return 0
    sys.path[:0] = [str(HERE), str(HERE.parent)]
    import gen

    from bench import checkout_run

    trees = [t.resolve() for t in (args.tree or [HERE.parent])]
    c = gen.Cluster(services=args.services, endpoints=args.endpoints)
    size = {"services": c.services, "endpoints": c.endpoints}
    records: list[list[dict[str, Any]]] = [[] for _ in trees]
    with tempfile.TemporaryDirectory(prefix="nlp-plan-") as tmp:
        gen.write_manifests(c, Path(tmp), "json")
        child = [Path(__file__).resolve(), "--child", tmp]
        for n, i, figs in checkout_run.rounds("bench_plan", trees, args.rounds, child, path=[HERE]):
            rec = {"bench": "plan_stages", **size, "tree": str(trees[i]), "round": n, **figs}
            rec["loadavg"] = [round(x, 2) for x in os.getloadavg()]
            records[i].append(rec)
            print(json.dumps(rec), flush=True)
    if len(trees) > 1:
        base = records[0]
        for tree, mine in zip(trees[1:], records[1:], strict=True):
            for a, b in zip(base, mine, strict=True):
                ratio = {
                    k: round(a[k] / max(b[k], 1e-3), 2)
                    for k in a
                    if k.endswith("_cpu_s") or k == "objects_after_plan"
                }
                head = {"bench": "plan_stages_ratio", **size, "round": a["round"]}
                head |= {"base": str(trees[0]), "over": str(tree)}
                print(json.dumps({**head, **ratio}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
