"""``nlproxy compare`` at S Services, two trees side by side in one run: CPU seconds of the
whole command and whether both trees print the same certificate.

One cluster (``gen.Cluster``: S ClusterIP Services x E endpoints) is written as manifests, and
kube-proxy's nftables ruleset for it (``gen.nft_text``, the 1.36 shape, or ``--shape``) is
loaded into one fresh namespace. Then, for each round, this checkout and ``--base DIR`` (their
order swapped every round) each run ``nlproxy --netns NS compare --manifests … --json`` in a
child of their own: the read of kube-proxy's table, the plan, and one trace per probe through
both rulesets. Each child runs its checkout from compiled bytecode (``checkout_run``), as an
installed nlproxy does. Figures, per tree (medians over the rounds): ``cpu_s`` (user + system
of the child), ``wall_s``; then ``ratio`` (this / base) and ``same_output`` (the two trees' JSON
certificates are equal: a faster tracer that answers differently is no faster tracer).

    .venv/bin/python bench/bench_compare.py --base ../wt-base --services 2000 --endpoints 10
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import checkout_run, gen  # noqa: E402
from tests.netns import namespace, sh  # noqa: E402

FLAGS = ["--node-name", gen.NODE_NAME, "--cluster-cidr", str(gen.CLUSTER_CIDR)]


def one(tree: Path, ns: str, manifests: Path) -> tuple[dict[str, float], str]:
    """One ``compare`` by ``tree``'s nlproxy: (figures, its JSON output)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        checkout_run.command(tree, ["-m", "nlproxy", "--netns", ns, "compare", "--manifests",
                                    manifests, "--json", *FLAGS]),
        cwd=tree, env=checkout_run.environ(tree, [tree]), capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 4):  # 4: a difference found, still a certificate
        raise SystemExit(f"{tree}: compare exited {proc.returncode}: {proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_s": cpu, "wall_s": wall}, proc.stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="the other checkout")
    ap.add_argument("--services", type=int, default=2000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shape", default="nft-1.36", choices=["nft-1.31", "nft-1.36"])
    args = ap.parse_args(argv)
    cluster = gen.Cluster(services=args.services, endpoints=args.endpoints)
    trees = {"base": args.base.resolve(), "this": ROOT}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    outputs: dict[str, set[str]] = {name: set() for name in trees}
    checkout_run.prepare(trees.values())  # both from bytecode, as installed: no compile counted
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp, namespace("bcmp") as ns:
        manifests = Path(tmp) / "cluster"
        gen.write_manifests(cluster, manifests)
        rules = Path(tmp) / "kube-proxy.nft"
        rules.write_text(gen.nft_text(cluster, args.shape))
        sh("nft", "-f", str(rules), ns=ns)
        for r in range(args.rounds):
            # paired rounds, the order alternating: a load that comes and goes hits both sides
            for name, tree in sorted(trees.items(), reverse=r % 2 == 1):
                figures, out = one(tree, ns, manifests)
                runs[name].append(figures)
                outputs[name].add(out)
    certificate: dict[str, Any] = json.loads(next(iter(outputs["this"])))
    row: dict[str, Any] = {
        "bench": "compare",
        "services": args.services,
        "endpoints": args.endpoints,
        "shape": args.shape,
        "rounds": args.rounds,
        "summary": certificate.get("summary"),
    }
    for name in trees:
        for key in ("cpu_s", "wall_s"):
            row[f"{name}_{key}"] = round(statistics.median(r[key] for r in runs[name]), 3)
    row["ratio"] = round(row["this_cpu_s"] / row["base_cpu_s"], 3)
    row["same_output"] = len(outputs["base"] | outputs["this"]) == 1
    print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
