"""Cold start and burst convergence on the Kubernetes API source, against the in-repo API
server holding S Services x E endpoints with the bodies a real server sends
(``tests/kube/scale.py``, ``tests/kube/realistic.py``). Prints JSON lines:

- ``list``: the source's list of Services and EndpointSlices in pages of 500, in this process,
  with realistic bodies and with minimal ones (only the fields nlproxy reads) side by side:
  seconds, bytes on the wire, and the ratio (what managedFields and annotations cost);
- ``cold_start``: ``nlproxy run --kubeconfig`` spawned into a fresh network namespace: seconds
  from spawn to the source's complete lists (``source.synced``), to the first commit
  (``sync.applied``) and to a healthy ``/healthz``, each kind's list time as the daemon logged
  it, and its RSS;
- ``restart``: the daemon stopped (SIGTERM leaves the rules) and spawned again on the same API
  server and namespace, nothing changed: the same figures as ``cold_start``; its first commit
  should send 0 operations (``after_lists_s``: from the lists' end to the first commit, the
  target's stage), and whether the tables' restart records vouched for them (no read-back);
- ``burst``: B EndpointSlice updates (each moving one endpoint of a different Service) replayed
  at once into the running daemon's watch: seconds until every changed Service was programmed
  (the ``services_changed`` of the ``sync.applied`` lines add up to B), from the first write
  (``converged_s``) and from the last (``last_write_to_converged_s``), with the syncs and ops it
  took, their plan/diff/commit milliseconds summed, and the daemon's CPU seconds until then;
- ``relist`` (``--relist``): the API server stopped, its history compacted (every watch gets
  410 Gone) and started again on the same port: per kind, seconds from the server answering
  again to the daemon's end of that kind's relist (``source.listed``), the list's own duration,
  and to the commit of a slice changed while the server was down (``committed_after_ready_s``);
  the daemon's CPU seconds over it.

With ``--baseline DIR`` the daemons run from that source tree (its ``.venv``), for a side-by-side.

    .venv/bin/python bench/bench_kube_cold.py [--services 10000] [--endpoints 10]
        [--bursts 1000,5000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_daemon import cpu_seconds, free_ports, rss_mb, stamp  # noqa: E402
from bench.measure import healthz_ok  # noqa: E402
from nlproxy.cluster.kube import api_client_from_config, kinds  # noqa: E402
from nlproxy.cluster.kube_http import Http, list_kind  # noqa: E402
from tests.kube import scale  # noqa: E402
from tests.kube.apiserver import ApiServer  # noqa: E402
from tests.kube.conftest import TOKEN, write_kubeconfig  # noqa: E402
from tests.objects import endpoint, endpoint_slice, service  # noqa: E402

PAGE = 500

TREE = ROOT
"""The source tree whose ``nlproxy`` the daemons run (``--baseline``)."""

LOG: Any = None
"""Where the daemons' log lines are copied (``--log``), if anywhere."""


def python() -> str:
    venv = TREE / ".venv" / "bin" / "python"
    return str(venv) if TREE != ROOT and venv.exists() else sys.executable


def emit(**fields: Any) -> None:
    load = round(os.getloadavg()[0], 2)
    print(
        json.dumps({"bench": "kube_cold", "tree": str(TREE), **fields, "loadavg_1m": load}),
        flush=True,
    )


def minimal(server: ApiServer, services: int, endpoints: int) -> None:
    """The same cluster with only the fields nlproxy reads."""
    server.store.put_many(
        "services",
        (
            service(scale.name(i)[1], scale.vip(i), namespace=scale.name(i)[0])
            for i in range(services)
        ),
    )
    server.store.put_many(
        "endpointslices",
        (
            endpoint_slice(
                scale.name(i)[1],
                [endpoint(ip, "node-a") for ip in scale.endpoint_ips(i, endpoints)],
                name=f"{scale.name(i)[1]}-x7k2p",
                namespace=scale.name(i)[0],
            )
            for i in range(services)
        ),
    )


def bench_list(services: int, endpoints: int, repeat: int) -> None:
    """In-process list time and bytes, realistic vs minimal bodies."""
    figures: dict[str, dict[str, float]] = {}
    for bodies in ("realistic", "minimal"):
        api = ApiServer(token=TOKEN)
        api.start()
        try:
            if bodies == "realistic":
                scale.populate(api, services, endpoints)
            else:
                minimal(api, services, endpoints)
            with tempfile.TemporaryDirectory() as tmp:
                client = api_client_from_config(str(write_kubeconfig(Path(tmp) / "kc", api)))
            http = Http(client)
            for spec in kinds(scale.NODE)[:2]:
                best = float("inf")
                for _ in range(repeat):
                    started = time.perf_counter()
                    listing = list_kind(http, spec, PAGE)
                    best = min(best, time.perf_counter() - started)
                    assert len(listing.changes) == services, spec.kind
                    del listing
                size = sum(
                    len(json.dumps(o))
                    for o in api.store.objects[spec.path.rsplit("/", 1)[1]].values()
                )
                figures.setdefault(spec.kind, {})[bodies] = best
                emit(
                    what="list",
                    kind=spec.kind,
                    bodies=bodies,
                    objects=services,
                    endpoints=endpoints,
                    pages=-(-services // PAGE),
                    seconds=round(best, 3),
                    mbytes=round(size / 1e6, 1),
                )
            client.close()
        finally:
            api.stop()
    for kind, f in figures.items():
        emit(
            what="list_ratio",
            kind=kind,
            realistic_over_minimal=round(f["realistic"] / f["minimal"], 2),
        )


class Daemon:
    """``nlproxy run`` on the API server, its JSON log lines collected as they come."""

    def __init__(self, netns: str, kubeconfig: Path) -> None:
        self.healthz, self.metrics = free_ports(2)
        self.netns = netns
        cmd = [
            python(), "-m", "nlproxy", "--netns", netns, "--log-format", "json",
            "run", "--kubeconfig", str(kubeconfig), "--node-name", scale.NODE,
            "--cluster-cidr", str(scale.CLUSTER_CIDR),
            "--healthz-bind-address", f"127.0.0.1:{self.healthz}",
            "--metrics-bind-address", f"127.0.0.1:{self.metrics}",
        ]  # fmt: skip
        self.spawned = time.time()
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=TREE)
        self.lines: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if LOG is not None:
                LOG.write(line)
            with contextlib.suppress(json.JSONDecodeError):
                ev = json.loads(line)
                with self.cond:
                    self.lines.append(ev)
                    self.cond.notify_all()

    def events(self, name: str) -> list[dict[str, Any]]:
        with self.cond:
            return [e for e in self.lines if e.get("event") == name]

    def healthy(self) -> bool:
        return healthz_ok(self.netns, self.healthz)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def cold_start(
    daemon: Daemon, services: int, endpoints: int, timeout: float, what: str = "cold_start"
) -> None:
    deadline = time.monotonic() + timeout
    while not daemon.healthy():
        if daemon.proc.poll() is not None:
            raise SystemExit(f"daemon exited {daemon.proc.returncode}")
        if time.monotonic() > deadline:
            with daemon.cond:
                last = [f"{e.get('event')} {e.get('kind', '')}".strip() for e in daemon.lines[-8:]]
            raise SystemExit(f"daemon not healthy after {timeout}s; its last events: {last}")
        time.sleep(0.02)
    healthy = time.time() - daemon.spawned
    # /healthz may answer before the reader thread has the log lines that led to it.
    with daemon.cond:
        daemon.cond.wait_for(
            lambda: {"source.synced", "sync.applied"} <= {e.get("event") for e in daemon.lines},
            timeout=10,
        )
    synced = daemon.events("source.synced")[0]
    applied = daemon.events("sync.applied")[0]
    listed = {e["kind"]: e["duration_ms"] for e in daemon.events("source.listed")}
    rss, hwm = rss_mb(daemon.proc.pid)
    emit(
        what=what,
        services=services,
        endpoints=endpoints,
        to_lists_s=round(stamp(synced) - daemon.spawned, 3),
        to_first_commit_s=round(stamp(applied) - daemon.spawned, 3),
        after_lists_s=round(stamp(applied) - stamp(synced), 3),
        to_healthy_s=round(healthy, 3),
        cpu_s=round(cpu_seconds(daemon.proc.pid), 3),
        list_ms=listed,
        first_commit_ops=applied.get("ops"),
        first_commit_ms={k: applied.get(k) for k in ("plan_ms", "diff_ms", "commit_ms")},
        records_trusted=bool(daemon.events("sync.restart_trusted")),
        rss_mb=round(rss, 1),
        peak_rss_mb=round(hwm, 1),
    )


def burst(
    api: ApiServer,
    daemon: Daemon,
    shape: tuple[int, int],
    count: int,
    first: int,
    timeout: float,
) -> None:
    services, endpoints = shape
    seen = len(daemon.events("sync.applied"))
    cpu = cpu_seconds(daemon.proc.pid)
    started = time.time()
    scale.burst(api, services, endpoints, count, first)
    last = time.time()
    replayed = last - started
    deadline = time.monotonic() + timeout
    with daemon.cond:
        while True:
            syncs = [e for e in daemon.lines if e.get("event") == "sync.applied"][seen:]
            changed = sum(e.get("services_changed", 0) for e in syncs)
            if changed >= count or time.monotonic() > deadline:
                break
            daemon.cond.wait(timeout=1)
    if changed < count:
        emit(what="burst", updates=count, error=f"{changed} of {count} programmed in {timeout}s")
        return
    emit(
        what="burst",
        services=services,
        updates=count,
        replay_s=round(replayed, 3),
        converged_s=round(stamp(syncs[-1]) - started, 3),
        last_write_to_converged_s=round(stamp(syncs[-1]) - last, 3),
        cpu_s=round(cpu_seconds(daemon.proc.pid) - cpu, 3),
        syncs=len(syncs),
        ops=sum(e.get("ops", 0) for e in syncs),
        full_syncs=sum(1 for e in syncs if not e.get("incremental")),
        **{
            f"{k}_sum": round(sum(e.get(k, 0.0) for e in syncs), 1)
            for k in ("plan_ms", "diff_ms", "commit_ms", "duration_ms")
        },
        per_sync=[(e.get("services_changed"), round(e.get("duration_ms", 0.0))) for e in syncs],
    )


def relist(
    api: ApiServer, daemon: Daemon, shape: tuple[int, int], first: int, timeout: float
) -> None:
    """The API server restarted with its history compacted: every kind relists (410 Gone).
    One slice changed while it was down: the relist carries it, so its sync is the commit."""
    services, endpoints = shape
    with daemon.cond:
        seen = len(daemon.lines)
    cpu = cpu_seconds(daemon.proc.pid)
    api.stop()
    time.sleep(1)
    scale.burst(api, services, endpoints, 1, first)
    with api.store.cond:  # the cluster's other writes moved the revision on meanwhile
        api.store.rv += 1
        api.store.compact()
    api.start()
    ready = time.time()
    wanted = {"Service", "EndpointSlice", "Node", "ServiceCIDR"}
    deadline = time.monotonic() + timeout
    with daemon.cond:
        while True:
            lines = daemon.lines[seen:]
            listed = {e["kind"]: e for e in lines if e.get("event") == "source.listed"}
            last = max((daemon.lines.index(e) for e in listed.values()), default=len(daemon.lines))
            applied = [
                e
                for e in daemon.lines[last:]
                if e.get("event") == "sync.applied" and e.get("services_changed")
            ]
            if (set(listed) >= wanted and applied) or time.monotonic() > deadline:
                break
            daemon.cond.wait(timeout=1)
    if not set(listed) >= wanted or not applied:
        emit(
            what="relist", error=f"relisted {sorted(listed)} in {timeout}s, applied={bool(applied)}"
        )
        return
    emit(
        what="relist",
        services=services,
        listed_after_ready_s={k: round(stamp(e) - ready, 3) for k, e in sorted(listed.items())},
        list_ms={k: e.get("duration_ms") for k, e in sorted(listed.items())},
        committed_after_ready_s=round(stamp(applied[0]) - ready, 3),
        ops=applied[0].get("ops"),
        cpu_s=round(cpu_seconds(daemon.proc.pid) - cpu, 3),
    )


def bench_daemon(
    services: int,
    endpoints: int,
    bursts: list[int],
    timeout: float,
    *,
    restart: bool = True,
    relists: int = 0,
) -> None:
    api = ApiServer(token=TOKEN)
    api.start()
    netns = f"nlpb-kcold-{os.getpid()}"
    daemon = None
    try:
        subprocess.run(["ip", "netns", "add", netns], check=True)
        subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)
        scale.populate(api, services, endpoints)
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", api)
            daemon = Daemon(netns, kubeconfig)
            cold_start(daemon, services, endpoints, timeout)
            time.sleep(3)  # start-up work after the first sync (reachability) settles
            first = 0
            for count in bursts:
                count = min(count, services)  # one update per Service: each is one change
                burst(api, daemon, (services, endpoints), count, first, timeout)
                first += count
                time.sleep(1)
            for _ in range(relists):
                relist(api, daemon, (services, endpoints), first, timeout)
                first += 1
                time.sleep(3)
            if restart:
                daemon.stop()
                daemon = Daemon(netns, kubeconfig)
                cold_start(daemon, services, endpoints, timeout, what="restart")
    finally:
        if daemon is not None:
            daemon.stop()
        api.stop()
        subprocess.run(["ip", "netns", "delete", netns], check=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--services", type=int, default=10000)
    p.add_argument("--endpoints", type=int, default=10)
    p.add_argument("--bursts", default="1000,5000", help="burst sizes, comma-separated")
    p.add_argument("--repeat", type=int, default=3, help="in-process lists per variant (best)")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--no-list", action="store_true", help="skip the in-process list figures")
    p.add_argument("--no-restart", action="store_true", help="skip the restart unchanged")
    p.add_argument("--relist", type=int, default=0, metavar="N", help="N API server restarts")
    p.add_argument("--baseline", type=Path, metavar="DIR", help="run another nlproxy's tree")
    p.add_argument("--log", type=Path, metavar="FILE", help="copy the daemons' log lines there")
    args = p.parse_args(argv)
    if args.log is not None:
        global LOG
        LOG = args.log.open("w", buffering=1)
    if args.baseline is not None:
        global TREE
        TREE = args.baseline.resolve()
    bursts = [int(b) for b in args.bursts.split(",") if b]
    if not args.no_list:
        bench_list(args.services, args.endpoints, args.repeat)
    bench_daemon(
        args.services,
        args.endpoints,
        bursts,
        args.timeout,
        restart=not args.no_restart,
        relists=args.relist,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
