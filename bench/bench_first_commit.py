"""A cold start's first sync after the lists, in-process and staged: what the daemon does between
its last page and its first commit, without the API server, the event loop or the reports.

One ``Syncer`` as the daemon makes it (records, ``plan_after_restart``, the sync quota), into a
fresh namespace, fed by ``Preload`` as ``KubeSource`` feeds it (``sync/preload.py``): the Node,
then the Services' pages with every other slice page beside them (the two lists run side by
side), the Services listed (the plan ahead starts), the other slice pages with a pause after
each, then the last page and the end of the lists; then, timed, the ``Replace`` of the complete
lists into the state and the first sync. Figures, per run (JSON lines):

- ``replace_s``: the lists' ``Replace`` into the state (``ClusterState.apply``; the loop does it
  on its thread before the sync);
- ``sync_s``: ``Syncer.sync``, and inside it ``take_s`` (the wait for the plan ahead to follow
  the last page), ``balancing_s`` (its seed and its pass), ``digest_s``, ``diff_s``, and per
  family's batch ``validate_s``, ``encode_s``, ``commit_s`` (the kernel's) with the process's
  system and user CPU over the batch;
- ``rss_mb`` after the sync (the daemon's own RSS carries its client, loop and reports too).

Each second is counted once: the seed's balancing pass is in ``balancing_s`` once, its digest
in ``digest_s`` only. ``--base DIR`` runs the same script with that checkout's code too,
alternating, and prints each round's head/base ratios of the figures on a line of its own.
``--size-hint N`` (this checkout only, an experiment): the four large sets of the ``ip``
table (``backends``, ``hairpin``, ``service-ips``, ``cluster-ips``) are created with
``NFTA_SET_DESC_SIZE`` N, so the kernel sizes their hash tables at once instead of growing them
during the commit (a size is also a cap on elements: what nlproxy programs today has none).

    .venv/bin/python bench/bench_first_commit.py --services 10000 --base ../wt-base --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
PAGE = 500


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def stages(fig: dict[str, Any]) -> Callable[[Any, str, str], None]:
    """``timed(obj, name, label)``: ``obj.name`` wrapped to add its time under ``label`` of
    ``fig``, each second counted once: the time of a timed call made inside another (the
    seed's balancing pass and digest) is the inner call's label's only, not the outer's too."""
    local = threading.local()

    def timed(obj: Any, name: str, label: str) -> None:
        f = getattr(obj, name)

        def wrapped(*a: Any, **k: Any) -> Any:
            open_ = local.__dict__.setdefault("open", [])
            open_.append(0.0)  # the time of the timed calls made inside this one
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                took = time.perf_counter() - t
                fig[label] = round(fig.get(label, 0.0) + took - open_.pop(), 4)
                if open_:
                    open_[-1] += took

        setattr(obj, name, wrapped)

    return timed


def ratios(head: dict[str, Any], base: dict[str, Any]) -> dict[str, float | None]:
    """head/base of every figure both runs have as a number (None where base's is 0)."""
    out: dict[str, Any] = {}
    for key, value in head.items():
        other = base.get(key)
        if isinstance(value, int | float) and isinstance(other, int | float):
            out[key] = round(value / other, 2) if other else None
    return out


def run(services: int, endpoints: int, pause: float, size_hint: int) -> dict[str, Any]:
    """One cold start in this process, with the code on ``sys.path`` (this checkout or a base)."""
    from bench import gen
    from nlproxy.cluster.model import Replace
    from nlproxy.cluster.parse import to_change
    from nlproxy.cluster.state import ClusterState
    from nlproxy.nft import backend as backend_mod
    from nlproxy.nft import encode as encode_mod
    from nlproxy.nft.ir import Family
    from nlproxy.proxy.budget import SYNC_QUOTA
    from nlproxy.proxy.config import ProxyConfig
    from nlproxy.sync import syncer as syncer_mod
    from nlproxy.sync.kernel import real as real_kernel
    from nlproxy.sync.preload import Preload
    from tests.netns import namespace

    c = gen.Cluster(services=services, endpoints=endpoints)
    cfg = ProxyConfig(
        node_name=gen.NODE_NAME,
        cluster_cidrs=(gen.CLUSTER_CIDR,),
        service_cidrs=(gen.SERVICE_CIDR,),
    )
    svcs = [to_change(gen.service_doc(c, i)) for i in range(services)]
    slices = [to_change(d) for i in range(services) for d in gen.slice_docs(c, i)]
    node = to_change(gen.node_doc())
    fig: dict[str, Any] = {}
    timed = stages(fig)

    batches: list[dict[str, Any]] = []
    apply: Callable[..., Any] = backend_mod.NftBackend.apply

    def counted(self: Any, ops: Any, known: Any = None) -> Any:
        c0 = os.times()
        r = apply(self, ops, known)
        c1 = os.times()
        batches.append(
            {
                "messages": r.messages,
                "validate_s": round(r.validate_s, 4),
                "encode_s": round(r.encode_s, 4),
                "commit_s": round(r.commit_s, 4),
                "sys_s": round(c1.system - c0.system, 3),
                "user_s": round(c1.user - c0.user, 3),
            }
        )
        return r

    backend_mod.NftBackend.apply = counted  # type: ignore[method-assign]
    if size_hint:
        set_obj = encode_mod.Batch._set_obj
        large = ("backends", "hairpin", "service-ips", "cluster-ips")

        def sized(self: Any, s: Any, name: str, set_id: int, size: int = 0, **kw: Any) -> Any:
            if not size and name in large and self.table.family is Family.IP:
                size = size_hint  # (the ip6 sets are empty: a size would only cost tables)
            return set_obj(self, s, name, set_id, size, **kw)

        encode_mod.Batch._set_obj = sized  # type: ignore[method-assign]

    with namespace("nlpfc") as ns:
        state = ClusterState(gen.NODE_NAME)
        syncer = syncer_mod.Syncer(cfg, real_kernel(ns), plan_after_restart=True, quota=SYNC_QUOTA)
        timed(syncer.ahead, "take", "take_s")
        timed(syncer.balancing, "apply", "balancing_s")
        timed(syncer.balancing, "seed", "balancing_s")
        timed(syncer.records, "take_digest", "digest_s")
        timed(syncer_mod, "diff", "diff_s")
        pre = Preload(state, syncer)
        pre.page([node])
        service_pages = [svcs[i : i + PAGE] for i in range(0, len(svcs), PAGE)]
        slice_pages = [slices[i : i + PAGE] for i in range(0, len(slices), PAGE)]
        k = 0
        for i, page in enumerate(service_pages):
            pre.page(page)
            if i % 2 and k < len(slice_pages) - 1:
                pre.page(slice_pages[k])
                k += 1
        pre.listed("Service")
        while k < len(slice_pages) - 1:
            time.sleep(pause)
            pre.page(slice_pages[k])
            k += 1
        time.sleep(pause)
        t0 = time.perf_counter()
        pre.page(slice_pages[k])
        pre.listed("EndpointSlice")
        changed = state.apply(
            [
                Replace(kind="Service", changes=tuple(svcs)),
                Replace(kind="EndpointSlice", changes=tuple(slices)),
                Replace(kind="Node", changes=(node,)),
            ]
        )
        snapshot = state.snapshot()
        t1 = time.perf_counter()
        result = syncer.sync(snapshot, changed=changed)
        t2 = time.perf_counter()
        syncer.close()
    return {
        "replace_s": round(t1 - t0, 4),
        "sync_s": round(t2 - t1, 4),
        "ops": result.total_ops,
        **fig,
        "batches": batches,
        "rss_mb": round(_rss_mb(), 1),
    }


def child(tree: Path, args: argparse.Namespace, size_hint: int) -> dict[str, Any]:
    """:func:`run` in a child process of ``tree`` (its ``python``, from bytecode) with ``tree``'s
    code first on ``sys.path``."""
    from bench import checkout_run

    argv = [HERE, "--child", tree, "--services", str(args.services)]
    argv += ["--endpoints", str(args.endpoints), "--pause", str(args.pause)]
    argv += ["--size-hint", str(size_hint)]
    return checkout_run.json_result("bench_first_commit", tree, argv, timeout=600)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--services", type=int, default=10_000)
    p.add_argument("--endpoints", type=int, default=10)
    p.add_argument("--base", type=Path, help="another checkout (its .venv built)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--pause", type=float, default=0.05, help="seconds between later pages")
    p.add_argument("--size-hint", type=int, default=0, metavar="N", help="see the docstring")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        sys.path.insert(0, str(args.child))
        print(json.dumps(run(args.services, args.endpoints, args.pause, args.size_hint)))
        return 0
    here = HERE.parent.parent
    trees = [("head", here, 0)]
    if args.size_hint:
        trees.append(("head+size-hint", here, args.size_hint))
    if args.base is not None:
        trees.append(("base", args.base.resolve(), 0))
    sys.path.append(str(here))
    from bench import checkout_run

    checkout_run.prepare(tree for _, tree, _ in trees)
    for rnd in range(args.rounds):
        figs: dict[str, dict[str, Any]] = {}
        for name, tree, hint in trees if rnd % 2 == 0 else trees[::-1]:
            load = [round(x, 2) for x in os.getloadavg()]
            fig = figs[name] = child(tree, args, hint)
            line = {"bench": "first_commit", "tree": name, "round": rnd}
            line |= {"services": args.services, "endpoints": args.endpoints, **fig}
            print(json.dumps({**line, "loadavg_1_5_15": load}), flush=True)
        if "base" in figs:
            line = {"bench": "first_commit", "tree": "head/base", "round": rnd}
            print(json.dumps({**line, **ratios(figs["head"], figs["base"])}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
