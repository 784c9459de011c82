"""Cold-path benchmark: ``run --once`` at S Services x E endpoints, cold and restarted unchanged.

Two views of the same work, each in fresh network namespaces it creates and deletes:

* ``coldpath_cli``: ``nlproxy --netns NS run --once`` as a child process (wall, user, sys, RSS
  from ``wait4``, and the load average when it started), with a JSON ``List`` and with
  block-style YAML manifests (``gen.write_manifests``; ``yaml-flow`` is the JSON-in-YAML form,
  ``yaml-kubectl`` the block style with the UIDs and timestamps kubectl writes),
  first into an empty namespace (cold), then again with nothing changed (restart); with
  ``--base CHECKOUT``, the same from another checkout too, before/after in one run.
  ``--rounds`` rounds, interleaved with ``iptables-legacy-restore`` loading the same cluster
  (kube-proxy's iptables mode, ``gen.iptables_text``) into a fresh namespace: the ratio is what
  issue 18's "no slower than iptables-legacy-restore" reads;
* ``coldpath_stages``: the same steps in-process, timed stage by stage: read (the files'
  bytes), decode (the loader's text -> documents step), both timed apart on the same files, then
  load (``load_manifests``: read + decode + parse; ``parse_s`` is load less the other two),
  state, plan, read-back, diff, validate, encode, commit (per family, summed);
* ``coldpath_load`` (``--load-rounds N``): ``load_manifests`` alone, as ``run --once`` calls it
  (``read_manifests``, then the load), in a child process per round, checkout and format:
  the read and load CPU seconds measured in the child, and its peak RSS;
* ``after_commit`` (``--after-commit N``): N rounds of one ``Syncer``'s cold sync into a fresh
  namespace, in a child process per round (from ``--base`` too, interleaved): the Syncer's own
  figures, and ``after_commit_s``, what it did once the kernel had accepted the last batch
  (``apply_ms`` less diffing and committing: caching what was programmed, the conntrack
  cleanup's frontends, the restart records' bookkeeping);
* ``burst_stages`` (``--burst B``): one long-lived ``Syncer`` at the same size: B EndpointSlices
  changed at once (state, plan, diff, commit; commit includes validate and encode, as
  ``SyncResult`` reports it), then a verify tick that reads the tables back (read-back, then
  the sync that compares them with the plan).

Inputs come from ``gen.py`` (called, not copied). Prints JSON lines; never asserts on time.

    .venv/bin/python bench/bench_coldpath.py --services 10000 --endpoints 10
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gen
from measure import BenchError, emit, in_ns, log, netns, nlproxy_argv, run_measured, sync_applied

from nlproxy.cluster.manifests import SUFFIXES, load_manifests
from nlproxy.cluster.state import ClusterState
from nlproxy.nft.backend import NftBackend
from nlproxy.nft.ir import FAMILIES, Table
from nlproxy.nft.readback import read_ruleset
from nlproxy.nft.reconcile import diff
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.naming import TABLE as TABLE_NAME
from nlproxy.proxy.planner import plan
from nlproxy.sync.kernel import real as real_kernel


def _config() -> ProxyConfig:
    return ProxyConfig(
        node_name=gen.NODE_NAME,
        cluster_cidrs=(gen.CLUSTER_CIDR,),
        service_cidrs=(gen.SERVICE_CIDR,),
    )


def _from(base: Path | None, argv: list[str]) -> list[str]:
    """``argv`` (``python -m nlproxy ...``) run from the checkout ``base`` instead of this one."""
    if base is None:
        return argv
    start = f"import sys, runpy; sys.path.insert(0, {str(base)!r}); "
    start += "runpy.run_module('nlproxy', run_name='__main__', alter_sys=True)"
    return [argv[0], "-c", start, *argv[3:]]


def cli_runs(
    c: gen.Cluster,
    manifests: dict[str, Path],
    out: Any,
    rounds: int,
    legacy: Path | None,
    base: Path | None = None,
) -> None:
    """``run --once`` in a child process: cold, then restart unchanged, per manifest format
    (and the same from the checkout ``base``, when given, for before/after in one run); each
    round also loads ``legacy`` (iptables-restore text) with ``iptables-legacy-restore``. Each
    record carries the load average at its start."""
    checkouts: list[tuple[str, Path | None]] = [("this", None)]
    if base is not None:
        checkouts.insert(0, ("base", base))
    for n in range(rounds):
        for (which, tree), (fmt, path) in ((t, m) for t in checkouts for m in manifests.items()):
            with netns("coldcli") as ns:
                for phase in ("cold", "restart"):
                    log(f"cli {which} {fmt} {phase} round {n}")
                    load = os.getloadavg()[0]
                    u = run_measured(_from(tree, nlproxy_argv(ns, path)), timeout=900)
                    if u.rc != 0:
                        raise BenchError(f"run --once {fmt} {phase}: {u.stderr[-400:]}")
                    ops = sync_applied(u.stderr).get("ops")
                    figs = {**u.figures(), "round": n, "ops": ops, "load1": load}
                    if base is not None:
                        figs["checkout"] = which
                    emit(out, _record("coldpath_cli", c, fmt, phase, figs))
        if legacy is not None:
            with netns("coldipt") as ns:
                log(f"cli iptables-legacy-restore round {n}")
                load = os.getloadavg()[0]
                u = run_measured(in_ns(ns, "iptables-legacy-restore"), stdin=legacy, timeout=900)
                if u.rc != 0:
                    raise BenchError(f"iptables-legacy-restore: {u.stderr[-400:]}")
                figs = {**u.figures(), "round": n, "load1": load}
                emit(out, _record("coldpath_cli", c, "iptables-legacy", "cold", figs))


# ``load_manifests`` alone in a fresh interpreter, as ``run --once`` calls it (the files read
# once, then loaded, GC off): CPU seconds of each, reported on stderr as one JSON line.
_LOAD = """
import gc, json, sys, time
from pathlib import Path
from nlproxy.cluster.manifests import load_manifests, read_manifests
directory = Path(sys.argv[1])
gc.disable()
t0 = time.process_time()
read = read_manifests(directory)
t1 = time.process_time()
loaded = load_manifests(directory, read=read)
t2 = time.process_time()
objects = sum(len(r.changes) for r in loaded.changes)
print(json.dumps({"read_s": t1 - t0, "load_s": t2 - t1, "objects": objects}), file=sys.stderr)
"""


_HERE = Path(__file__).resolve().parents[1]


def load_runs(
    c: gen.Cluster, manifests: dict[str, Path], out: Any, rounds: int, base: Path | None
) -> None:
    """``load_manifests`` in a child process per round, checkout and format, interleaved: the
    read and load CPU seconds in the child and the child's peak RSS (``coldpath_load``)."""
    checkouts: list[tuple[str, Path | None]] = [("this", None)]
    if base is not None:
        checkouts.insert(0, ("base", base))
    for n in range(rounds):
        for (which, tree), (fmt, path) in ((t, m) for t in checkouts for m in manifests.items()):
            log(f"load {which} {fmt} round {n}")
            start = f"import sys; sys.path.insert(0, {str(tree or _HERE)!r}); "
            load = os.getloadavg()[0]
            u = run_measured([sys.executable, "-c", start + _LOAD, str(path)], timeout=900)
            if u.rc != 0:
                raise BenchError(f"load {which} {fmt}: {u.stderr[-400:]}")
            child = json.loads(u.stderr.splitlines()[-1])
            figs = {**u.figures(), **{k: round(v, 4) for k, v in child.items()}}
            figs.update(round=n, load1=load, checkout=which)
            emit(out, _record("coldpath_load", c, fmt, "cold", figs))


def staged_runs(c: gen.Cluster, manifests: Path, out: Any, fmt: str) -> None:
    """The steps of ``run --once`` in-process, cold then restart, each stage timed (with the
    cyclic GC paused throughout, as ``run --once`` pauses it)."""
    with netns("coldstage") as ns:
        for phase in ("cold", "restart"):
            log(f"stages {fmt} {phase}")
            emit(out, _record("coldpath_stages", c, fmt, phase, _stages(manifests, ns, fmt)))


def _read_decode(manifests: Path, fmt: str) -> tuple[float, float]:
    """Seconds to read the files' bytes, and to decode them as the loader does (the product's
    loader does both and then parses; these are timed apart on the same files).

    The decode is the loader's own: a JSON file's objects from its bytes into the typed
    structs (a ``List``'s head, then each member in one decode), no model built; a YAML file
    through the compiled decoder, batch by batch, with the YAML 1.1 check. ``parse`` is then
    what the loader does beyond that: the typed structs (or documents) to the model.
    """
    import contextlib

    import msgspec

    from nlproxy.cluster import decode, typed

    try:
        from nlproxy.cluster import fileobjects as loader
    except ImportError:  # a checkout from before a file's objects had a module of their own
        from nlproxy.cluster import manifests as loader  # type: ignore[no-redef]

    gc.disable()  # as load_manifests does
    try:
        t0 = time.perf_counter()
        paths = [p for p in sorted(manifests.iterdir()) if p.suffix in SUFFIXES]
        raws = [p.read_bytes() for p in paths]
        t1 = time.perf_counter()
        for path, raw in zip(paths, raws, strict=True):
            if path.suffix == ".json":
                items = loader._HEAD.decode(raw).items or []
                for member in items:
                    # A kind the typed structs do not take (a Node) is left to the parser.
                    with contextlib.suppress(msgspec.ValidationError):
                        typed.MANIFEST_ITEM.decode(member)
            else:
                for _batch in decode.batches(path, raw):
                    pass
        t2 = time.perf_counter()
    finally:
        gc.enable()
    return t1 - t0, t2 - t1


def _stages(manifests: Path, ns: str, fmt: str) -> dict[str, Any]:
    read_s, decode_s = _read_decode(manifests, fmt)
    t: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        t[name] = t.get(name, 0.0) + now - clock
        clock = now

    gc.disable()  # as run --once does, from the load to the end
    try:
        loaded = load_manifests(manifests)
        lap("load_s")
        state = ClusterState(gen.NODE_NAME)
        state.apply(loaded.changes)
        snapshot = state.snapshot()
        lap("state_s")
        planned = plan(snapshot, _config())
        lap("plan_s")
        ops_total = 0
        for family in FAMILIES:
            current = read_ruleset(family, TABLE_NAME, netns=ns)
            lap("readback_s")
            ops = diff(planned.rulesets[family], current)
            lap("diff_s")
            ops_total += sum(len(op.obj.keys) if hasattr(op.obj, "keys") else 1 for op in ops)
            if ops:
                with NftBackend(Table(family=family, name=TABLE_NAME), netns=ns) as backend:
                    res = backend.apply(ops)
                lap("apply_s")
                t["validate_s"] = t.get("validate_s", 0.0) + res.validate_s
                t["encode_s"] = t.get("encode_s", 0.0) + res.encode_s
                t["commit_s"] = t.get("commit_s", 0.0) + res.commit_s
    finally:
        gc.enable()
    figures: dict[str, Any] = {k: round(v, 3) for k, v in t.items()}
    parts = ("validate_s", "encode_s", "commit_s")  # inside apply_s
    figures["total_s"] = round(sum(v for k, v in t.items() if k not in parts), 3)
    figures["read_s"] = round(read_s, 3)
    figures["decode_s"] = round(decode_s, 3)
    figures["parse_s"] = round(max(0.0, t["load_s"] - read_s - decode_s), 3)
    figures["ops"] = ops_total
    return figures


def _record(
    bench: str, c: gen.Cluster, fmt: str, phase: str, figs: dict[str, Any]
) -> dict[str, Any]:
    return {
        "bench": bench,
        "services": c.services,
        "endpoints": c.endpoints,
        "format": fmt,
        "phase": phase,
        **figs,
    }


_AFTER_COMMIT_CHILD = """
import gc, json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
sys.path.insert(1, sys.argv[2])
import gen
from nlproxy.cluster.manifests import load_manifests
from nlproxy.cluster.state import ClusterState
from tests import netns
from nlproxy.proxy.config import ProxyConfig
from nlproxy.sync.kernel import real
from nlproxy.sync.syncer import Syncer
config = ProxyConfig(
    node_name=gen.NODE_NAME, cluster_cidrs=(gen.CLUSTER_CIDR,), service_cidrs=(gen.SERVICE_CIDR,)
)
state = ClusterState(gen.NODE_NAME)
state.apply(load_manifests(Path(sys.argv[3])).changes)
ns = netns.create(netns.unique_name("bench-after"))
try:
    gc.disable()
    syncer = Syncer(config, real(ns))
    t = time.perf_counter()
    res = syncer.sync(state.snapshot())
    wall = time.perf_counter() - t
    syncer.close()
finally:
    netns.delete(ns)
after = res.apply_ms - res.diff_ms - res.commit_ms
print(json.dumps({
    "plan_s": round(res.plan_ms / 1000, 3), "diff_s": round(res.diff_ms / 1000, 3),
    "commit_s": round(res.commit_ms / 1000, 3), "after_commit_s": round(after / 1000, 3),
    "sync_s": round(wall, 3), "ops": res.total_ops,
}))
"""


def after_commit_runs(
    c: gen.Cluster, manifests: Path, out: Any, rounds: int, base: Path | None
) -> None:
    """``after_commit`` rows (see the module): a child per round and checkout, interleaved."""
    from bench import checkout_run

    here = Path(__file__).resolve().parent
    trees = [("this", here.parent)] + ([("base", base)] if base is not None else [])
    checkout_run.prepare(tree for _, tree in trees)
    for r in range(rounds):
        for label, tree in trees:
            argv = ["-c", _AFTER_COMMIT_CHILD, tree, here, manifests]
            load = os.getloadavg()
            figs = checkout_run.json_result("bench_coldpath", tree, argv)
            rec = _record("after_commit", c, "json", "cold", figs)
            rec.update(tree=label, round=r, loadavg=[round(x, 2) for x in load])
            out.write(json.dumps(rec) + "\n")
            out.flush()


def burst_stages(c: gen.Cluster, count: int, out: Any) -> None:
    """A burst of ``count`` changed slices through one long-lived ``Syncer``, then a verify
    tick that reads the tables back; each stage timed (``bench_incremental``'s cluster)."""
    from bench_incremental import CONFIG, cluster, eps_slice, namespace, upsert_of

    from nlproxy.sync.syncer import Syncer

    state = cluster(c.services, c.endpoints, nodeport_every=0)
    shape = {"services": c.services, "endpoints": c.endpoints}
    with namespace() as ns:
        syncer = Syncer(CONFIG, real_kernel(ns))
        try:
            syncer.sync(state.snapshot())
            log(f"burst stages: {count} slices")
            count = min(count, c.services)
            t0 = time.perf_counter()
            changed = state.apply(
                [upsert_of(eps_slice(i, c.endpoints, skip=0)) for i in range(count)]
            )
            snapshot = state.snapshot()
            t1 = time.perf_counter()
            res = syncer.sync(snapshot, changed=changed)
            t2 = time.perf_counter()
            emit(
                out,
                {
                    "bench": "burst_stages",
                    "what": "burst",
                    **shape,
                    "updates": count,
                    "path": "incremental" if res.incremental else "full",
                    "state_s": round(t1 - t0, 3),
                    "plan_s": round(res.plan_ms / 1000, 3),
                    "diff_s": round(res.diff_ms / 1000, 3),
                    "commit_s": round(res.commit_ms / 1000, 3),
                    "commit_includes": "validate+encode",
                    "total_s": round(t2 - t0, 3),
                    "ops": res.total_ops,
                },
            )
            log("burst stages: a read-back verify tick")
            t0 = time.perf_counter()
            syncer.verify()
            t1 = time.perf_counter()
            res = syncer.sync(snapshot)
            t2 = time.perf_counter()
            emit(
                out,
                {
                    "bench": "burst_stages",
                    "what": "verify",
                    **shape,
                    "readback_s": round(t1 - t0, 3),
                    "plan_s": round(res.plan_ms / 1000, 3),
                    "verify_s": round(res.diff_ms / 1000, 3),
                    "total_s": round(t2 - t0, 3),
                    "ops": res.total_ops,
                },
            )
        finally:
            syncer.close()


def write_kubectl_yaml(c: gen.Cluster, out: Path) -> None:
    """``gen``'s block-style YAML with what ``kubectl get -o yaml`` also writes for every
    object: a quoted ``creationTimestamp`` and a plain ``uid`` (most UIDs start with a digit),
    the ``yaml-kubectl`` format."""
    out.mkdir(parents=True, exist_ok=True)
    groups = {
        "node": [gen.node_doc()],
        "services": [gen.service_doc(c, i) for i in range(c.services)],
        "endpointslices": [d for i in range(c.services) for d in gen.slice_docs(c, i)],
    }
    n = 0
    for stem, docs in groups.items():
        with (out / f"{stem}.yaml").open("w") as f:
            for doc in docs:
                n += 1
                uid = uuid.UUID(int=(n * 0x9E3779B97F4A7C15_F39CC0605CEDC834) % (1 << 128))
                doc["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
                doc["metadata"]["uid"] = "UID"
                f.write("---\n")
                lines = gen._block(doc, "")
                f.writelines(line.replace("uid: UID", f"uid: {uid}") for line in lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--services", type=int, default=10000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--formats", default="json,yaml", help="manifest formats, comma-separated")
    ap.add_argument("--skip-cli", action="store_true", help="only the in-process stages")
    ap.add_argument("--skip-stages", action="store_true", help="only the child processes")
    ap.add_argument("--rounds", type=int, default=1, help="child-process rounds (interleaved)")
    ap.add_argument(
        "--no-legacy", action="store_true", help="skip iptables-legacy-restore beside run --once"
    )
    ap.add_argument("--burst", type=int, default=0, metavar="B", help="burst stages (0: skip)")
    ap.add_argument(
        "--after-commit",
        type=int,
        default=0,
        metavar="N",
        help="a Syncer's cold sync in a child, N rounds per checkout: its after-commit work",
    )
    ap.add_argument(
        "--load-rounds",
        type=int,
        default=0,
        metavar="N",
        help="load_manifests alone in a child, N rounds per checkout and format (0: skip)",
    )
    ap.add_argument(
        "--base", type=Path, help="another checkout whose run --once runs beside this one's"
    )
    args = ap.parse_args(argv)
    c = gen.Cluster(services=args.services, endpoints=args.endpoints)
    formats = [f for f in args.formats.split(",") if f]
    with tempfile.TemporaryDirectory(prefix="nlp-coldpath-") as tmp:
        manifests = {}
        for fmt in formats:
            manifests[fmt] = Path(tmp) / fmt
            if fmt == "yaml-kubectl":
                write_kubectl_yaml(c, manifests[fmt])
            else:
                gen.write_manifests(c, manifests[fmt], fmt)
        # The child processes first: a child forked from this process once it holds a planned
        # cluster inherits that peak in its ru_maxrss (the kernel keeps the pre-exec high-water
        # mark), which would hide the child's own.
        if not args.skip_cli:
            legacy = None
            if not args.no_legacy:
                legacy = Path(tmp) / "iptables.rules"
                legacy.write_text(gen.iptables_text(c))
            cli_runs(c, manifests, sys.stdout, args.rounds, legacy, args.base)
        if args.load_rounds:
            load_runs(c, manifests, sys.stdout, args.load_rounds, args.base)
        for fmt in formats if not args.skip_stages else ():
            staged_runs(c, manifests[fmt], sys.stdout, fmt)
        if args.after_commit:
            if "json" not in manifests:
                manifests["json"] = Path(tmp) / "json"
                gen.write_manifests(c, manifests["json"], "json")
            after_commit_runs(c, manifests["json"], sys.stdout, args.after_commit, args.base)
        if args.burst:
            burst_stages(c, args.burst, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
