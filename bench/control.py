"""Control-plane benchmarks: how long each way of programming the same cluster takes.

Cold full sync (a fresh network namespace each), a one-endpoint change and a restart with nothing
changed, for nlproxy (``run --once`` in a child process, and its ``Syncer`` reused in-process)
next to what kube-proxy hands the kernel for the same input (``nft -f`` in its 1.31 and 1.36
shapes, ``iptables-restore`` with the nft and the legacy backend). Inputs come from ``gen.py``.
Prints JSON lines; never asserts on time. Only the namespaces it creates are touched.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gen
from measure import (
    BenchError,
    Sink,
    Usage,
    emit,
    in_ns,
    log,
    netns,
    nlproxy_argv,
    run_measured,
    sync_applied,
)

BASELINES = ("nft-1.31", "nft-1.36", "iptables-nft", "iptables-legacy")


@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    """One cluster size: a label, the cluster, and which variants run at it."""

    label: str
    cluster: gen.Cluster
    variants: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Inputs:
    """The generated files for one point: JSON and YAML manifests and each baseline's input."""

    json_manifests: Path
    yaml_manifests: Path
    nft: dict[str, Path]
    iptables: Path


def generate(c: gen.Cluster, work: Path, variants: Sequence[str]) -> Inputs:
    """Write only what ``variants`` need (the big texts cost time and disk)."""
    work.mkdir(parents=True, exist_ok=True)
    gen.write_manifests(c, work / "json", "json")
    if "nlproxy-yaml" in variants:
        gen.write_manifests(c, work / "yaml", "yaml")
    nft = {}
    for shape in ("nft-1.31", "nft-1.36"):
        if shape in variants:
            nft[shape] = work / f"{shape}.nft"
            nft[shape].write_text(gen.nft_text(c, shape))
    ipt = work / "iptables.rules"
    if any(v.startswith("iptables") for v in variants):
        ipt.write_text(gen.iptables_text(c))
    return Inputs(json_manifests=work / "json", yaml_manifests=work / "yaml", nft=nft, iptables=ipt)


def load_command(variant: str, ns: str, inp: Inputs) -> tuple[list[str], Path | None]:
    """The command (and stdin file) that programs ``variant``'s rules into ``ns``."""
    if variant == "nlproxy":
        return nlproxy_argv(ns, inp.json_manifests), None
    if variant == "nlproxy-yaml":
        return nlproxy_argv(ns, inp.yaml_manifests), None
    if variant in inp.nft:
        return in_ns(ns, "nft", "-f", str(inp.nft[variant])), None
    if variant == "iptables-nft":
        return in_ns(ns, "iptables-nft-restore"), inp.iptables
    if variant == "iptables-legacy":
        return in_ns(ns, "iptables-legacy-restore"), inp.iptables
    raise BenchError(f"unknown variant {variant!r}")


def record(bench: str, point: str, c: gen.Cluster, variant: str, u: Usage) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "bench": bench,
        "point": point,
        "services": c.services,
        "endpoints": c.endpoints,
        "variant": variant,
        **u.figures(),
        "rc": u.rc,
    }
    applied = sync_applied(u.stderr)
    if applied:
        rec["ops"] = applied.get("ops")
        rec["plan_ms"] = applied.get("plan_ms")
        rec["sync_ms"] = applied.get("duration_ms")
    if u.rc != 0 and not u.timed_out:
        rec["error"] = u.stderr.strip()[-400:]
    return rec


def cold(
    point: Point,
    inp: Inputs,
    out: Sink,
    timeout: float,
    after: Callable[[str, str], None] | None = None,
) -> list[dict[str, Any]]:
    """Cold full sync of every variant of ``point``, each into a fresh namespace; ``after``
    (variant, namespace) runs on the loaded namespace before it is deleted."""
    recs = []
    for variant in point.variants:
        with netns("cold") as ns:
            argv, stdin = load_command(variant, ns, inp)
            log(f"cold {point.label} {variant}")
            u = run_measured(argv, stdin=stdin, timeout=timeout)
            rec = record("cold_sync", point.label, point.cluster, variant, u)
            emit(out, rec)
            recs.append(rec)
            if after is not None and u.rc == 0:
                after(variant, ns)
    return recs


# ---------------------------------------------------------------- one endpoint changed


def nlproxy_change(c: gen.Cluster, work: Path, out: Sink, label: str) -> None:
    """nlproxy's second and third ``run --once``: one slice edited, then nothing changed."""
    manifests = work / "change-json"
    gen.write_manifests(c, manifests, "json")
    edited = gen.edit_one_endpoint(c, c.services // 2)
    with netns("change") as ns:
        first = run_measured(nlproxy_argv(ns, manifests))
        if first.rc != 0:
            raise BenchError(f"nlproxy cold run for the change bench: {first.stderr[-400:]}")
        gen.write_manifests(edited, manifests, "json")
        second = run_measured(nlproxy_argv(ns, manifests))
        emit(out, record("one_endpoint_once", label, c, "nlproxy", second))
        third = run_measured(nlproxy_argv(ns, manifests))
        emit(out, record("restart_unchanged", label, c, "nlproxy", third))


def _inprocess_cold(
    c: gen.Cluster, manifests: Path, ns: str, out: Sink, label: str
) -> tuple[Any, Any]:
    """Load, build the state and sync once into ``ns``, timing each stage; returns the state
    and the ``Syncer`` (the caller closes it)."""
    from nlproxy.cluster.manifests import load_manifests
    from nlproxy.cluster.state import ClusterState
    from nlproxy.proxy.config import ProxyConfig
    from nlproxy.sync.kernel import real as real_kernel
    from nlproxy.sync.syncer import Syncer

    config = ProxyConfig(
        node_name=gen.NODE_NAME,
        cluster_cidrs=(gen.CLUSTER_CIDR,),
        service_cidrs=(gen.SERVICE_CIDR,),
    )
    t0 = time.perf_counter()
    loaded = load_manifests(manifests)
    t1 = time.perf_counter()
    state = ClusterState(gen.NODE_NAME)
    state.apply(loaded.changes)
    snapshot = state.snapshot()
    t2 = time.perf_counter()
    syncer = Syncer(config, real_kernel(ns))
    try:
        first = syncer.sync(snapshot)
    except BaseException:
        syncer.close()
        raise
    t3 = time.perf_counter()
    stages = {
        "load_json_s": t1 - t0,
        "state_s": t2 - t1,
        "sync_s": t3 - t2,
        "plan_s": first.plan_ms / 1000,
        "apply_s": first.apply_ms / 1000,
    }
    emit(
        out,
        {
            "bench": "cold_stages",
            "point": label,
            "services": c.services,
            "endpoints": c.endpoints,
            "variant": "nlproxy",
            **{k: round(v, 3) for k, v in stages.items()},
            "ops": first.total_ops,
        },
    )
    return state, syncer


def nlproxy_inprocess(c: gen.Cluster, work: Path, out: Sink, label: str, rounds: int) -> None:
    """One endpoint changed with a long-lived ``Syncer``: only plan + diff + commit count
    (the slice is parsed and applied to the state before the clock starts)."""
    from nlproxy.cluster.parse import to_change

    manifests = work / "change-json"
    gen.write_manifests(c, manifests, "json")
    i = c.services // 2
    variants = [gen.edit_one_endpoint(c, i), c]
    samples = []
    with netns("inproc") as ns:
        state, syncer = _inprocess_cold(c, manifests, ns, out, label)
        try:
            for r in range(rounds):
                slices = list(gen.slice_docs(variants[r % 2], i))
                state.apply([to_change(doc) for doc in slices])
                t0 = time.perf_counter()
                result = syncer.sync(state.snapshot())
                wall_ms = (time.perf_counter() - t0) * 1000
                samples.append((wall_ms, result.plan_ms, result.apply_ms, result.total_ops))
        finally:
            syncer.close()
    walls = [s[0] for s in samples]
    emit(
        out,
        {
            "bench": "one_endpoint_inprocess",
            "point": label,
            "services": c.services,
            "endpoints": c.endpoints,
            "variant": "nlproxy",
            "rounds": rounds,
            "wall_ms_median": round(statistics.median(walls), 3),
            "wall_ms_max": round(max(walls), 3),
            "plan_ms_median": round(statistics.median(s[1] for s in samples), 3),
            "apply_ms_median": round(statistics.median(s[2] for s in samples), 3),
            # What sync() spends besides planning and diff+commit (conntrack cleanup's
            # before/after frontends, bookkeeping).
            "other_ms_median": round(statistics.median(s[0] - s[1] - s[2] for s in samples), 3),
            "ops": [s[3] for s in samples],
        },
    )


def nft_delta(
    c: gen.Cluster, work: Path, out: Sink, label: str, shape: str, ns: str, rounds: int
) -> None:
    """kube-proxy's partial sync for one changed endpoint, ``nft -f`` into the loaded ``ns``."""
    i = c.services // 2
    edited = gen.edit_one_endpoint(c, i)
    steps = [(edited, c), (c, edited)]
    usages = []
    for r in range(rounds):
        new, old = steps[r % 2]
        path = work / f"delta-{shape}-{r}.nft"
        path.write_text(gen.nft_partial(new, old, i, shape))
        u = run_measured(in_ns(ns, "nft", "-f", str(path)))
        if u.rc != 0:
            raise BenchError(f"nft -f {path} ({shape} delta): {u.stderr.strip()[-400:]}")
        usages.append(u)
    walls = [u.wall * 1000 for u in usages]
    emit(
        out,
        {
            "bench": "one_endpoint_nft",
            "point": label,
            "services": c.services,
            "endpoints": c.endpoints,
            "variant": shape,
            "rounds": rounds,
            "wall_ms_median": round(statistics.median(walls), 3),
            "wall_ms_max": round(max(walls), 3),
            "sys_ms_median": round(statistics.median(u.sys * 1000 for u in usages), 3),
            "user_ms_median": round(statistics.median(u.user * 1000 for u in usages), 3),
            "rss_mib": round(max(u.rss_mib for u in usages), 1),
        },
    )


def run_points(
    points: Sequence[Point],
    change_label: str | None,
    work: Path,
    out: Sink,
    timeout: float,
    rounds: int,
) -> None:
    """Cold sync at every point; at ``change_label`` also the change and restart benches (the
    nft deltas reuse the namespaces the cold ``nft -f`` runs loaded)."""
    for point in points:
        pwork = work / point.label
        log(f"generating {point.label}")
        inp = generate(point.cluster, pwork, point.variants)
        after = None
        if point.label == change_label:
            c, label = point.cluster, point.label

            def after(
                variant: str, ns: str, c: gen.Cluster = c, pwork: Path = pwork, label: str = label
            ) -> None:
                if variant in ("nft-1.31", "nft-1.36"):
                    nft_delta(c, pwork, out, label, variant, ns, rounds)

        cold(point, inp, out, timeout, after)
        if point.label == change_label:
            log(f"one-endpoint change and restart at {point.label}")
            nlproxy_change(point.cluster, pwork, out, point.label)
            nlproxy_inprocess(point.cluster, pwork, out, point.label, rounds)


def main() -> int:
    import argparse
    import sys
    import tempfile

    ap = argparse.ArgumentParser(description="control-plane benchmarks at one point")
    ap.add_argument("--services", type=int, default=1000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--variants", default=",".join(("nlproxy", *BASELINES)))
    ap.add_argument("--change", action="store_true", help="also the change/restart benches")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    c = gen.Cluster(services=args.services, endpoints=args.endpoints)
    label = f"{args.services}x{args.endpoints}"
    point = Point(label=label, cluster=c, variants=tuple(args.variants.split(",")))
    with tempfile.TemporaryDirectory(prefix="nlpb-") as tmp:
        run_points(
            [point],
            label if args.change else None,
            Path(tmp),
            sys.stdout,
            args.timeout,
            args.rounds,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
