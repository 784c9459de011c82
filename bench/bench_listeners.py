"""What an ``NFNLGRP_NFTABLES`` listener costs every nftables commit on the host, and what the
drift watch's candidates cost instead.

The kernel builds one notification per committed object (a message per set element) whenever
any socket on the host is a member of ``NFNLGRP_NFTABLES``; the check is not per network
namespace. This bench commits the lean 10k x 10 shape (``bench_commit.plan``) into a fresh
namespace, as nlproxy's backend does and as another writer does (``nft -f``), under each
condition the drift watch can leave the host in:

- ``none``: nobody listens (the generation watch between two polls; a membership dropped for
  nlproxy's own commit);
- ``listener_other_netns``: a member of the group in another namespace, reading what it gets
  (the old standing monitor, seen from a writer in another namespace);
- ``listener_same_netns``: the same in the writer's own namespace;
- ``gen_poll``: a thread sending ``NFT_MSG_GETGEN`` every 0.25 s in the writer's namespace
  (the generation watch) and no member.

For each: wall, user and kernel (sys) seconds of the committing thread (``nft -f``: of the
child), and the rise of ``SUnreclaim`` (``/proc/meminfo``, sampled every 2 ms) over its value
before the commit. Every line records the load average and how many sockets on the host are
members of the group, counted during the commit (each process's ``/proc/PID/net/netlink`` lists
its namespace's, and each named namespace is entered to read its own; a member anywhere makes
the ``none`` rows pay as well, so only rows with 0 show a quiet host). The last lines give what
the generation watch pays instead: a read-back of the table (what another process's commit
costs it) and one GETGEN request (what it pays per poll).

Every commit line also gives the object count and ``sys_us_per_object``: run at 10k x 10 and
40k x 10 (``--conditions none --writers nlproxy --no-extra``) to see whether the kernel's cost is
linear in the elements.

Usage: ``.venv/bin/python bench/bench_listeners.py [--services 10000] [--endpoints 10]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_commit import TABLE, nft_text, plan
from bench.listeners import nftables_listeners
from nlproxy.netlink.nlsock import NetfilterSocket
from nlproxy.nft.backend import NftBackend
from nlproxy.nft.dump import generation
from nlproxy.nft.readback import read_ruleset
from nlproxy.nft.uapi import NFNLGRP_NFTABLES
from tests.netns import namespace as netns


def sunreclaim_kib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("SUnreclaim:"):
                return int(line.split()[1])
    raise RuntimeError("/proc/meminfo has no SUnreclaim")


class PeakSampler:
    """The highest SUnreclaim seen while it runs, every ``interval`` seconds, in a thread."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.base = sunreclaim_kib()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, sunreclaim_kib())
            time.sleep(self.interval)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, sunreclaim_kib())

    @property
    def rise_mib(self) -> float:
        return round((self.peak - self.base) / 1024, 1)


@contextlib.contextmanager
def listener(ns: str) -> Iterator[None]:
    """A member of NFNLGRP_NFTABLES in ``ns`` that reads and drops what it gets (8 MiB buffer,
    as the old monitor had)."""
    sock = NetfilterSocket(ns, bufsize=8 << 20)
    sock.subscribe(NFNLGRP_NFTABLES)
    sock.sock.settimeout(0.05)
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                sock.sock.recv(1 << 20)

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()
        sock.close()


@contextlib.contextmanager
def gen_poll(ns: str, interval: float = 0.25) -> Iterator[list[int]]:
    """GETGEN every ``interval`` seconds in ``ns`` from a thread; yields the answers."""
    sock = NetfilterSocket(ns)
    stop = threading.Event()
    seen: list[int] = []

    def poll() -> None:
        while not stop.wait(interval):
            seen.append(generation(sock))

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    try:
        yield seen
    finally:
        stop.set()
        t.join()
        sock.close()


def thread_usage() -> tuple[float, float, float]:
    r = resource.getrusage(resource.RUSAGE_THREAD)
    return time.perf_counter(), r.ru_utime, r.ru_stime


def own_commit(ns: str, ops: list[Any]) -> dict[str, float]:
    """nlproxy's backend commits ``ops`` into ``ns``: this thread's wall/user/sys seconds."""
    with NftBackend(TABLE, netns=ns) as backend:
        w0, u0, s0 = thread_usage()
        backend.apply(ops)
        w1, u1, s1 = thread_usage()
    return {"wall_s": round(w1 - w0, 3), "user_s": round(u1 - u0, 3), "sys_s": round(s1 - s0, 3)}


def foreign_commit(ns: str, script: str) -> dict[str, float]:
    """``nft -f`` loads the same objects into ``ns``: the child's wall/user/sys seconds."""
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", script], check=True)
    t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "wall_s": round(t1 - t0, 3),
        "user_s": round(r1.ru_utime - r0.ru_utime, 3),
        "sys_s": round(r1.ru_stime - r0.ru_stime, 3),
    }


def condition(name: str, ns: str, other: str) -> contextlib.AbstractContextManager[object]:
    if name == "listener_other_netns":
        return listener(other)
    if name == "listener_same_netns":
        return listener(ns)
    if name == "gen_poll":
        return gen_poll(ns)
    return contextlib.nullcontext()


CONDITIONS = ("none", "listener_other_netns", "listener_same_netns", "gen_poll")


def run_one(
    writer: str, cond: str, size: dict[str, int], commit: Callable[[str], dict[str, float]]
) -> dict[str, Any]:
    with netns("nlpw") as ns, netns("nlpl") as other, condition(cond, ns, other):
        time.sleep(0.3)  # the listener's thread is reading, the poller has polled
        listeners = nftables_listeners()
        with PeakSampler() as mem:
            t = commit(ns)
        listeners = max(listeners, nftables_listeners())
    return {
        "bench": "listener_cost",
        "writer": writer,
        "condition": cond,
        **size,
        **t,
        "sunreclaim_rise_mib": mem.rise_mib,
        "nftables_listeners": listeners,
        "loadavg": os.getloadavg(),
    }


def per_object(line: dict[str, Any], objects: int) -> dict[str, Any]:
    """``line`` with the object count and the kernel's time per object (what is linear or not)."""
    return {
        **line,
        "objects": objects,
        "sys_us_per_object": round(line["sys_s"] / objects * 1e6, 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--services", type=int, default=10_000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--conditions", default=",".join(CONDITIONS), help="which of them to run")
    ap.add_argument("--writers", default="nlproxy,nft_f", help="which of nlproxy,nft_f to run")
    ap.add_argument("--no-extra", action="store_true", help="skip the read-back and GETGEN lines")
    args = ap.parse_args()
    conditions = [c for c in args.conditions.split(",") if c]
    if unknown := set(conditions) - set(CONDITIONS):
        ap.error(f"--conditions: unknown {sorted(unknown)}; known: {', '.join(CONDITIONS)}")
    writers = args.writers.split(",")
    size = {"services": args.services, "endpoints": args.endpoints}
    print(json.dumps({"bench": "host", "loadavg": os.getloadavg(),
                      "nftables_listeners": nftables_listeners()}), flush=True)  # fmt: skip
    ops = plan(args.services, args.endpoints)
    with tempfile.NamedTemporaryFile("w", suffix=".nft", delete=False) as f:
        f.write(nft_text(args.services, args.endpoints))
    try:
        for _ in range(args.rounds):
            for cond in conditions:
                if "nlproxy" in writers:
                    line = run_one("nlproxy", cond, size, lambda ns: own_commit(ns, ops))
                    print(json.dumps(per_object(line, len(ops))), flush=True)
                if "nft_f" in writers:
                    line = run_one("nft_f", cond, size, lambda ns: foreign_commit(ns, f.name))
                    print(json.dumps(per_object(line, len(ops))), flush=True)
    finally:
        os.unlink(f.name)
    if args.no_extra:
        return 0
    with netns("nlpr") as ns:
        own_commit(ns, ops)
        w0, u0, s0 = thread_usage()
        read_ruleset(TABLE.family, TABLE.name, netns=ns)
        w1, u1, s1 = thread_usage()
    print(json.dumps({"bench": "read_back", **size, "wall_s": round(w1 - w0, 3),
                      "user_s": round(u1 - u0, 3), "sys_s": round(s1 - s0, 3),
                      "loadavg": os.getloadavg()}), flush=True)  # fmt: skip
    with netns("nlpg") as ns:
        sock = NetfilterSocket(ns)
        n = 2000
        w0, u0, s0 = thread_usage()
        for _ in range(n):
            generation(sock)
        w1, u1, s1 = thread_usage()
        sock.close()
    print(json.dumps({"bench": "getgen", "requests": n,
                      "wall_us": round((w1 - w0) / n * 1e6, 1),
                      "cpu_us": round((u1 - u0 + s1 - s0) / n * 1e6, 1),
                      "cpu_s_per_min_at_4hz": round((u1 - u0 + s1 - s0) / n * 240, 4),
                      "loadavg": os.getloadavg()}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
