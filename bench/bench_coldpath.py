"""Cold-path benchmark: ``run --once`` at S Services x E endpoints, cold and restarted unchanged.

Two views of the same work, each in fresh network namespaces it creates and deletes:

* ``coldpath_cli``: ``nlproxy --netns NS run --once`` as a child process (wall, user, sys, RSS
  from ``wait4``), with JSON and with YAML manifests, first into an empty namespace (cold), then
  again with nothing changed (restart).
* ``coldpath_stages``: the same steps in-process, timed stage by stage: load (manifests), state,
  plan, read-back, diff, validate, encode, commit (per family, summed).

Inputs come from ``gen.py`` (called, not copied). Prints JSON lines; never asserts on time.

    .venv/bin/python bench/bench_coldpath.py --services 10000 --endpoints 10
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gen
from measure import BenchError, emit, log, netns, nlproxy_argv, run_measured

from nlproxy.cluster.manifests import load_manifests
from nlproxy.cluster.state import ClusterState
from nlproxy.nft.backend import NftBackend
from nlproxy.nft.ir import Table
from nlproxy.nft.readback import read_ruleset
from nlproxy.nft.reconcile import diff
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.naming import TABLE as TABLE_NAME
from nlproxy.proxy.planner import plan
from nlproxy.sync.syncer import FAMILIES


def _config() -> ProxyConfig:
    return ProxyConfig(
        node_name=gen.NODE_NAME,
        cluster_cidrs=(gen.CLUSTER_CIDR,),
        service_cidrs=(gen.SERVICE_CIDR,),
    )


def cli_runs(c: gen.Cluster, manifests: dict[str, Path], out: Any) -> None:
    """``run --once`` in a child process: cold, then restart unchanged, per manifest format."""
    for fmt, path in manifests.items():
        with netns("coldcli") as ns:
            for phase in ("cold", "restart"):
                log(f"cli {fmt} {phase}")
                u = run_measured(nlproxy_argv(ns, path), timeout=900)
                if u.rc != 0:
                    raise BenchError(f"run --once {fmt} {phase}: {u.stderr[-400:]}")
                emit(out, _record("coldpath_cli", c, fmt, phase, u.figures()))


def staged_runs(c: gen.Cluster, manifests: Path, out: Any, fmt: str) -> None:
    """The steps of ``run --once`` in-process, cold then restart, each stage timed."""
    with netns("coldstage") as ns:
        for phase in ("cold", "restart"):
            log(f"stages {fmt} {phase}")
            emit(out, _record("coldpath_stages", c, fmt, phase, _stages(manifests, ns)))


def _stages(manifests: Path, ns: str) -> dict[str, Any]:
    t: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        t[name] = t.get(name, 0.0) + now - clock
        clock = now

    loaded = load_manifests(manifests)
    lap("load_s")
    state = ClusterState(gen.NODE_NAME)
    state.apply(loaded.changes)
    snapshot = state.snapshot()
    lap("state_s")
    gc.disable()  # as Syncer.sync does
    try:
        planned = plan(snapshot, _config())
        lap("plan_s")
        ops_total = 0
        for family in FAMILIES:
            current = read_ruleset(family, TABLE_NAME, netns=ns)
            lap("readback_s")
            ops = diff(planned.rulesets[family], current)
            lap("diff_s")
            ops_total += len(ops)
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


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--services", type=int, default=10000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--formats", default="json,yaml", help="manifest formats, comma-separated")
    ap.add_argument("--skip-cli", action="store_true", help="only the in-process stages")
    args = ap.parse_args(argv)
    c = gen.Cluster(services=args.services, endpoints=args.endpoints)
    formats = [f for f in args.formats.split(",") if f]
    with tempfile.TemporaryDirectory(prefix="nlp-coldpath-") as tmp:
        manifests = {}
        for fmt in formats:
            manifests[fmt] = Path(tmp) / fmt
            gen.write_manifests(c, manifests[fmt], fmt)
        for fmt in formats:
            staged_runs(c, manifests[fmt], sys.stdout, fmt)
        if not args.skip_cli:
            cli_runs(c, manifests, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
