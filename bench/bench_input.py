"""The input side alone: manifests and API pages to the typed model, decode and parse apart.

What ``run --once`` and the API source spend before the cluster state, at S Services x E
endpoints, in-process and without the kernel, for what users feed: a JSON ``List`` (as
``kubectl get -o json`` writes it), block-style YAML (as ``kubectl get -o yaml`` writes each
object) and the API server's list pages (realistic bodies: ``managedFields``,
``last-applied-configuration``; ``tests/kube/realistic.py``). Two paths, rounds interleaved:

* ``parser``: the field-by-field parser for every object (``typed.FAST_KINDS`` emptied) and
  libyaml for YAML (the compiled decoder switched off) — the path before typed decoding;
* ``typed``: the product as it is (typed structs, the compiled YAML decoder).

With ``--base CHECKOUT`` the typed path of each checkout is measured instead, side by side:
each round runs the stages in a fresh interpreter per checkout (the order alternating), with
that checkout's ``nlproxy`` and the same files; figures are medians per checkout, the ratio
this / base of the medians and the median of each round's ratio, the child's peak RSS and the
load average. Inputs there: ``json``, ``yaml`` and ``yaml-kubectl`` (``bench_coldpath``'s block
YAML with kubectl's UIDs and timestamps).

Per input and path: ``read_s`` (the files' bytes), ``decode_s`` (bytes -> documents,
``decode.documents``; for API pages the page's decode; none for JSON files on the typed path,
which are decoded from their bytes into the typed structs inside the load), ``parse_s`` (the
rest of ``load_manifests``, or the pages' objects to changes), ``total_s``; then, apart from
the total, what the model costs before the planner: ``state_s`` (a fresh ``ClusterState``
applies the changes and takes its snapshot) and ``digest_s`` (the restart fingerprint of that
snapshot, ``sync/fingerprint.py``); CPU seconds (process time), medians of the rounds, the ratio
typed / parser, and the load average. Both paths must give the same changes (checked every
round). Never asserts on time.

    .venv/bin/python bench/bench_input.py --services 10000 --endpoints 10 --rounds 3
    .venv/bin/python bench/bench_input.py --services 50000 --endpoints 1 --inputs json \
        --base ../base-checkout --rounds 5
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gen
from measure import emit, log

from nlproxy.cluster import decode, kube_http, parse, typed
from nlproxy.cluster.manifests import SUFFIXES, load_manifests

try:
    from nlproxy.cluster import fileobjects
except ImportError:  # a checkout from before a file's objects had a module of their own
    from nlproxy.cluster import manifests as fileobjects  # type: ignore[no-redef]
from nlproxy.cluster.state import ClusterState
from nlproxy.proxy.config import ProxyConfig
from nlproxy.sync.fingerprint import Fingerprint
from tests.kube import realistic


@contextlib.contextmanager
def _path(which: str) -> Iterator[None]:
    """The ``parser`` path (``fileobjects.parser_only``: typed decoding, the compiled YAML
    decoder and JSON files from their bytes off) or ``typed``."""
    global _PARSER
    if which == "typed":
        yield
        return
    _PARSER = True
    try:
        with fileobjects.parser_only():
            yield
    finally:
        _PARSER = False


_PARSER = False
"""Whether the ``parser`` path is on: JSON files are then read as documents."""


def _cpu(fn: Callable[[], Any]) -> tuple[float, Any]:
    gc.disable()  # as the loader and the sync do
    try:
        t0 = time.process_time()
        out = fn()
        return time.process_time() - t0, out
    finally:
        gc.enable()


def _model_stages(changes: Any) -> dict[str, float]:
    """``state_s`` and ``digest_s`` for the changes one path made."""
    state = ClusterState(gen.NODE_NAME, service_cidrs=(gen.SERVICE_CIDR,))

    def apply() -> Any:
        state.apply(changes)
        return state.snapshot()

    state_s, snapshot = _cpu(apply)
    config = ProxyConfig(node_name=gen.NODE_NAME, service_cidrs=(gen.SERVICE_CIDR,))
    digest_s, _ = _cpu(lambda: Fingerprint(config).digest(snapshot))
    return {"state_s": state_s, "digest_s": digest_s}


def _from_bytes(path: Path) -> bool:
    """Whether the load reads ``path`` from its bytes into the typed structs (JSON files, on
    the typed path of every checkout ``--base`` takes), not as documents."""
    return path.suffix == ".json" and not _PARSER


def manifests_stages(directory: Path) -> tuple[dict[str, float], Any]:
    paths = [p for p in sorted(directory.iterdir()) if p.suffix in SUFFIXES]
    read_s, data = _cpu(lambda: [p.read_bytes() for p in paths])
    # A JSON file on the typed path is decoded inside the load, from its bytes into the typed
    # structs (``fileobjects._json_objects``): no documents, so its decode is in ``parse_s``.
    decoded = [(p, d) for p, d in zip(paths, data, strict=True) if not _from_bytes(p)]
    decode_s, _docs = _cpu(lambda: [decode.documents(p, d) for p, d in decoded])
    del _docs
    load_s, loaded = _cpu(lambda: load_manifests(directory))
    figs = {
        "read_s": read_s,
        "decode_s": decode_s,
        "parse_s": max(0.0, load_s - read_s - decode_s),
        "total_s": load_s,
    }
    figs.update(_model_stages(loaded.changes))
    return figs, loaded.changes


def pages_stages(pages: list[tuple[str, bytes]]) -> tuple[dict[str, float], Any]:
    """The API source's list pages: decode (the page's JSON) and parse (objects to changes),
    as ``kube_http`` does for each path: raw items and ``typed.change``, or dicts and the
    parser."""
    fast = bool(typed.FAST_KINDS)

    def decode_all() -> list[Any]:
        if fast:
            return [kube_http.page_items(body) for _kind, body in pages]
        return [json.loads(body)["items"] for _kind, body in pages]

    decode_s, items = _cpu(decode_all)

    def parse_all() -> list[Any]:
        out = []
        for (kind, _body), page in zip(pages, items, strict=True):
            if fast:
                out += [typed.change(raw, kind) for raw in page]
            else:
                out += [parse.to_change(obj, kind) for obj in page]
        return out

    parse_s, changes = _cpu(parse_all)
    figs = {"read_s": 0.0, "decode_s": decode_s, "parse_s": parse_s}
    figs["total_s"] = decode_s + parse_s
    figs.update(_model_stages(changes))
    return figs, changes


def api_pages(c: gen.Cluster, page_size: int = 500) -> list[tuple[str, bytes]]:
    """The cluster's Services and EndpointSlices as the API server's list pages."""
    services = [realistic.dress_service(gen.service_doc(c, i)) for i in range(c.services)]
    slices = [realistic.dress_slice(d) for i in range(c.services) for d in gen.slice_docs(c, i)]
    pages = []
    for kind, objs in (("Service", services), ("EndpointSlice", slices)):
        for k in range(0, len(objs), page_size):
            body: dict[str, Any] = {"kind": f"{kind}List", "metadata": {"resourceVersion": "9"}}
            body["items"] = objs[k : k + page_size]
            pages.append((kind, json.dumps(body, separators=(",", ":")).encode()))
    return pages


REPO = Path(__file__).resolve().parent.parent


def _write_input(c: gen.Cluster, directory: Path, name: str) -> None:
    if name == "yaml-kubectl":
        import bench_coldpath  # its kernel imports only for this input

        bench_coldpath.write_kubectl_yaml(c, directory)
    else:
        gen.write_manifests(c, directory, name)


def _one(directory: Path) -> int:
    """The typed path's stages of ``directory`` with the ``nlproxy`` on sys.path (a child of
    ``--base``): one JSON line, with this process's peak RSS and where ``nlproxy`` is from."""
    import nlproxy

    figs: dict[str, Any]
    figs, _changes = manifests_stages(directory)
    figs["maxrss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    figs["tree"] = str(Path(nlproxy.__file__).resolve().parent.parent)
    print(json.dumps(figs))
    return 0


def _child(tree: Path, directory: Path) -> list[str]:
    """The arguments of ``tree``'s ``python`` that run ``_one`` with ``tree``'s ``nlproxy`` (and
    its ``tests``) first on the path, and this checkout already on it (at its end), so that
    ``measure`` does not put this checkout's first."""
    start = (
        "import runpy, sys; "
        f"sys.path[:0] = [{str(tree)!r}, {str(REPO / 'bench')!r}]; sys.path.append({str(REPO)!r}); "
        f"sys.argv = [{__file__!r}, '--one', {str(directory)!r}]; "
        f"runpy.run_path({__file__!r}, run_name='__main__')"
    )
    return ["-c", start]


def side_by_side(c: gen.Cluster, inputs: list[str], base: Path, rounds: int) -> int:
    """Each input's typed-path stages from ``base`` and from this checkout, rounds paired."""
    from bench import checkout_run

    trees = {"base": base.resolve(), "this": REPO}
    checkout_run.prepare(trees.values())
    with tempfile.TemporaryDirectory(prefix="nlp-input-") as tmp:
        for name in inputs:
            directory = Path(tmp) / name
            _write_input(c, directory, name)
            mib = sum(p.stat().st_size for p in directory.iterdir()) / 2**20
            log(f"input {name}: {mib:.1f} MiB")
            runs: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
            loads = []
            for n in range(rounds):
                # paired rounds, the order alternating: a load that comes and goes hits both
                for which, tree in sorted(trees.items(), reverse=n % 2 == 1):
                    log(f"{name} {which} round {n}")
                    loads.append(os.getloadavg()[0])
                    figs = checkout_run.json_result("bench_input", tree, _child(tree, directory))
                    if figs.pop("tree") != str(tree):
                        raise SystemExit(f"bench_input: the {which} run did not use {tree}")
                    runs[which].append(figs)
            for which in trees:
                figs = {k: statistics.median(r[k] for r in runs[which]) for k in runs[which][0]}
                record: dict[str, Any] = {
                    "bench": "input",
                    "input": name,
                    "checkout": which,
                    "services": c.services,
                    "endpoints": c.endpoints,
                    "rounds": rounds,
                    **{k: round(v, 3) for k, v in figs.items()},
                }
                if which == "this":
                    for k in ("total_s", "state_s", "digest_s"):
                        record[f"ratio_{k}"] = round(
                            figs[k] / statistics.median(r[k] for r in runs["base"]), 3
                        )
                        record[f"ratio_{k}_paired"] = round(
                            statistics.median(
                                t[k] / b[k] for t, b in zip(runs["this"], runs["base"], strict=True)
                            ),
                            3,
                        )
                record["load1"] = round(statistics.median(loads), 2)
                emit(sys.stdout, record)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--services", type=int, default=10000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--inputs", default="json,yaml,api", help="comma-separated")
    ap.add_argument(
        "--base", type=Path, help="another checkout: its typed path beside this one's, paired"
    )
    ap.add_argument("--one", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one is not None:
        return _one(args.one)
    c = gen.Cluster(services=args.services, endpoints=args.endpoints)
    inputs = [i for i in args.inputs.split(",") if i]
    if args.base is not None:
        if "api" in inputs:
            ap.error("--base measures manifest inputs (json, yaml, yaml-kubectl)")
        return side_by_side(c, inputs, args.base, args.rounds)
    with tempfile.TemporaryDirectory(prefix="nlp-input-") as tmp:
        runs: dict[str, Callable[[], tuple[dict[str, float], Any]]] = {}
        for name in inputs:
            if name == "api":
                pages = api_pages(c)
                mib = sum(len(b) for _k, b in pages) / 2**20
                runs[name] = lambda pages=pages: pages_stages(pages)  # type: ignore[misc]
            else:
                directory = Path(tmp) / name
                _write_input(c, directory, name)
                mib = sum(p.stat().st_size for p in directory.iterdir()) / 2**20
                runs[name] = lambda d=directory: manifests_stages(d)  # type: ignore[misc]
            log(f"input {name}: {mib:.1f} MiB")
        for name, run in runs.items():
            figures: dict[str, list[dict[str, float]]] = {"parser": [], "typed": []}
            for n in range(args.rounds):
                results = {}
                for which in ("parser", "typed"):
                    log(f"{name} {which} round {n}")
                    with _path(which):
                        figs, changes = run()
                    figures[which].append(figs)
                    results[which] = changes
                    del changes
                if results["parser"] != results["typed"]:
                    print(f"bench_input: {name}: the two paths disagree", file=sys.stderr)
                    return 1
                del results
            medians = {
                w: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
                for w, rs in figures.items()
            }
            for which, figs in medians.items():
                emit(
                    sys.stdout,
                    {
                        "bench": "input",
                        "input": name,
                        "path": which,
                        "services": c.services,
                        "endpoints": c.endpoints,
                        "rounds": args.rounds,
                        **{k: round(v, 3) for k, v in figs.items()},
                        "ratio_total": round(figs["total_s"] / medians["parser"]["total_s"], 3),
                        "load1": round(os.getloadavg()[0], 2),
                    },
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
