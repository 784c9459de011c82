"""Where the daemon's memory is at its first sync and once settled: the daemon of this checkout
on the in-repo API server (as ``bench_api_path.py`` runs it), inspected from inside at both
moments.

The daemon runs under this module (``--child``), which on SIGUSR1 writes to ``OUT.N``: RSS, the
pymalloc arenas (``sys._debugmallocstats``), the live objects per type (``gc``; sizes by
``sys.getsizeof``, containers only) and, with ``--trace N``, tracemalloc's live allocations by
line (tracemalloc makes the process larger and slower: read the shares, not RSS, then). The
driver signals it at the first ``sync.applied`` and ``--settle`` seconds after.

    .venv/bin/python bench/mem_probe.py /tmp/probe --services 10000 --endpoints 10 [--trace 8]
        [--tree ../other-checkout]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import gc
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return 0.0


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _malloc() -> list[str]:
    """glibc's heap: its size, what is in use and free in it, and the mapped blocks."""
    fn = ctypes.CDLL(None).mallinfo2
    fn.restype = _Mallinfo2
    m = fn()
    mb = 2**20
    return [
        f"malloc_heap_mb {m.arena / mb:.1f} in_use_mb {m.uordblks / mb:.1f} "
        f"free_mb {m.fordblks / mb:.1f} mmapped_mb {m.hblkhd / mb:.1f} ({m.hblks} blocks)"
    ]


def _smaps() -> list[str]:
    keep = ("Rss", "Anonymous", "Shared_Clean", "Private_Clean", "Private_Dirty")
    rows = Path("/proc/self/smaps_rollup").read_text().splitlines()
    return [r for r in rows if r.split(":")[0] in keep]


def _census() -> list[str]:
    counts: collections.Counter[str] = collections.Counter()
    sizes: collections.Counter[str] = collections.Counter()
    frozen = gc.get_freeze_count()
    gc.unfreeze()  # the daemon freezes its plan (``freeze_long_lived``): count it too
    objects = gc.get_objects()
    if frozen:
        gc.freeze()
    for obj in objects:
        name = type(obj).__qualname__
        counts[name] += 1
        with contextlib.suppress(TypeError):
            sizes[name] += sys.getsizeof(obj)
    return [f"{sizes[n] / 2**20:9.2f} MB {counts[n]:9d}  {n}" for n, _ in sizes.most_common(40)]


def _dump(out: str, count: list[int]) -> None:
    import tracemalloc

    count[0] += 1
    path = f"{out}.{count[0]}"
    lines = [f"rss_mb {_rss_mb():.1f}", *_malloc(), *_smaps(), "", "# gc census (containers)"]
    lines += _census()
    if tracemalloc.is_tracing():
        snap = tracemalloc.take_snapshot()
        total = sum(s.size for s in snap.statistics("filename"))
        lines += ["", f"# tracemalloc total {total / 2**20:.1f} MB; by line"]
        for st in snap.statistics("lineno")[:60]:
            lines.append(f"{st.size / 2**20:8.2f} MB {st.count:8d}  {st.traceback}")
        lines += ["", "# by file"]
        for st in snap.statistics("filename")[:40]:
            lines.append(f"{st.size / 2**20:8.2f} MB {st.count:8d}  {st.traceback}")
    Path(path).write_text("\n".join(lines) + "\n")
    with open(f"{path}.malloc", "w") as f:  # _debugmallocstats writes to the C stderr
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def child(out: str, trace: int, args: list[str]) -> None:
    sys.path.insert(0, os.getcwd())  # the tree under test (``--tree``), before this one
    if trace:
        import tracemalloc

        tracemalloc.start(trace)
    count = [0]

    def on_usr1(signum: int, frame: FrameType | None) -> None:
        _dump(out, count)

    signal.signal(signal.SIGUSR1, on_usr1)
    sys.argv = ["nlproxy", *args]
    runpy.run_module("nlproxy", run_name="__main__", alter_sys=True)


def _wait_dump(path: str, timeout: float = 120) -> None:
    end = time.time() + timeout
    while time.time() < end and not Path(f"{path}.malloc").exists():
        time.sleep(0.1)
    time.sleep(0.5)


def _daemon(args: list[str], tree: Path) -> Any:
    """A daemon of ``tree`` under this module, its log lines collected (``Child`` runs ``python
    -m nlproxy``; imported here, not in the daemon under it, which would then hold the bench's
    modules too)."""
    from bench import checkout_run
    from bench.bench_api_path import Child

    class _Daemon(Child):
        def __init__(self, args: list[str]) -> None:
            self.proc = checkout_run.spawn(
                tree, args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL
            )
            self.lines, self.tail = [], []
            self.cond = threading.Condition()
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()

    return _Daemon(args)


def drive(out: Path, services: int, endpoints: int, settle: float, trace: int, tree: Path) -> None:
    from bench import checkout_run, gen
    from bench.bench_api_path import daemon_args, pods_ns, populate
    from tests.kube.apiserver import ApiServer
    from tests.kube.conftest import TOKEN, write_kubeconfig

    checkout_run.prepare([tree])
    cluster = gen.Cluster(services=services, endpoints=endpoints)
    api = ApiServer(token=TOKEN)
    api.start()
    try:
        populate(api, cluster)
        with tempfile.TemporaryDirectory(prefix="nlpmp-") as tmp, pods_ns() as ns:
            kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", api)
            argv = [str(Path(__file__).resolve()), "--child", str(out), str(trace)]
            c = _daemon([*argv, "--log-format", "json", *daemon_args(ns, kubeconfig)], tree)
            try:
                c.first("sync.applied", 300)
                c.proc.send_signal(signal.SIGUSR1)
                _wait_dump(f"{out}.1")
                time.sleep(settle)
                c.proc.send_signal(signal.SIGUSR1)
                _wait_dump(f"{out}.2")
            finally:
                c.proc.send_signal(signal.SIGTERM)
                c.proc.wait(timeout=60)
    finally:
        api.stop()


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--services", type=int, default=10_000)
    p.add_argument("--endpoints", type=int, default=10)
    p.add_argument("--settle", type=float, default=10.0)
    p.add_argument("--trace", type=int, default=0, help="tracemalloc frames (0: off)")
    p.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose daemon runs")
    a = p.parse_args()
    drive(a.out.resolve(), a.services, a.endpoints, a.settle, a.trace, a.tree.resolve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
