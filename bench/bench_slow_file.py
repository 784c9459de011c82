"""Does one large or broken manifest file hold back another file's change? (``cluster/watchdir.py``)

A directory holds ``big.yaml`` (S Services x E endpoints as block YAML, as kubectl writes it) and
``small.yaml`` (one Service). While ``big.yaml`` is rewritten every ``--interval`` seconds, the
small Service's port is changed every ``--small-every`` seconds, and the time from each such
write until the manifests source sends a load holding the new port is recorded. Scenarios:

* ``broken``: ``big.yaml`` cut mid-line (a half-written file), a different cut each time;
* ``broken-same``: the same cut written again each time;
* ``valid``: ``big.yaml`` whole, one endpoint changed each time (two versions in turn).

It also times what one parse of the big file costs, accepted (whole) and rejected (cut).
Figures are JSON lines; ``--src`` runs another checkout's ``nlproxy`` (its tree) instead of
this one's, for a before/after in one sitting. No kernel, no daemon: the source alone:

    .venv/bin/python bench/bench_slow_file.py --services 6000 --endpoints 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _small(port: int) -> str:
    return (
        "apiVersion: v1\nkind: Service\nmetadata: {name: small, namespace: default}\n"
        f"spec: {{clusterIP: 10.100.0.1, ports: [{{port: {port}}}]}}\n"
    )


def _big(gen: Any, c: Any, round_: int) -> bytes:
    docs = [gen.service_doc(c, i) for i in range(c.services)]
    docs += [d for i in range(c.services) for d in gen.slice_docs(c, i)]
    import io

    out = io.StringIO()
    out.write(f"# round {round_}\n")
    gen._write_block_docs(out, docs)
    return out.getvalue().encode()


def _cut(whole: bytes, round_: int) -> bytes:
    """``whole`` cut in the middle of a key (a half-written file that does not parse), at a
    point that moves with ``round_``."""
    at = whole.index(b"nodeName:", len(whole) // 2 + round_ * 7919)
    return whole[: at + 6]


def _write(path: Path, data: bytes) -> None:
    """As an editor or a config tool does: a temporary file renamed over the old."""
    tmp = path.with_name(".tmp-" + path.name)
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _port_of_small(changes: Sequence[Any]) -> int | None:
    for replace in changes:
        if replace.kind != "Service":
            continue
        for change in reversed(replace.changes):
            if change.ref.name == "small":
                return int(change.obj.ports[0].port)
    return None


def run_scenario(args: argparse.Namespace, scenario: str) -> dict[str, Any]:
    import trio

    from bench import gen
    from nlproxy.cluster.model import Change
    from nlproxy.cluster.watchdir import ManifestSource

    c = gen.Cluster(services=args.services, endpoints=args.endpoints)
    whole = _big(gen, c, 0)
    with TemporaryDirectory() as tmp:
        d = Path(tmp)
        big = d / "big.yaml"
        big.write_bytes(whole)
        (d / "small.yaml").write_text(_small(1000))
        latencies: list[float] = []
        written: dict[int, float] = {}
        stop = threading.Event()

        # Made before the clock starts: generating 20 MB of YAML here would take the
        # interpreter lock from the source being measured.
        edited = [_big(gen, gen.edit_one_endpoint(c, i), i) for i in (1, 2)]

        def rewrite_big() -> None:
            round_ = 1
            while not stop.wait(args.interval):
                if scenario == "valid":
                    data = edited[round_ % 2]
                elif scenario == "broken":
                    data = _cut(whole, round_)
                else:
                    data = _cut(whole, 0)
                _write(big, data)
                round_ += 1

        async def main() -> None:
            source = ManifestSource(d)
            send, recv = trio.open_memory_channel[Sequence[Change]](1000)
            async with trio.open_nursery() as nursery:
                await nursery.start(source.run, send)
                await recv.receive()
                writer = threading.Thread(target=rewrite_big, daemon=True)
                writer.start()

                async def small_writer() -> None:
                    port = 1001
                    for _ in range(args.changes):
                        await trio.sleep(args.small_every)
                        written[port] = time.monotonic()
                        small = _small(port).encode()
                        await trio.to_thread.run_sync(_write, d / "small.yaml", small)
                        port += 1
                    with trio.move_on_after(args.tail):  # let the last change land
                        await last_landed.wait()
                    nursery.cancel_scope.cancel()

                last_landed = trio.Event()
                nursery.start_soon(small_writer)
                seen: set[int] = set()
                async for changes in recv:
                    port = _port_of_small(changes)
                    now = time.monotonic()
                    if port is not None and port in written and port not in seen:
                        seen.add(port)
                        latencies.append(now - written[port])
                    if port == 1000 + args.changes:
                        last_landed.set()

        trio.run(main)
        stop.set()
    missed = args.changes - len(latencies)
    return {
        "bench": "slow_file",
        "scenario": scenario,
        "src": str(args.src or REPO),
        "big_mb": round(len(whole) / 1e6, 1),
        "interval_s": args.interval,
        "changes": args.changes,
        "landed": len(latencies),
        "superseded_or_late": missed,
        "latency_median_s": round(statistics.median(latencies), 3) if latencies else None,
        "latency_max_s": round(max(latencies), 3) if latencies else None,
        "latencies_s": [round(x, 2) for x in latencies],
    }


def parse_costs(args: argparse.Namespace) -> dict[str, Any]:
    """One parse of the big file, whole and cut, CPU seconds (the median of ``--parses``)."""
    from bench import gen
    from nlproxy.cluster.manifests import load_manifests

    c = gen.Cluster(services=args.services, endpoints=args.endpoints)
    whole = _big(gen, c, 0)
    out: dict[str, Any] = {"bench": "slow_file_parse", "src": str(args.src or REPO)}
    for what, data in (("accept", whole), ("reject", _cut(whole, 0))):
        times = []
        with TemporaryDirectory() as tmp:
            (Path(tmp) / "big.yaml").write_bytes(data)
            for _ in range(args.parses):
                start = time.process_time()
                load_manifests(Path(tmp))  # a file that does not parse is named, not raised
                times.append(time.process_time() - start)
        out[f"{what}_cpu_s"] = round(statistics.median(times), 3)
    out["reject_over_accept"] = round(out["reject_cpu_s"] / out["accept_cpu_s"], 1)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--services", type=int, default=6000)
    p.add_argument("--endpoints", type=int, default=10)
    p.add_argument("--interval", type=float, default=5.0, help="seconds between big rewrites")
    p.add_argument("--small-every", type=float, default=1.1, help="seconds between small edits")
    p.add_argument("--changes", type=int, default=15, help="small edits per scenario")
    p.add_argument("--parses", type=int, default=3)
    p.add_argument("--tail", type=float, default=120.0, help="most seconds to wait for the last")
    p.add_argument(
        "--scenario",
        action="append",
        choices=["broken", "broken-same", "valid"],
        help="default: all three",
    )
    p.add_argument("--src", type=Path, help="the checkout whose nlproxy/ to run (default: this)")
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO))  # bench.gen
    if args.src is not None:
        sys.path.insert(0, str(args.src))
    from nlproxy.log import configure

    configure(level="warning", fmt="console")
    print(json.dumps(parse_costs(args)), flush=True)
    for scenario in args.scenario or ["broken", "broken-same", "valid"]:
        print(json.dumps(run_scenario(args, scenario)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
