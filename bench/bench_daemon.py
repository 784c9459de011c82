"""Daemon figures on the Kubernetes API source, at scale.

Runs the in-repo API server (``tests/kube/apiserver.py``, the real list/watch protocol) holding S
Services x E endpoints (``bench/gen.py``'s cluster), and ``nlproxy run --kubeconfig`` as a child
process programming a fresh network namespace. Prints JSON lines:

- ``first_sync``: seconds from start to the first healthy ``/healthz`` (initial chunked lists of
  every kind, parse, plan, commit), and the daemon's RSS (current and peak) afterwards;
- ``cold_start_notifications``: after ``--settle``, how often the drift monitor lost
  notifications during the cold start, whether they were all the daemon's own commits, and
  how many read-backs followed;
- ``event_to_commit``: for single endpoint changes (an EndpointSlice modified in the API server),
  the time from the change to the daemon's ``sync.applied`` log line for it (the daemon's own
  timestamp), p50/p99/max over the changes, with the sync's op count;
- ``rss``: the daemon's RSS (current and peak) at each stage: ``imports`` (a process that only
  imports what the daemon imports, for reference), ``settled`` (after ``--settle``, before the
  changes), ``after_changes``, and with ``--verify-after S`` (the daemon's sync period)
  ``after_verify``, once the first full read-back verify after the changes is done;
- ``verify_change`` (with ``--drift-changes N``): N times, a chain added to the daemon's table
  from outside (``nft`` in its namespace: drift), and as soon as the daemon logs
  ``drift.detected`` (its read-back verify is due or running) one EndpointSlice change written
  to the API server: seconds from that write to the ``sync.applied`` that programmed it
  (issue 18: within the min sync period), whether the verify was still to finish at the write,
  and how long after the write it finished;
- ``restart`` (with ``--restart``): the daemon stopped (SIGTERM) and started again with nothing
  changed: seconds to a healthy ``/healthz``, the new process's CPU seconds by then, the first
  sync's ops and whether the tables' restart records vouched for them (nothing read back);
- ``burst`` (with ``--burst N``): N EndpointSlice changes (one endpoint fewer, each of another
  Service) written to the API server as fast as it takes them, then the seconds from the last
  write to the ``sync.applied`` by which every one of them was programmed, with the syncs it
  took and the writing's own duration;
- ``rss_peak``: the daemon's RSS sampled every 50 ms from its start to ``settled``: the highest
  sample, when (seconds from the first sample), and the daemon's last log lines before it (at
  10k x 10 the peak is the inspector's first pass, after the first sync);
- ``census`` (with ``--census PREFIX``): the daemon's heap censuses after its first sync and at
  ``settled`` (``nlproxy/daemon/census.py``: RSS, pymalloc's totals, traced MB by file);
  ``NLPROXY_CENSUS_FRAMES=0`` in the environment keeps tracing off (then the RSS is the real one
  and pymalloc's totals are given, but nothing by file);
- ``idle_cpu`` (with ``--idle S``): the daemon's CPU time (user + system, all threads) over S
  idle seconds at the end, per minute: what a quiet node pays (the periodic verify included);
  ``idle_rss``: its RSS sampled every ``--rss-every`` seconds over the same window (flat?).

    .venv/bin/python bench/bench_daemon.py --services 10000 --endpoints 10 --changes 20

With ``--baseline DIR`` the daemon is run from that source tree instead (another nlproxy, e.g.
``git archive main`` with its shim built): run the script once each way for a side-by-side.
``--log FILE`` keeps the daemons' log lines (the stages behind each figure).
Every line carries the 1-minute load average.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import gen  # noqa: E402
from bench.measure import healthz_ok  # noqa: E402
from tests.kube.apiserver import ApiServer  # noqa: E402
from tests.kube.conftest import TOKEN, write_kubeconfig  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def free_ports(count: int, *, besides: tuple[int, ...] = ()) -> list[int]:
    """``count`` different free loopback ports, none of ``besides``: each socket is held until
    all are bound (two ``free_port()`` in a row may give the same port twice)."""
    with contextlib.ExitStack() as held:
        ports: list[int] = []
        while len(ports) < count:
            s = held.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
            if port not in besides:
                ports.append(port)
        return ports


TREE = ROOT
"""The source tree whose ``nlproxy`` the daemon runs (``--baseline``)."""

LOG: Any = None
"""Where the daemons' log lines are copied (``--log``), if anywhere."""

CENSUS: Path | None = None
"""File prefix for the daemon's heap censuses (``--census``; ``nlproxy/daemon/census.py``)."""

RSS_TRACE_EVERY = 0.05
"""Seconds between the samples of the daemon's RSS that place its peak (``peak``)."""


def emit(**fields: Any) -> None:
    load = round(os.getloadavg()[0], 2)
    print(
        json.dumps({"bench": "daemon", "tree": str(TREE), **fields, "loadavg_1m": load}), flush=True
    )


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


class Daemon:
    def __init__(
        self,
        netns: str,
        kubeconfig: Path,
        healthz: int,
        metrics: int,
        extra: list[str],
    ) -> None:
        cmd = [
            sys.executable, "-m", "nlproxy", "--netns", netns, "--log-format", "json",
            "run", "--kubeconfig", str(kubeconfig), "--node-name", gen.NODE_NAME,
            "--cluster-cidr", str(gen.CLUSTER_CIDR), "--service-cidr", str(gen.SERVICE_CIDR),
            "--healthz-bind-address", f"127.0.0.1:{healthz}",
            "--metrics-bind-address", f"127.0.0.1:{metrics}", *extra,
        ]  # fmt: skip
        self.healthz = healthz
        self.netns = netns
        env = dict(os.environ)
        if CENSUS is not None:
            env["NLPROXY_CENSUS"] = str(CENSUS)
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=TREE, env=env)
        self.rss: list[tuple[float, float]] = []  # (time, VmRSS MiB), every RSS_TRACE_EVERY s
        self.syncs: list[dict[str, Any]] = []
        self.drifts: list[dict[str, Any]] = []
        self.verifies: list[dict[str, Any]] = []  # verify.read_back: a read-back's end
        self.events: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._trace_rss, daemon=True).start()

    def _trace_rss(self) -> None:
        while self.proc.poll() is None:
            with contextlib.suppress(OSError, KeyError):
                self.rss.append((time.time(), rss_mb(self.proc.pid)[0]))
            time.sleep(RSS_TRACE_EVERY)

    def peak(self, since: float = 0.0) -> dict[str, Any]:
        """When RSS was highest (sampled) after ``since``, and the daemon's last log lines then."""
        samples = [s for s in self.rss if s[0] >= since]
        if not samples:
            return {}
        at, mb = max(samples, key=lambda s: s[1])
        with self.cond:
            before = [e for e in self.events if "timestamp" in e and stamp(e) <= at][-3:]
        return {
            "sampled_peak_mb": round(mb, 1),
            "at_s": round(at - (samples[0][0] if since == 0.0 else since), 2),
            "last_events": [f"{e.get('event')} {e.get('kind', '')}".strip() for e in before],
        }

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if LOG is not None:
                LOG.write(line)
            with contextlib.suppress(json.JSONDecodeError):
                ev = json.loads(line)
                kinds = {
                    "sync.applied": self.syncs,
                    "drift.detected": self.drifts,
                    "verify.read_back": self.verifies,
                }
                if ev.get("event") == "drift.notifications_lost" and not ev.get("own"):
                    ev["event"] = "drift.detected"  # the generation watch's report of a drift
                with self.cond:
                    self.events.append(ev)
                    if ev.get("event") in kinds:
                        kinds[ev["event"]].append(ev)
                    self.cond.notify_all()

    def healthy(self) -> bool:
        return healthz_ok(self.netns, self.healthz)

    def next_sync(self, after: int, timeout: float) -> dict[str, Any] | None:
        with self.cond:
            self.cond.wait_for(lambda: len(self.syncs) > after, timeout=timeout)
            return self.syncs[after] if len(self.syncs) > after else None

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def census(daemon: Daemon, name: str) -> None:
    """Have the daemon write a heap census (SIGUSR1) and print its summary."""
    with daemon.cond:
        seen = sum(1 for e in daemon.events if e.get("event") == "daemon.census")
    daemon.proc.send_signal(signal.SIGUSR1)
    with daemon.cond:
        daemon.cond.wait_for(
            lambda: sum(1 for e in daemon.events if e.get("event") == "daemon.census") > seen,
            timeout=120,
        )
    for stage in ("first_sync", name):
        path = Path(f"{CENSUS}.{stage}.json")
        if path.exists():
            data = json.loads(path.read_text())
            emit(
                what="census",
                stage=stage,
                path=str(path),
                status_kb=data["status_kb"],
                traced_mb=data.get("traced_mb"),
                pymalloc=data["pymalloc"],
                gc_objects=data["gc_objects"],
                top_files=data.get("by_file", [])[:12],
            )


def emit_rss(stage: str, pid: int) -> None:
    rss, hwm = rss_mb(pid)
    emit(what="rss", stage=stage, rss_mb=round(rss, 1), peak_rss_mb=round(hwm, 1))


def imports_rss() -> None:
    """RSS of a process that imports what the daemon does on the API source, and nothing else."""
    code = (
        "import nlproxy.cli, nlproxy.daemon.run, nlproxy.cluster.kube, pathlib; "
        "print(pathlib.Path('/proc/self/status').read_text())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    rss, hwm = (int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM"))
    emit(what="rss", stage="imports", rss_mb=round(rss, 1), peak_rss_mb=round(hwm, 1))


def stamp(ev: dict[str, Any]) -> float:
    return datetime.fromisoformat(ev["timestamp"].replace("Z", "+00:00")).timestamp()


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (every thread), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_idle(pid: int, seconds: float, every: float, **shape: int) -> None:
    before = cpu_seconds(pid)
    samples = [round(rss_mb(pid)[0], 1)]
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(every, left))
        samples.append(round(rss_mb(pid)[0], 1))
    used = cpu_seconds(pid) - before
    emit(
        what="idle_cpu",
        **shape,
        seconds=seconds,
        cpu_s=round(used, 3),
        cpu_s_per_minute=round(used * 60 / seconds, 3),
    )
    rss, hwm = rss_mb(pid)
    emit(
        what="idle_rss",
        **shape,
        seconds=seconds,
        every_s=every,
        samples_mb=samples,
        rss_mb=round(rss, 1),
        peak_rss_mb=round(hwm, 1),
    )


MIN_SYNC_PERIOD = 0.1
"""The daemon's default min sync period (``DaemonConfig.min_sync_period``); not overridden here."""


def verify_changes(
    api: ApiServer, daemon: Daemon, cluster: gen.Cluster, count: int, first: int
) -> None:
    """``count`` changes, each written the moment the daemon reports drift (see the module)."""
    for n in range(count):
        seen_syncs, seen_drifts = len(daemon.syncs), len(daemon.drifts)
        seen_verifies = len(daemon.verifies)
        subprocess.run(
            ["ip", "netns", "exec", daemon.netns, "nft", "add", "chain", "ip", "nlproxy",
             f"bench-drift-{n}"],
            check=True,
        )  # fmt: skip
        with daemon.cond:
            if not daemon.cond.wait_for(lambda d=seen_drifts: len(daemon.drifts) > d, timeout=10):
                emit(what="verify_change", error=f"no drift.detected for change {n}")
                return
        i = (first + n * 104_729) % cluster.services
        shorter = gen.Cluster(
            services=cluster.services,
            endpoints=cluster.endpoints,
            overrides={i: tuple(cluster.endpoint_ips(i)[: cluster.endpoints - 1])},
        )
        written = time.time()
        for doc in gen.slice_docs(shorter, i):
            api.store.put("endpointslices", doc)
        with daemon.cond:
            daemon.cond.wait_for(
                lambda s=seen_syncs: any(e.get("services_changed") for e in daemon.syncs[s:]),
                timeout=60,
            )
            after = daemon.syncs[seen_syncs:]
        programmed = next((e for e in after if e.get("services_changed")), None)
        if programmed is None:
            emit(what="verify_change", error=f"change {n} not programmed in 60 s")
            return
        verifies = [e for e in after if e.get("verify")]
        verify = verifies[0] if verifies else None
        # Before the verify moved off the loop, its sync.applied came after its read-back and
        # compare; since, its verify.read_back line marks the end. Written after drift.detected
        # and before that line, the change was written while the verify was due or running.
        with daemon.cond:
            daemon.cond.wait_for(
                lambda v=seen_verifies, s=seen_syncs: (
                    len(daemon.verifies) > v or any(e.get("verify") for e in daemon.syncs[s:])
                ),
                timeout=120,
            )
            ends = daemon.verifies[seen_verifies:]
            verifies = [e for e in daemon.syncs[seen_syncs:] if e.get("verify")]
        verify = verifies[0] if verifies else None
        end = ends[0] if ends else verify
        verify_end = stamp(end) - written if end is not None else None
        emit(
            what="verify_change",
            services=cluster.services,
            endpoints=cluster.endpoints,
            change=n,
            seconds=round(stamp(programmed) - written, 3),
            min_sync_period_s=MIN_SYNC_PERIOD,
            during_read_back=verify_end is not None and verify_end > 0,
            programmed_by_the_verify=bool(programmed.get("verify")),
            verify_done_after_write_s=round(verify_end, 3) if verify_end is not None else None,
            verify_sync_ms=verify.get("duration_ms") if verify is not None else None,
            ops=programmed.get("ops"),
        )
        time.sleep(1)


def restart(daemon: Daemon, kubeconfig: Path, **shape: int) -> Daemon:
    """Stop ``daemon``, start another on the same namespace with nothing changed; returns it."""
    daemon.stop()
    start = time.monotonic()
    (metrics,) = free_ports(1, besides=(daemon.healthz,))
    again = Daemon(daemon.netns, kubeconfig, daemon.healthz, metrics, [])
    while not again.healthy():
        if again.proc.poll() is not None:
            raise SystemExit(f"daemon exited {again.proc.returncode}")
        time.sleep(0.05)
    took = time.monotonic() - start
    cpu = cpu_seconds(again.proc.pid)
    first = again.next_sync(0, timeout=5)
    with again.cond:
        trusted = any(e.get("event") == "sync.restart_trusted" for e in again.events)
    emit(
        what="restart",
        **shape,
        seconds=round(took, 3),
        cpu_s=round(cpu, 3),
        ops=first.get("ops") if first else None,
        records_trusted=trusted,
    )
    return again


def burst(api: ApiServer, daemon: Daemon, cluster: gen.Cluster, count: int) -> None:
    """``count`` slice changes as fast as the API server takes them (see the module)."""
    seen = len(daemon.syncs)
    began = time.time()
    for n in range(count):
        i = (n * 7919 + 13) % cluster.services
        # Without its first endpoint: unlike the other changes here (which keep the first
        # ones), so every write changes its service even where an earlier one touched it.
        shorter = gen.Cluster(
            services=cluster.services,
            endpoints=cluster.endpoints,
            overrides={i: tuple(cluster.endpoint_ips(i)[1:])},
        )
        for doc in gen.slice_docs(shorter, i):
            api.store.put("endpointslices", doc)
    last = time.time()
    # Converged: every changed service programmed (each sync counts the services it changed;
    # every write changed a service of its own).
    deadline = last + 300
    with daemon.cond:
        while not daemon.cond.wait_for(
            lambda: sum(e.get("services_changed", 0) for e in daemon.syncs[seen:]) >= count,
            timeout=1,
        ):
            if time.time() > deadline:
                emit(what="burst", error="not converged in 300 s")
                return
        changed = [e for e in daemon.syncs[seen:] if e.get("services_changed")]
    emit(
        what="burst",
        services=cluster.services,
        endpoints=cluster.endpoints,
        changes=count,
        write_s=round(last - began, 3),
        last_write_to_converged_s=round(stamp(changed[-1]) - last, 3),
        syncs=len(changed),
        services_changed=sum(e["services_changed"] for e in changed),
        ops=sum(e.get("ops", 0) for e in changed),
        full_syncs=sum(1 for e in changed if not e.get("incremental")),
        # Where the syncs' time went (ms, summed): plan, diff, commit (validate, encode, the
        # kernel), and all of it with the effects.
        **{
            f"{k}_sum": round(sum(e.get(k, 0.0) for e in changed), 1)
            for k in ("plan_ms", "diff_ms", "commit_ms", "duration_ms")
        },
        per_sync=[(e["services_changed"], round(e.get("duration_ms", 0.0))) for e in changed],
    )


def run(
    services: int,
    endpoints: int,
    changes: int,
    settle: float,
    verify_after: float,
    idle: float = 0.0,
    *,
    drift_changes: int = 0,
    rss_every: float = 10.0,
    restarts: int = 0,
    burst_changes: int = 0,
) -> None:
    imports_rss()
    cluster = gen.Cluster(services=services, endpoints=endpoints)
    api = ApiServer(token=TOKEN)
    api.start()
    netns = f"nlpb-daemon-{os.getpid()}"
    daemon = None
    try:
        subprocess.run(["ip", "netns", "add", netns], check=True)
        subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)
        # Routes to the pods, as a CNI would have them (the inspector checks every endpoint).
        for cmd in (
            ["link", "add", "pods0", "type", "veth", "peer", "name", "pods1"],
            ["link", "set", "pods1", "up"],
            ["link", "set", "pods0", "up"],
            ["route", "add", str(gen.CLUSTER_CIDR), "dev", "pods0"],
        ):
            subprocess.run(["ip", "-n", netns, *cmd], check=True)
        api.store.put("nodes", gen.node_doc())
        for i in range(services):
            api.store.put("services", gen.service_doc(cluster, i))
            for doc in gen.slice_docs(cluster, i):
                api.store.put("endpointslices", doc)
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", api)
            start = time.monotonic()
            extra = ["--sync-period", f"{verify_after}s"] if verify_after else []
            daemon = Daemon(netns, kubeconfig, *free_ports(2), extra)
            while not daemon.healthy():
                if daemon.proc.poll() is not None:
                    raise SystemExit(f"daemon exited {daemon.proc.returncode}")
                time.sleep(0.05)
            first = time.monotonic() - start
            rss, hwm = rss_mb(daemon.proc.pid)
            emit(
                what="first_sync",
                services=services,
                endpoints=endpoints,
                seconds=round(first, 3),
                ops=daemon.syncs[0]["ops"] if daemon.syncs else None,
                rss_mb=round(rss, 1),
                peak_rss_mb=round(hwm, 1),
            )
            # Steady state: let start-up work finish first (the inspector's first pass
            # classifies every endpoint, 100k at 10k x 10, in a worker thread).
            time.sleep(settle)
            emit_rss("settled", daemon.proc.pid)
            emit(what="rss_peak", stage="settled", **daemon.peak())
            if CENSUS is not None:
                census(daemon, "1")
            with daemon.cond:
                lost = [e for e in daemon.events if e.get("event") == "drift.notifications_lost"]
                verify_syncs = sum(1 for e in daemon.syncs if e.get("verify"))
            # The cold start's own notifications overflow the monitor's socket: read back again
            # (a verify sync, or a verify.read_back line) only if they were not all its own.
            emit(
                what="cold_start_notifications",
                services=services,
                lost_reports=len(lost),
                lost_all_own=[e.get("own") for e in lost],
                read_backs=len(daemon.verifies) + verify_syncs,
            )
            lat: list[float] = []
            order: list[float] = []
            ops = []
            for n in range(changes):
                i = (n * 7919) % services
                shorter = gen.Cluster(
                    services=services,
                    endpoints=endpoints,
                    overrides={i: tuple(cluster.endpoint_ips(i)[: endpoints - 1 - n % 2])},
                )
                seen = len(daemon.syncs)
                t = time.time()
                for doc in gen.slice_docs(shorter, i):
                    api.store.put("endpointslices", doc)
                ev = daemon.next_sync(seen, timeout=30)
                if ev is None:
                    emit(what="event_to_commit", error=f"no sync for change {n}")
                    break
                lat.append((stamp(ev) - t) * 1000)
                order.append(round(lat[-1], 1))
                ops.append(ev["ops"])
                time.sleep(0.2)
            if lat:
                lat.sort()
                emit(
                    what="event_to_commit",
                    services=services,
                    changes=len(lat),
                    settle_s=settle,
                    p50_ms=round(statistics.median(lat), 2),
                    p99_ms=round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2),
                    max_ms=round(lat[-1], 2),
                    ops_median=statistics.median(ops),
                    in_order_ms=order,
                )
            emit_rss("after_changes", daemon.proc.pid)
            if verify_after:
                wait_verify(daemon, verify_after, settle)
            if drift_changes:
                verify_changes(api, daemon, cluster, drift_changes, changes)
                time.sleep(settle)
            if burst_changes:
                burst(api, daemon, cluster, burst_changes)
            for _ in range(restarts):
                time.sleep(settle)
                daemon = restart(daemon, kubeconfig, services=services, endpoints=endpoints)
            if idle:
                shape = {"services": services, "endpoints": endpoints}
                measure_idle(daemon.proc.pid, idle, rss_every, **shape)
    finally:
        if daemon is not None:
            daemon.stop()
        api.stop()
        subprocess.run(["ip", "netns", "delete", netns], check=False)


def wait_verify(daemon: Daemon, period: float, settle: float) -> None:
    """Wait for the next full verify (a ``sync.applied`` with ``verify``), then report RSS."""
    seen = len(daemon.syncs)
    while (ev := daemon.next_sync(seen, timeout=period * 2 + 30)) is not None:
        seen += 1
        if ev.get("verify"):
            time.sleep(settle)  # the effects after the sync (reachability) run on
            emit_rss("after_verify", daemon.proc.pid)
            return
    emit(what="rss", stage="after_verify", error="no verify seen")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--services", type=int, default=10000)
    p.add_argument("--endpoints", type=int, default=10)
    p.add_argument("--changes", type=int, default=20)
    p.add_argument("--settle", type=float, default=5.0, help="seconds to wait after start-up")
    p.add_argument(
        "--verify-after",
        type=float,
        default=0.0,
        metavar="S",
        help="run the daemon with this sync period and report RSS after a verify (0: don't)",
    )
    p.add_argument(
        "--idle",
        type=float,
        default=0.0,
        metavar="S",
        help="at the end, measure the daemon's CPU over S idle seconds (0: don't)",
    )
    p.add_argument(
        "--drift-changes",
        type=int,
        default=0,
        metavar="N",
        help="N changes written while a drift's read-back verify is due (0: none)",
    )
    p.add_argument(
        "--rss-every", type=float, default=10.0, metavar="S", help="RSS sampling while idle"
    )
    p.add_argument("--restart", type=int, default=0, metavar="N", help="N unchanged restarts")
    p.add_argument("--burst", type=int, default=0, metavar="N", help="N slice changes at once")
    p.add_argument("--baseline", type=Path, metavar="DIR", help="run another nlproxy's tree")
    p.add_argument("--log", type=Path, metavar="FILE", help="copy the daemons' log lines there")
    p.add_argument(
        "--census",
        type=Path,
        metavar="PREFIX",
        help="trace the daemon's allocations and have it write heap censuses to PREFIX.*.json "
        "(after its first sync, and after --settle); its RSS is then not the untraced RSS",
    )
    args = p.parse_args(argv)
    if args.census is not None:
        global CENSUS
        CENSUS = args.census.resolve()
    if args.log is not None:
        global LOG
        LOG = args.log.open("w", buffering=1)
    if args.baseline is not None:
        global TREE
        TREE = args.baseline.resolve()
    run(
        args.services,
        args.endpoints,
        args.changes,
        args.settle,
        args.verify_after,
        args.idle,
        drift_changes=args.drift_changes,
        rss_every=args.rss_every,
        restarts=args.restart,
        burst_changes=args.burst,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
