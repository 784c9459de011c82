"""The daemon's own CPU up to the end of the API lists, without the API server, for two checkouts
side by side: its imports, the decoding of the list pages into the model, and the cluster state.

The pages are those the in-repo API server sends (``tests/kube/apiserver.py``'s item encoding,
``gen.Cluster``, S Services x E endpoints, 500 objects a page), made once in this process. Each
checkout runs in a fresh interpreter per round (rounds paired, the order swapped every round)
with bytecode as an installed package has it (``bench/bytecode.py``), and reports CPU seconds
(``time.process_time``) of:

- ``import_s``: importing what ``nlproxy run`` imports before its first sync
  (``nlproxy.cli``, ``nlproxy.commands.run``, ``nlproxy.daemon.run``, ``nlproxy.cluster.kube``);
- ``decode_s``: every page decoded as ``list_kind`` does: ``kube_http.page_changes`` (a page
  in one call) where the checkout has it, else ``page_items`` and ``typed.change`` per item;
- ``state_s``: the pages into a ``ClusterState`` (``preload`` per page, then the ``Replace``
  of each kind), as the daemon's cold start does.

Figures are printed as JSON lines with the medians and the ratio head/base; never asserted.

    .venv/bin/python bench/bench_api_decode.py --base ../wt-base [--rounds 5]
        [--services 10000] [--endpoints 10]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import checkout_run, gen  # noqa: E402

PAGE_SIZE = 500

CHILD = r"""
import json, pickle, sys, time
t0 = time.process_time()
import nlproxy.cli, nlproxy.commands.run, nlproxy.daemon.run, nlproxy.cluster.kube
t1 = time.process_time()
from nlproxy.cluster import kube_http, typed
from nlproxy.cluster.model import Replace
from nlproxy.cluster.state import ClusterState
import gc
gc.disable()
with open(sys.argv[1], "rb") as f:
    pages = pickle.load(f)
t2 = time.process_time()
decoded = []
whole = getattr(kube_http, "page_changes", None)  # a page in one call, where the tree has it
for kind, data in pages:
    if whole is not None:
        decoded.append((kind, whole(data, kind)[1]))
    else:
        decoded.append((kind, [typed.change(item, kind) for item in kube_http.page_items(data)]))
t3 = time.process_time()
state = ClusterState("node-0")
by_kind = {}
for kind, changes in decoded:
    state.preload(changes)
    by_kind.setdefault(kind, []).extend(changes)
for kind, changes in by_kind.items():
    state.apply([Replace(kind=kind, changes=tuple(changes))])
state.snapshot()
t4 = time.process_time()
print(json.dumps({"import_s": t1 - t0, "decode_s": t3 - t2, "state_s": t4 - t3}))
"""


def pages(cluster: gen.Cluster) -> list[tuple[str, bytes]]:
    """The list pages of Services then EndpointSlices, each as the API server writes it."""
    out: list[tuple[str, bytes]] = []
    for kind, docs in (
        ("Service", [gen.service_doc(cluster, i) for i in range(cluster.services)]),
        (
            "EndpointSlice",
            [d for i in range(cluster.services) for d in gen.slice_docs(cluster, i)],
        ),
    ):
        for start in range(0, len(docs), PAGE_SIZE):
            items = [
                json.dumps({k: v for k, v in d.items() if k not in ("kind", "apiVersion")})
                for d in docs[start : start + PAGE_SIZE]
            ]
            more = start + PAGE_SIZE < len(docs)
            head = {"resourceVersion": "1000", **({"continue": str(start)} if more else {})}
            out.append(
                (
                    kind,
                    b'{"metadata": %s, "items": [%s]}'
                    % (json.dumps(head).encode(), ",".join(items).encode()),
                )
            )
    return out


def run_child(tree: Path, data: Path) -> dict[str, float]:
    return checkout_run.json_result("bench_api_decode", tree, ["-c", CHILD, data])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", type=Path, required=True, help="another checkout (its .venv built)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--services", type=int, default=10_000)
    p.add_argument("--endpoints", type=int, default=10)
    args = p.parse_args(argv)
    trees = [("head", ROOT), ("base", args.base.resolve())]
    checkout_run.prepare(tree for _, tree in trees)
    cluster = gen.Cluster(services=args.services, endpoints=args.endpoints)
    figures: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    with tempfile.TemporaryDirectory(prefix="nlpad-") as tmp:
        data = Path(tmp) / "pages.pickle"
        with data.open("wb") as f:
            pickle.dump(pages(cluster), f)
        for rnd in range(args.rounds):
            for name, tree in trees if rnd % 2 == 0 else trees[::-1]:
                figures[name].append(run_child(tree, data))
    summary: dict[str, Any] = {
        "bench": "api_decode",
        "services": args.services,
        "endpoints": args.endpoints,
        "rounds": args.rounds,
    }
    for stage in ("import_s", "decode_s", "state_s"):
        med = {name: statistics.median(r[stage] for r in runs) for name, runs in figures.items()}
        summary[stage] = {k: round(v, 3) for k, v in med.items()}
        summary[stage]["ratio"] = round(med["head"] / med["base"], 3) if med["base"] else None
    summary["loadavg_1_5_15"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
