"""Conntrack cleanup at 100k flows: nlproxy's ctnetlink path side by side with ``conntrack -D``.

Fills a fresh network namespace's table with N UDP flows (clients → 100 service addresses,
answered by 1000 endpoints), then removes one endpoint's flows of one service, with
``Conntrack.delete(stale_flow_filters(...))`` and with ``conntrack -D`` given the same filter.
Each round refills what was deleted. Prints JSON lines: one per measurement, then a summary
with medians and ratios. Also measures how fast the table can be filled (ctnetlink NEW batches
versus ``conntrack -I`` per flow).

With ``--sweep S``: the start-up sweep instead (``FlowCleanup.sweep``, ``sync/cleanup.py``): S
UDP Services x 10 endpoints planned, N UDP flows to them of which every 11th is answered by an
endpoint no longer planned; the sweep's wall and CPU seconds, the flows it read and deleted.
At 100k flows (9,090 stale), load ~2 on 2 CPUs: 10 Services 0.80-1.00 s CPU (decoding every
flow, then a filtered pass to delete: 4.0-4.4 s), 10,000 Services 2.7-2.8 s (8.0-8.7 s), most
of it finding the 10,000 frontends' backends in the planned tables.

    .venv/bin/python bench/bench_conntrack.py [--flows 100000] [--rounds 5] [--sweep 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv6Address, ip_address

from nlproxy.conntrack.kernel import Backend, Conntrack, Frontend, stale_flow_filters
from nlproxy.conntrack.messages import Flow, FlowFilter, FlowTuple, IPAddress, encode_new
from nlproxy.netlink.nlsock import NLMSG_ERROR, NetfilterSocket

VIPS = 100
ENDPOINTS = 1000
PORT = 53
TARGET = 5353


FAMILY = {"v": 4}
"""Address family of the generated flows (``--family``)."""


def _addr(v4: str, v6: str, offset: int) -> IPAddress:
    base = IPv4Address(v4) if FAMILY["v"] == 4 else IPv6Address(v6)
    return base + offset


def vip(i: int) -> IPAddress:
    return _addr("10.96.0.0", "fd00:96::", i % VIPS)


def endpoint(i: int) -> IPAddress:
    return _addr("10.244.0.0", "fd00:244::", 1 + i % ENDPOINTS)


def flow(i: int) -> Flow:
    # Client i talks to service i % 100 through endpoint i % 1000: each endpoint serves a tenth
    # of one service's flows, ~100 flows per (service, endpoint) pair at 100k.
    client = _addr("10.1.0.0", "fd00:1::", i)
    sport = 10000 + i % 50000
    return Flow(
        orig=FlowTuple(client, vip(i), 17, sport, PORT),
        reply=FlowTuple(endpoint(i), client, 17, TARGET, sport),
        timeout=3600,
    )


def fill(ns: str, flows: Iterator[Flow], chunk: int = 4000) -> int:
    created = 0
    with NetfilterSocket(ns) as sock:
        batch: list[bytes] = []
        for f in flows:
            batch.append(encode_new(f, sock.next_seq(), ack=True))
            if len(batch) == chunk:
                created += _send(sock, batch)
                batch = []
        created += _send(sock, batch)
    return created


def _send(sock: NetfilterSocket, batch: list[bytes]) -> int:
    if not batch:
        return 0
    sock.send(b"".join(batch))
    pending, ok = len(batch), 0
    while pending:
        for msg in sock.recv(timeout=10):
            if msg.type == NLMSG_ERROR:
                pending -= 1
                ok += msg.error == 0
    return ok


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def run_tool(ns: str, *args: str) -> float:
    started = time.perf_counter()
    subprocess.run(["ip", "netns", "exec", ns, *args], check=True, capture_output=True)
    return (time.perf_counter() - started) * 1000


def bench_fill(ns: str, n: int) -> None:
    started = time.perf_counter()
    created = fill(ns, (flow(i) for i in range(n)))
    ms = (time.perf_counter() - started) * 1000
    emit(bench="fill", method="ctnetlink-batch", flows=created, ms=round(ms, 1))
    sample = 200
    started = time.perf_counter()
    for i in range(n, n + sample):
        f = flow(i)
        run_tool(
            ns,
            "conntrack",
            "-I",
            "-p",
            "udp",
            "-s",
            str(f.orig.src),
            "-d",
            str(f.orig.dst),
            "--sport",
            str(f.orig.sport),
            "--dport",
            str(PORT),
            "--reply-src",
            str(f.reply.src),
            "--reply-port-src",
            str(TARGET),
            "--timeout",
            "3600",
        )
    per_flow = (time.perf_counter() - started) * 1000 / sample
    emit(
        bench="fill",
        method="conntrack -I (sequential)",
        sample=sample,
        ms_per_flow=round(per_flow, 3),
        projected_ms=round(per_flow * n),
    )
    extra = Conntrack(ns).delete_flows(flow(i) for i in range(n, n + sample))
    assert extra == sample, f"conntrack -I created {extra} of {sample} flows"


def one_endpoint(n: int, svc: int, ep: int) -> list[Flow]:
    return [flow(i) for i in range(n) if i % VIPS == svc and i % ENDPOINTS == ep]


def bench_clean(ns: str, n: int, rounds: int) -> None:
    svc, ep = 7, 207  # endpoint 10.244.0.208 serves service 10.96.0.7
    victims = one_endpoint(n, svc, ep)
    fe = Frontend("udp", vip(svc), PORT)
    gone = Backend(endpoint(ep), TARGET)
    others = {Backend(endpoint(e), TARGET) for e in range(ENDPOINTS) if e % VIPS == svc}
    filters = stale_flow_filters(
        {fe: frozenset(others)}, {fe: frozenset(others - {gone})}, node_addrs=[]
    )
    baseline = statistics.median(run_tool(ns, "true") for _ in range(5))
    ours, tools = [], []
    ct = Conntrack(ns)
    for r in range(rounds):
        started = time.perf_counter()
        deleted = ct.delete(filters)
        ours.append((time.perf_counter() - started) * 1000)
        emit(
            bench="clean",
            method="nlproxy",
            round=r,
            flows=n,
            deleted=deleted,
            ms=round(ours[-1], 2),
        )
        assert fill(ns, iter(victims)) == len(victims)
        ms = run_tool(
            ns,
            "conntrack",
            "-D",
            "-p",
            "udp",
            "-d",
            str(vip(svc)),
            "--dport",
            str(PORT),
            "--reply-src",
            str(endpoint(ep)),
            "--reply-port-src",
            str(TARGET),
        )
        tools.append(ms)
        emit(bench="clean", method="conntrack -D", round=r, flows=n, ms=round(ms, 2))
        assert fill(ns, iter(victims)) == len(victims)
    ours_ms, tool_ms = statistics.median(ours), statistics.median(tools)
    emit(
        bench="clean-summary",
        family=FAMILY["v"],
        flows=n,
        deleted=len(victims),
        nlproxy_ms=round(ours_ms, 2),
        conntrack_tool_ms=round(tool_ms, 2),
        exec_baseline_ms=round(baseline, 2),
        ratio=round(tool_ms / ours_ms, 2),
        ratio_without_exec=round((tool_ms - baseline) / ours_ms, 2),
    )


def bench_pass(ns: str, n: int) -> None:
    """What one kernel-filtered pass costs when nothing matches."""
    ct = Conntrack(ns)
    nowhere = ip_address("10.97.0.1" if FAMILY["v"] == 4 else "fd00:97::1")
    nothing = FlowFilter(proto="udp", orig_dst=nowhere, orig_dport=PORT)
    times = []
    for _ in range(5):
        started = time.perf_counter()
        assert list(ct.list(nothing)) == []
        times.append((time.perf_counter() - started) * 1000)
    emit(bench="empty-pass", family=FAMILY["v"], flows=n, ms=round(statistics.median(times), 2))


def bench_sweep(ns: str, n: int, services: int, rounds: int) -> None:
    """The start-up sweep over ``n`` UDP flows to ``services`` planned UDP Services."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.bench_incremental import CONFIG, NODE, upsert_of
    from nlproxy.cluster.model import (
        Endpoint,
        EndpointPort,
        EndpointSlice,
        IPFamily,
        Node,
        Protocol,
        Service,
        ServiceKey,
        ServicePort,
        ServicePortRef,
        ServiceType,
    )
    from nlproxy.cluster.state import ClusterState
    from nlproxy.log import get_logger
    from nlproxy.proxy.planner import plan
    from nlproxy.sync.cleanup import FlowCleanup

    udp = Protocol.UDP

    def svc_ip(i: int) -> IPv4Address:
        return IPv4Address("10.96.0.0") + 1 + i

    def ep_ip(i: int, j: int) -> IPv4Address:
        return IPv4Address("10.128.0.0") + i * 16 + j

    state = ClusterState(NODE)
    objs: list[object] = [Node(name=NODE, addresses=(IPv4Address("192.168.77.1"),))]
    for i in range(services):
        key = ServiceKey(namespace="ns", name=f"s{i}")
        ref = ServicePortRef(namespace="ns", name=f"s{i}", port_name="dns", protocol=udp)
        objs.append(
            Service(
                key=key,
                type=ServiceType.CLUSTER_IP,
                cluster_ips=(svc_ip(i),),
                ports=(ServicePort(ref=ref, port=PORT, target_port=TARGET),),
            )
        )
        eps = tuple(
            Endpoint(ip=ep_ip(i, j), ready=True, serving=True, terminating=False, node_name="n")
            for j in range(10)
        )
        objs.append(
            EndpointSlice(
                namespace="ns",
                name=f"s{i}-x",
                service=key,
                family=IPFamily.IPV4,
                ports=(EndpointPort(name="dns", port=TARGET, protocol=udp),),
                endpoints=eps,
            )
        )
    state.apply([upsert_of(o) for o in objs])  # type: ignore[arg-type]
    snap = state.snapshot()
    programmed = plan(snap, CONFIG).rulesets

    def sweep_flow(k: int) -> Flow:
        client = IPv4Address("10.1.0.0") + k
        sport = 10000 + k % 50000
        i = k % services
        return Flow(
            orig=FlowTuple(client, svc_ip(i), 17, sport, PORT),
            reply=FlowTuple(ep_ip(i, k % 11), client, 17, TARGET, sport),  # 10: removed
            timeout=3600,
        )

    stale = sum(1 for k in range(n) if k % 11 == 10)
    for r in range(rounds):
        fill(ns, (sweep_flow(k) for k in range(n) if r == 0 or k % 11 == 10))
        cleanup = FlowCleanup(Conntrack(ns), CONFIG, get_logger("bench"), flush_tcp=False)
        wall, cpu = time.perf_counter(), time.process_time()
        deleted = cleanup.sweep(programmed, snap)
        emit(
            bench="sweep",
            services=services,
            flows=n,
            stale=stale,
            deleted=deleted,
            wall_s=round(time.perf_counter() - wall, 3),
            cpu_s=round(time.process_time() - cpu, 3),
            loadavg=os.getloadavg(),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--family", type=int, choices=[4, 6], default=4)
    parser.add_argument("--sweep", type=int, default=0, metavar="S", help="the sweep, S Services")
    args = parser.parse_args()
    FAMILY["v"] = args.family
    ns = f"nlp-bench-ct-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        if args.sweep:
            bench_sweep(ns, args.flows, args.sweep, args.rounds)
            return
        bench_fill(ns, args.flows)
        bench_pass(ns, args.flows)
        bench_clean(ns, args.flows, args.rounds)
    finally:
        subprocess.run(["ip", "netns", "delete", ns], check=False)


if __name__ == "__main__":
    main()
