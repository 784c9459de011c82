"""A deleted table's repair at S services x E endpoints: how long until traffic is carried again
and how long until the table is whole, traffic first (``verify.staged``) vs one batch.

Each round, in a fresh network namespace and a long-lived ``Syncer`` as the daemon holds it: one
cold sync, ``nft delete table ip nlproxy`` from outside, then the daemon's repair path (read back,
compare, prepare off the loop, ``Syncer.repair``). Rows, per variant:

- ``traffic_s``: from the start of ``Syncer.repair`` until the kernel accepted the batches that
  carry traffic (every Service answers from then on; ``tests/kernel/test_verify_repair_staged.py``
  sends real packets at that point);
- ``whole_s``: until the last batch is in; ``first_ops`` / ``later_ops``: operations in each part.

``one-batch`` is the repair as it was (``repair_stage_at`` past any size). With ``--listener``
a socket subscribed to ``NFNLGRP_NFTABLES`` is open during the repair (as the daemon's drift
monitor is): the kernel then builds a notification per element. The record carries the load
average and the host's count of such listeners. Run as root:

    .venv/bin/python bench/bench_repair.py --services 10000 --endpoints 10 --rounds 2 --listener

``--daemon``: instead, ``nlproxy run --manifests`` (``gen.py``'s cluster) in a fresh namespace,
and once it is ready the table deleted from outside: seconds from the delete to the daemon's
``drift.detected``, ``verify.read_back``, ``drift.repair_traffic`` (its first batches in) and
``drift.repaired`` log lines (the whole repair), per round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_incremental import CONFIG, cluster, namespace
from nlproxy.netlink.nlsock import NetfilterSocket
from nlproxy.nft.ir import Family, Operation, Ruleset, Table
from nlproxy.nft.reconcile import count_ops
from nlproxy.nft.tables import Tables
from nlproxy.proxy import naming as n
from nlproxy.sync.kernel import SyncKernel
from nlproxy.sync.kernel import real as real_kernel
from nlproxy.sync.syncer import Syncer
from nlproxy.sync.verify import staged as split

FAMILIES = (Family.IP, Family.IP6)
NETLINK_NETFILTER = 12
NFNLGRP_NFTABLES = 7


def nftables_listeners(ns: str | None = None) -> int:
    """Sockets of network namespace ``ns`` (None: this one) in ``NFNLGRP_NFTABLES``."""
    cmd = ["cat", "/proc/net/netlink"]
    full = ["ip", "netns", "exec", ns, *cmd] if ns else cmd
    text = subprocess.run(full, capture_output=True, text=True, check=True).stdout
    count = 0
    for line in text.splitlines()[1:]:
        cols = line.split()
        if int(cols[1]) == NETLINK_NETFILTER and int(cols[3], 16) & (1 << (NFNLGRP_NFTABLES - 1)):
            count += 1
    return count


class Timed:
    """A table's backend that notes when each batch it commits is accepted."""

    def __init__(self, inner: Tables, done: list[float]) -> None:
        self.inner = inner
        self.table = inner.table
        self.done = done

    def apply(self, ops: Sequence[Operation], known: Ruleset | None = None) -> object:
        result = self.inner.apply(ops, known)
        self.done.append(time.perf_counter())
        return result

    def check(self, ops: Sequence[Operation], known: Ruleset | None = None) -> None:
        self.inner.check(ops, known)

    def known(self) -> Ruleset:
        return self.inner.known()

    def forget(self) -> None:
        self.inner.forget()

    def close(self) -> None:
        self.inner.close()


def one_round(services: int, endpoints: int, *, staged: bool, listener: bool) -> dict[str, object]:
    state = cluster(services, endpoints, 0)
    done: list[float] = []
    with namespace() as ns:
        kernel = real_kernel(ns)

        def tables(table: Table) -> Tables:
            return Timed(kernel.tables(table), done)

        syncer = Syncer(
            CONFIG, SyncKernel(tables=tables, readback=kernel.readback, flows=kernel.flows)
        )
        monitor = None
        try:
            syncer.sync(state.snapshot())
            subprocess.run(
                ["ip", "netns", "exec", ns, "nft", "delete", "table", "ip", n.TABLE], check=True
            )
            if not staged:
                syncer.repair_stage_at = sys.maxsize
            version = syncer.version
            read = {f: syncer.read_back(f) for f in FAMILIES}
            repairs = {f: syncer.repair_ops(f, rs, version) or [] for f, rs in read.items()}
            prepared = syncer.prepare_repair(read, repairs, version)
            if listener:
                # Never read: the kernel builds every notification all the same, and what
                # does not fit the buffer is dropped (the monitor's case when it lags).
                monitor = NetfilterSocket(ns, bufsize=8 << 20)
                monitor.subscribe(NFNLGRP_NFTABLES)
            listeners = (nftables_listeners(), nftables_listeners(ns))
            first_ops = later_ops = 0
            done.clear()
            start = time.perf_counter()
            sent = syncer.repair(read, repairs, version, state.snapshot(), prepared)
            end = time.perf_counter()
            assert sent is not None, "nothing synced between the read-back and the repair"
            # The traffic part ends with the last batch of the first kind: one per family that
            # had repairs (only ip here).
            traffic_at = done[0]
            if staged:
                firsts, laters = split(repairs, syncer.repair_stage_at)
                first_ops = sum(count_ops(o) for _, o in firsts)
                later_ops = sum(count_ops(o) for _, o in laters)
            else:
                first_ops = sent
        finally:
            if monitor is not None:
                monitor.close()
            syncer.close()
    return {
        "bench": "repair",
        "variant": "traffic-first" if staged else "one-batch",
        "services": services,
        "endpoints": endpoints,
        "listener": listener,
        "nftables_listeners_host": listeners[0],
        "nftables_listeners_netns": listeners[1],
        "traffic_s": round(traffic_at - start, 3),
        "whole_s": round(end - start, 3),
        "first_ops": first_ops,
        "later_ops": later_ops,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def _stamp(line: dict[str, object]) -> float:
    text = str(line["timestamp"]).rstrip("Z")
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def daemon_round(services: int, endpoints: int, scratch: Path) -> dict[str, object]:
    import gen  # bench/gen.py

    manifests = scratch / "manifests"
    if not manifests.exists():
        gen.write_manifests(gen.Cluster(services=services, endpoints=endpoints), manifests, "json")
    events: list[dict[str, object]] = []
    with namespace() as ns:
        argv = [sys.executable, "-m", "nlproxy", "--netns", ns, "--log-format", "json", "run"]
        argv += ["--manifests", str(manifests), "--node-name", gen.NODE_NAME]
        argv += ["--cluster-cidr", str(gen.CLUSTER_CIDR), "--service-cidr", str(gen.SERVICE_CIDR)]
        argv += ["--healthz-bind-address", "", "--metrics-bind-address", ""]
        log = scratch / "daemon.log"
        with log.open("w") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:

            def seen(event: str, after: int = 0) -> dict[str, object] | None:
                for line in log.read_text().splitlines()[after:]:
                    if line.startswith("{") and f'"{event}"' in line:
                        return dict(json.loads(line))
                return None

            deadline = time.monotonic() + 600
            while seen("daemon.ready") is None and time.monotonic() < deadline:
                time.sleep(0.2)
            mark = len(log.read_text().splitlines())
            deleted = time.time()
            subprocess.run(["ip", "netns", "exec", ns, "nft", "delete", "table", "ip", n.TABLE])
            while seen("drift.repaired", mark) is None and time.monotonic() < deadline:
                time.sleep(0.2)
            names = ("drift.detected", "verify.read_back", "drift.repair_traffic", "drift.repaired")
            events = [e for e in (seen(name, mark) for name in names) if e is not None]
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    row: dict[str, object] = {"bench": "repair_daemon", "services": services}
    row["endpoints"] = endpoints
    for e in events:
        row[f"{e['event']}_s"] = round(_stamp(e) - deleted, 3)
    row["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    return row


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--services", type=int, default=10000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--listener", action="store_true", help="a NFNLGRP_NFTABLES member meanwhile")
    ap.add_argument("--daemon", action="store_true", help="a daemon's repair, from its log")
    args = ap.parse_args(argv)
    if args.daemon:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        with tempfile.TemporaryDirectory(prefix="nlp-repair-") as tmp:
            for _ in range(args.rounds):
                print(
                    json.dumps(daemon_round(args.services, args.endpoints, Path(tmp))), flush=True
                )
        return 0
    rows: dict[str, list[dict[str, object]]] = {"traffic-first": [], "one-batch": []}
    for _ in range(args.rounds):
        for staged in (True, False):  # interleaved: the same machine load for both
            row = one_round(args.services, args.endpoints, staged=staged, listener=args.listener)
            rows[str(row["variant"])].append(row)
            print(json.dumps(row), flush=True)
    summary: dict[str, object] = {"bench": "repair", "summary": True, "listener": args.listener}
    for variant, got in rows.items():
        for key in ("traffic_s", "whole_s"):
            summary[f"{variant}_{key}_median"] = statistics.median(float(r[key]) for r in got)  # type: ignore[arg-type]
    one = float(summary["one-batch_traffic_s_median"])  # type: ignore[arg-type]
    first = float(summary["traffic-first_traffic_s_median"])  # type: ignore[arg-type]
    summary["traffic_ratio"] = round(one / first, 2) if first else None
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
