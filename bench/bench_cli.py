"""The read-only commands side by side with the tools an operator would otherwise run.

Four targets, each measured as a ratio in one run (rounds interleaved, so load on the machine
hits both sides alike), never asserted:

- ``nlproxy version`` ≤ 0.1 s, next to a bare ``python -c pass`` (the interpreter's floor);
- ``nlproxy conntrack list`` within 1.5x of ``conntrack -L`` on the same N flows;
- ``nlproxy conntrack flush`` of one endpoint's flows of one service among N flows, process start
  to exit, ≤ 0.2x ``conntrack -D`` given the same filter (each round refills what was deleted);
- ``nlproxy rules`` no slower than ``nft list ruleset`` on the same table (S services x E
  endpoints, programmed by ``nlproxy run --once``).

Every command runs in the namespace through ``ip netns exec``, output to ``/dev/null``; wall,
user and sys come from ``wait4``. ``--nlproxy`` measures another build (another checkout's
``.venv/bin/nlproxy``) against the same tools: that is how "before" figures are taken.

    .venv/bin/python bench/bench_cli.py [--flows 100000] [--services 10000] [--endpoints 10]
        [--rounds 5] [--only version,conntrack,flush,rules] [--nlproxy PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_conntrack
import gen
from measure import PY, REPO, Usage, in_ns, netns, nlproxy_argv, run_measured, sh

from nlproxy.conntrack.kernel import Conntrack
from nlproxy.conntrack.messages import FlowFilter

NLPROXY = str(REPO / ".venv" / "bin" / "nlproxy")
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
"""The commands run as an installed package runs them: from bytecode. An environment that
forbids writing it (``PYTHONDONTWRITEBYTECODE``) would have every run compile nlproxy's modules
from source again, tens of milliseconds that no installed copy pays; a warm-up run of each
variant writes the bytecode before anything is measured."""


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def installed(tree: Path, where: Path) -> str:
    """An ``nlproxy`` executable for the source ``tree`` as a package install runs it: a venv
    whose site-packages names the tree and this venv's libraries in a plain ``.pth``. The
    development venv's editable install (``pip install -e``) loads an import finder at every
    interpreter start, ~10 ms that no wheel or Debian package pays."""
    paths = "import sys, sysconfig; print(sys._base_executable, sysconfig.get_paths()['purelib'])"
    base, purelib = sh(PY, "-c", paths).split()
    sh(base, "-m", "venv", "--without-pip", str(where))
    py = where / "bin" / "python"
    site = sh(str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    Path(site, "nlproxy-tree.pth").write_text(f"{tree}\n{purelib}\n")
    exe = where / "bin" / "nlproxy"
    exe.write_text(f"#!{py}\nimport sys\nfrom nlproxy.__main__ import entry\nsys.exit(entry())\n")
    exe.chmod(0o755)
    return str(exe)


def side_by_side(
    what: str, variants: dict[str, list[str]], rounds: int, **labels: object
) -> dict[str, list[Usage]]:
    """Each variant once per round, in turn; one JSON line per variant with its medians."""
    runs: dict[str, list[Usage]] = {v: [] for v in variants}
    for argv in variants.values():  # warm-up: bytecode written, caches filled
        run_measured(argv, timeout=300, env=ENV)
    for _ in range(rounds):
        for name, argv in variants.items():
            u = run_measured(argv, timeout=300, env=ENV)
            if u.rc != 0:
                raise RuntimeError(f"{what}: {name} exited {u.rc}: {u.stderr.strip()[-300:]}")
            runs[name].append(u)
    for name, us in runs.items():
        walls = [u.wall for u in us]
        emit(
            bench="cli",
            command=what,
            variant=name,
            **labels,
            rounds=rounds,
            wall_s=round(statistics.median(walls), 4),
            wall_min_s=round(min(walls), 4),
            wall_max_s=round(max(walls), 4),
            cpu_s=round(statistics.median(u.user + u.sys for u in us), 4),
        )
    return runs


def _median_wall(us: list[Usage]) -> float:
    return statistics.median(u.wall for u in us)


def summary(
    what: str, ours: list[Usage], theirs: list[Usage], target: str, **labels: object
) -> None:
    ratios = sorted(a.wall / b.wall for a, b in zip(ours, theirs, strict=True))
    emit(
        bench="cli-summary",
        command=what,
        **labels,
        ratio=round(_median_wall(ours) / _median_wall(theirs), 2),
        ratio_per_round_min=round(ratios[0], 2),
        ratio_per_round_max=round(ratios[-1], 2),
        target=target,
    )


def bench_version(nlproxy: str, rounds: int) -> None:
    runs = side_by_side(
        "version",
        {"nlproxy version": [nlproxy, "version"], "python -c pass": [PY, "-c", "pass"]},
        rounds,
    )
    ours = runs["nlproxy version"]
    emit(
        bench="cli-summary",
        command="version",
        wall_s=round(_median_wall(ours), 4),
        over_interpreter_s=round(_median_wall(ours) - _median_wall(runs["python -c pass"]), 4),
        target="<= 0.1 s",
        met=_median_wall(ours) <= 0.1,
    )


def bench_conntrack_list(nlproxy: str, flows: int, rounds: int) -> None:
    with netns("cli-ct") as ns:
        created = bench_conntrack.fill(ns, (bench_conntrack.flow(i) for i in range(flows)))
        shown = sh(nlproxy, "--netns", ns, "conntrack", "list").count("\n") - 1  # the count
        listed = sh("conntrack", "-L", ns=ns).count("\n")
        if not created == shown == listed:
            raise RuntimeError(f"conntrack: {created} made, nlproxy shows {shown}, tool {listed}")
        runs = side_by_side(
            "conntrack list",
            {
                "nlproxy conntrack list": in_ns(ns, nlproxy, "conntrack", "list"),
                "conntrack -L": in_ns(ns, "conntrack", "-L"),
            },
            rounds,
            flows=created,
        )
    summary(
        "conntrack list",
        runs["nlproxy conntrack list"],
        runs["conntrack -L"],
        "<= 1.5",
        flows=created,
    )


def bench_conntrack_flush(
    nlproxy: str, flows: int, rounds: int, base: Path | None = None, *, as_installed: bool = True
) -> None:
    """One endpoint's flows of one service (bench_conntrack's victims) deleted by the CLI and by
    ``conntrack -D`` with the same filter, in turn; the table is refilled after each. With
    ``as_installed``, this tree as a package install runs it takes its turn too (see
    :func:`installed`); with ``base`` (another checkout), that tree as installed (a "before" in
    the same run)."""
    svc, ep = 7, 207
    victims = bench_conntrack.one_endpoint(flows, svc, ep)
    dst, endpoint = bench_conntrack.vip(svc), bench_conntrack.endpoint(ep)
    port = str(bench_conntrack.PORT)
    flush = [
        "conntrack", "flush", "--proto", "udp", "--dst", str(dst), "--dport", port,
        "--endpoint", str(endpoint),
    ]  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="nlpb-cli-"))
    this = installed(REPO, tmp / "this") if as_installed else None
    before = installed(base, tmp / "base") if base else None
    variants = {
        "nlproxy conntrack flush": [nlproxy, *flush],
        **({"nlproxy conntrack flush (as installed)": [this, *flush]} if this else {}),
        **({"nlproxy conntrack flush (base, as installed)": [before, *flush]} if before else {}),
        "conntrack -D": [
            "conntrack", "-D", "-p", "udp", "-d", str(dst), "--dport", port,
            "--reply-src", str(endpoint),
        ],
        "python -c pass": [PY, "-c", "pass"],
    }  # fmt: skip
    runs: dict[str, list[Usage]] = {v: [] for v in variants}
    loads: list[float] = []
    passes: list[float] = []
    nowhere = FlowFilter(proto="udp", orig_dst=bench_conntrack.vip(svc) + 1000, orig_dport=53)
    with netns("cli-flush") as ns:
        created = bench_conntrack.fill(ns, (bench_conntrack.flow(i) for i in range(flows)))
        ct = Conntrack(ns)
        for _ in range(rounds + 1):  # the first round warms up and is not counted
            loads.append(os.getloadavg()[0])
            for name, argv in variants.items():
                u = run_measured(in_ns(ns, *argv), timeout=300, env=ENV)
                if u.rc != 0:
                    raise RuntimeError(f"flush: {name} exited {u.rc}: {u.stderr.strip()[-300:]}")
                if len(loads) > 1:
                    runs[name].append(u)
                if name == "python -c pass" and len(loads) > 1:
                    # The kernel's walk of the table for one filter, which no tool avoids.
                    started = time.perf_counter()
                    if list(ct.list(nowhere)):
                        raise RuntimeError("flush: a flow where none was made")
                    passes.append(time.perf_counter() - started)
                if name != "python -c pass":
                    refilled = bench_conntrack.fill(ns, iter(victims))
                    if refilled != len(victims):  # every victim was deleted, so all come back
                        raise RuntimeError(f"flush: {name} left {len(victims) - refilled} flows")
    for name, us in runs.items():
        walls = [u.wall for u in us]
        emit(
            bench="cli",
            command="conntrack flush",
            variant=name,
            flows=created,
            deleted=len(victims),
            rounds=rounds,
            wall_s=round(statistics.median(walls), 4),
            wall_min_s=round(min(walls), 4),
            wall_max_s=round(max(walls), 4),
            cpu_s=round(statistics.median(u.user + u.sys for u in us), 4),
        )
    floor = _median_wall(runs["python -c pass"]) + statistics.median(passes)
    emit(
        bench="cli-floor",
        command="conntrack flush",
        flows=created,
        kernel_pass_s=round(statistics.median(passes), 4),
        interpreter_s=round(_median_wall(runs["python -c pass"]), 4),
        floor_ratio=round(floor / _median_wall(runs["conntrack -D"]), 2),
        note="an interpreter start and one filtered dump pass, before any of nlproxy's code",
    )
    summary(
        "conntrack flush",
        runs["nlproxy conntrack flush"],
        runs["conntrack -D"],
        "<= 0.2",
        flows=created,
        load1_min=round(min(loads), 2),
        load1_max=round(max(loads), 2),
    )
    if this:
        summary(
            "conntrack flush, as installed",
            runs["nlproxy conntrack flush (as installed)"],
            runs["conntrack -D"],
            "<= 0.2",
            flows=created,
        )
    if this and before:
        summary(
            "conntrack flush, this / base, both as installed",
            runs["nlproxy conntrack flush (as installed)"],
            runs["nlproxy conntrack flush (base, as installed)"],
            "< 1",
            flows=created,
        )
    shutil.rmtree(tmp, ignore_errors=True)


def bench_rules(nlproxy: str, services: int, endpoints: int, rounds: int) -> None:
    cluster = gen.Cluster(services=services, endpoints=endpoints)
    with tempfile.TemporaryDirectory(prefix="nlpb-cli-") as tmp, netns("cli-rules") as ns:
        manifests = Path(tmp)
        gen.write_manifests(cluster, manifests, fmt="json")
        loaded = run_measured(nlproxy_argv(ns, manifests), timeout=600)
        if loaded.rc != 0:
            raise RuntimeError(f"rules: run --once exited {loaded.rc}: {loaded.stderr[-300:]}")
        lines = sh(nlproxy, "--netns", ns, "rules").count("\n")
        runs = side_by_side(
            "rules",
            {
                "nlproxy rules": in_ns(ns, nlproxy, "rules"),
                "nft list ruleset": in_ns(ns, "nft", "list", "ruleset"),
            },
            rounds,
            services=services,
            endpoints=endpoints,
            lines=lines,
        )
    summary(
        "rules",
        runs["nlproxy rules"],
        runs["nft list ruleset"],
        "<= 1.0",
        services=services,
        endpoints=endpoints,
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flows", type=int, default=100_000)
    ap.add_argument("--services", type=int, default=10_000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", default="version,conntrack,flush,rules")
    ap.add_argument("--nlproxy", default=NLPROXY, help="the nlproxy executable to measure")
    ap.add_argument(
        "--base", type=Path, help="another checkout (a source tree) whose flush takes its turn too"
    )
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_cli: needs root (network namespaces, conntrack)", file=sys.stderr)
        return 2
    parts = set(args.only.split(","))
    if "version" in parts:
        bench_version(args.nlproxy, max(args.rounds, 10))
    if "conntrack" in parts:
        bench_conntrack_list(args.nlproxy, args.flows, args.rounds)
    if "flush" in parts:
        bench_conntrack_flush(args.nlproxy, args.flows, args.rounds, args.base)
    if "rules" in parts:
        bench_rules(args.nlproxy, args.services, args.endpoints, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
