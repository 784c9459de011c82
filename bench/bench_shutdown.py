"""SIGTERM to exit of ``nlproxy run`` on a busy machine, at random moments of its life.

Issue 36 asks that SIGTERM end the daemon within 1 s at any load: a pod's grace period or
systemd's stop timeout turns a slow stop into a SIGKILL. The tests only check that the daemon
exits; this script measures how long it takes.

It writes S Services x E endpoints (``bench/gen.py``) as manifests, starts ``--hogs`` CPU-bound
processes (ended by pid at the end), and for ``--rounds`` rounds starts the daemon in a fresh
network namespace of its own and sends it SIGTERM at one of these moments, in turn:

- ``starting``: a random instant between spawn and twice the first round's time to a healthy
  ``/healthz`` (imports, the first list, the first plan, the first commit: a cold load, since
  every round's namespace starts empty);
- ``churn``: after it is healthy, while one Service's endpoints are rewritten every 0.1 s (each
  sync plans, commits and cleans up conntrack), at a random instant within 2 s;
- ``idle``: after it is healthy, at a random instant within 2 s.

The bench's own threads run at nice -10 where it may (root), the daemon and the hogs at 0,
so the figure is not how late a bench as loaded as the daemon notices the exit.

Prints one JSON line per round (moment, seconds from SIGTERM to the process being reaped,
whether the daemon logged ``daemon.stop_overdue`` and its exit status) and a summary per
moment and overall (p50, max, count), each with the 1-minute load average::

    .venv/bin/python bench/bench_shutdown.py --services 5000 --endpoints 10 --hogs 8 --rounds 30
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import gen  # noqa: E402
from bench.measure import healthz_ok  # noqa: E402

MOMENTS = ("starting", "churn", "idle")


def emit(**fields: Any) -> None:
    print(json.dumps({**fields, "load1": round(os.getloadavg()[0], 2)}), flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def hogs(n: int) -> Iterator[None]:
    """``n`` busy processes for the duration, ended by pid."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


@contextlib.contextmanager
def namespace(name: str) -> Iterator[str]:
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def _nice_zero() -> None:
    """In the daemon's child: back to the default priority (the bench's own is raised)."""
    os.setpriority(os.PRIO_PROCESS, 0, 0)


class Daemon:
    def __init__(self, ns: str, manifests: Path) -> None:
        self.ns = ns
        self.healthz = free_port()
        cmd = [
            sys.executable, "-m", "nlproxy", "--netns", ns, "--log-format", "json",
            "run", "--manifests", str(manifests), "--node-name", gen.NODE_NAME,
            "--cluster-cidr", str(gen.CLUSTER_CIDR), "--service-cidr", str(gen.SERVICE_CIDR),
            "--healthz-bind-address", f"127.0.0.1:{self.healthz}",
            "--metrics-bind-address", f"127.0.0.1:{free_port()}", "--min-sync-period", "50ms",
        ]  # fmt: skip
        self.events: list[str] = []
        self.busy: list[str] = []  # where its threads were when a stop was overdue
        self.overdue_at: float | None = None  # that line's wall-clock time
        self.signalled_at = 0.0
        self.proc = subprocess.Popen(
            cmd, stderr=subprocess.PIPE, text=True, cwd=ROOT, preexec_fn=_nice_zero
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with contextlib.suppress(json.JSONDecodeError, AttributeError):
                ev = json.loads(line)
                self.events.append(ev.get("event", ""))
                if ev.get("event") == "daemon.stop_overdue":
                    self.busy = ev.get("busy", [])
                    with contextlib.suppress(KeyError, ValueError):
                        self.overdue_at = datetime.fromisoformat(ev["timestamp"]).timestamp()

    def wait_healthy(self, bound: float = 300.0) -> float:
        start = time.monotonic()
        while time.monotonic() - start < bound:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}: {self.events[-5:]}")
            if healthz_ok(self.ns, self.healthz):
                return time.monotonic() - start
            time.sleep(0.05)
        raise RuntimeError(f"not healthy after {bound} s")

    def sigterm(self) -> tuple[float, int]:
        """Seconds from SIGTERM to the process reaped, and its status."""
        last = self.events[-1] if self.events else ""
        start = time.monotonic()
        self.signalled_at = time.time()
        self.proc.send_signal(signal.SIGTERM)
        # A blocking wait (Popen.wait with a timeout polls, adding up to 50 ms); a stop that
        # never ends is killed after 120 s and shows as such.
        killer = threading.Timer(120, self.proc.kill)
        killer.start()
        status = self.proc.wait()
        took = time.monotonic() - start
        killer.cancel()
        self._reader.join(timeout=10)
        self.last = last
        return took, status


def churn_file(path: Path, stop: threading.Event) -> None:
    """Rewrite one Service's endpoints every 0.1 s until ``stop``."""
    c = gen.Cluster(services=1, endpoints=3)
    vip = "10.111.0.1"
    i = 0
    while not stop.is_set():
        i += 1
        eps = [f"10.200.{i % 200}.{k + 1}" for k in range(3)]
        docs = [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "churn", "namespace": "default"},
                "spec": {"clusterIP": vip, "ports": [{"name": "http", "port": 80}]},
            },
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": "churn-1",
                    "namespace": "default",
                    "labels": {"kubernetes.io/service-name": "churn"},
                },
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                "endpoints": [
                    {"addresses": [ip], "conditions": {"ready": True}, "nodeName": c.node_of(ip)}
                    for ip in eps
                ],
            },
        ]
        tmp = path.with_name(".churn.tmp")
        tmp.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
        tmp.replace(path)
        stop.wait(0.1)


def one_round(
    n: int, moment: str, manifests: Path, ready_time: float | None
) -> tuple[dict[str, Any], float]:
    churn = manifests / "churn.json"
    churn.unlink(missing_ok=True)
    with namespace(f"nlp-bench-stop-{os.getpid()}-{n}") as ns:
        d = Daemon(ns, manifests)
        stopping = threading.Event()
        churner: threading.Thread | None = None
        try:
            if moment == "starting" and ready_time is not None:
                time.sleep(random.uniform(0, 2 * ready_time))
                ready = ready_time
            else:
                ready = d.wait_healthy()
                if moment == "churn":
                    churner = threading.Thread(target=churn_file, args=(churn, stopping))
                    churner.start()
                time.sleep(random.uniform(0, 2.0))
            took, status = d.sigterm()
        finally:
            stopping.set()
            if churner is not None:
                churner.join()
            if d.proc.poll() is None:
                d.proc.kill()
                d.proc.wait()
    record = {
        "round": n,
        "moment": moment,
        "sigterm_to_exit_s": round(took, 3),
        "status": status,
        "overdue": "daemon.stop_overdue" in d.events,
        "busy": d.busy,
        "overdue_line_s": (
            None if d.overdue_at is None else round(d.overdue_at - d.signalled_at, 3)
        ),
        "last_event": d.last,
    }
    return record, ready


def summary(label: str, times: list[float]) -> None:
    if not times:
        return
    emit(
        bench="shutdown_summary",
        moment=label,
        count=len(times),
        p50_s=round(statistics.median(times), 3),
        max_s=round(max(times), 3),
        over_1s=sum(t > 1.0 for t in times),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--services", type=int, default=5000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--hogs", type=int, default=8, help="busy processes beside the daemon")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    # A SIGTERM to the bench ends it through its ``finally`` blocks (hogs, namespace, daemon).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    random.seed(args.seed)
    by_moment: dict[str, list[float]] = {m: [] for m in MOMENTS}
    with tempfile.TemporaryDirectory(prefix="nlp-bench-stop-") as tmp:
        manifests = Path(tmp) / "m"
        gen.write_manifests(
            gen.Cluster(services=args.services, endpoints=args.endpoints), manifests, fmt="json"
        )
        ready_time: float | None = None
        with hogs(args.hogs):
            # The bench's own threads (created from here on, they inherit it) run at a raised
            # priority where it may: the figure is the daemon's, not how late the bench, as
            # loaded as the daemon, sees it go. The daemon and the hogs run at the default.
            with contextlib.suppress(PermissionError):
                os.setpriority(os.PRIO_PROCESS, 0, -10)
            time.sleep(2)  # the load average starts to show them
            for n in range(args.rounds):
                moment = MOMENTS[n % len(MOMENTS)]
                record, ready = one_round(n, moment, manifests, ready_time)
                if ready_time is None:
                    ready_time = ready
                by_moment[moment].append(record["sigterm_to_exit_s"])
                emit(
                    bench="shutdown",
                    services=args.services,
                    endpoints=args.endpoints,
                    hogs=args.hogs,
                    **record,
                )
    for moment, times in by_moment.items():
        summary(moment, times)
    summary("all", [t for ts in by_moment.values() for t in ts])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
