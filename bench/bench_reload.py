"""What a manifests reload costs the daemon's event loop (``cluster/watchdir.py``).

A directory of S services x E endpoints as block YAML (as kubectl writes it) is rewritten
``--rewrites`` times, every ``--interval`` seconds, while a task on the loop wakes every 10 ms
and records how late it is: the longest stall and the time the loop was blocked, with the load
in a worker thread (as the daemon does) and on the loop itself (as before), side by side in one
run. A stall is a ``/livez`` left unanswered and a repair waiting. No kernel:

    .venv/bin/python bench/bench_reload.py --services 2000 --endpoints 10
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from tempfile import TemporaryDirectory

import trio
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import gen
from nlproxy.cluster.manifests import load_manifests
from nlproxy.cluster.model import Change
from nlproxy.cluster.watchdir import ManifestSource
from nlproxy.log import configure

TICK = 0.01


class OnTheLoop(ManifestSource):
    """The source as it was: the directory read and parsed on the event loop."""

    async def _load(self) -> Sequence[Change]:
        loaded = load_manifests(self.directory, self._good)
        self._good = loaded.good
        self._unsettled = loaded.unsettled
        return list(loaded.changes)


def _write(c: gen.Cluster, path: Path, round_: int) -> None:
    docs = [gen.service_doc(c, i) for i in range(c.services)]
    docs += [d for i in range(c.services) for d in gen.slice_docs(c, i)]
    tmp = path.with_name(".tmp")
    tmp.write_text(f"# round {round_}\n" + yaml.safe_dump_all(docs, sort_keys=False))
    os.replace(tmp, path)


async def _stalls(
    source_type: type[ManifestSource], directory: Path, rewrite: bytes, n: int, interval: float
) -> tuple[float, float]:
    """(longest stall, seconds blocked in all) while the file is rewritten ``n`` times."""
    source = source_type(directory)
    send, recv = trio.open_memory_channel[Sequence[Change]](100)
    gaps: list[float] = []

    async def drain() -> None:
        async for _ in recv:
            pass

    async def beat() -> None:
        last = time.monotonic()
        while True:
            await trio.sleep(TICK)
            now = time.monotonic()
            gaps.append(now - last - TICK)
            last = now

    async with trio.open_nursery() as nursery:
        await nursery.start(source.run, send)
        nursery.start_soon(drain)
        nursery.start_soon(beat)
        for i in range(n):
            await trio.sleep(interval)
            (directory / "objects.yaml").write_bytes(rewrite + f"# {i}\n".encode())
        await trio.sleep(2 * interval + 1.0)
        nursery.cancel_scope.cancel()
    return max(gaps), sum(g for g in gaps if g > 5 * TICK)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--services", type=int, default=2000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--rewrites", type=int, default=8)
    ap.add_argument("--interval", type=float, default=0.5)
    args = ap.parse_args(argv)
    configure(level="warning")
    c = gen.Cluster(services=args.services, endpoints=args.endpoints)
    with TemporaryDirectory() as tmp:
        d = Path(tmp)
        _write(c, d / "objects.yaml", 0)
        text = (d / "objects.yaml").read_bytes()
        rows = {}
        for name, kind in (("thread", ManifestSource), ("loop", OnTheLoop)):
            rows[name] = trio.run(_stalls, kind, d, text, args.rewrites, args.interval)
    (t_max, t_blocked), (l_max, l_blocked) = rows["thread"], rows["loop"]
    print(
        json.dumps(
            {
                "what": "reload stalls",
                "services": args.services,
                "endpoints": args.endpoints,
                "file_bytes": len(text),
                "rewrites": args.rewrites,
                "max_stall_ms_thread": round(t_max * 1000, 1),
                "max_stall_ms_loop": round(l_max * 1000, 1),
                "blocked_s_thread": round(t_blocked, 2),
                "blocked_s_loop": round(l_blocked, 2),
                "ratio_max_stall": round(l_max / t_max, 1) if t_max else None,
                "load_average": os.getloadavg()[0],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
