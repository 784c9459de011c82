"""Data-plane benchmark: first-packet TCP connect latency to the LAST of S services.

Topology of its own, three namespaces: client (192.168.77.2) → node (routes; the rules under
test) → pod (10.128.0.2, a tiny accept-and-close server on 8080). Every connection is fresh, so
its SYN walks the node's nat prerouting rules before conntrack knows it. Variants: nlproxy's
ruleset (``run --once``), kube-proxy's nft shapes (``nft -f``) and iptables mode
(``iptables-restore``), and the pod address directly with no rules (the floor). Bounded in
connections and seconds; prints JSON lines with p50/p90/p99. Never asserts on time, and sends
traffic only between the namespaces it created.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import control
import gen
from measure import PY, BenchError, Sink, emit, in_ns, log, netns, run_measured, sh

CLIENT_IP, NODE_CLIENT_IP = "192.168.77.2", "192.168.77.1"
POD_IP, NODE_POD_IP = "10.128.0.2", "10.128.0.1"

# Loading kube-proxy's nft shapes took longer than the 300 s load timeout at 30k services x 1
# endpoint on a 2-core machine (1.31: 60k chains; 1.36: 30k anonymous maps): skip them above this.
LOAD_LIMIT = {"nft-1.31": 10_000, "nft-1.36": 10_000}

SERVER = textwrap.dedent(
    """
    import socket, sys
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(4096)
    print("ready", flush=True)
    while True:
        c, _ = s.accept(); c.close()
    """
)

CLIENT = textwrap.dedent(
    """
    import json, socket, struct, sys, time
    host, port, count, budget = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    linger = struct.pack("ii", 1, 0)
    samples, errors, end = [], 0, time.monotonic() + budget
    for _ in range(count):
        if time.monotonic() > end:
            break
        s = socket.socket(); s.settimeout(2.0)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)  # RST: no TIME_WAIT pile-up
        t0 = time.perf_counter_ns()
        try:
            s.connect((host, port))
            samples.append(time.perf_counter_ns() - t0)
        except OSError:
            errors += 1
        finally:
            s.close()
    print(json.dumps({"samples": samples, "errors": errors}))
    """
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Topology:
    client: str
    node: str
    pod: str


@contextmanager
def topology() -> Iterator[Topology]:
    """client — node — pod, with the accept server running in pod; all removed on exit."""
    with ExitStack() as stack:
        client, node, pod = (stack.enter_context(netns(p)) for p in ("cli", "node", "pod"))
        _link(client, node, "c0", "n0", CLIENT_IP, NODE_CLIENT_IP, 24)
        _link(pod, node, "p0", "n1", POD_IP, NODE_POD_IP, 30)
        sh("ip", "route", "add", "default", "via", NODE_CLIENT_IP, ns=client)
        sh("ip", "route", "add", "default", "via", NODE_POD_IP, ns=pod)
        sh("sysctl", "-qw", "net.ipv4.ip_forward=1", ns=node)
        server = subprocess.Popen(
            in_ns(pod, PY, "-c", SERVER, str(gen.TARGET_PORT)),
            stdout=subprocess.PIPE,
            text=True,
        )
        stack.callback(_stop, server)
        assert server.stdout is not None
        if server.stdout.readline().strip() != "ready":
            raise BenchError(f"the accept server in {pod} did not start")
        yield Topology(client=client, node=node, pod=pod)


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _link(a: str, b: str, ifa: str, ifb: str, ipa: str, ipb: str, plen: int) -> None:
    sh("ip", "link", "add", ifa, "netns", a, "type", "veth", "peer", "name", ifb, "netns", b)
    for ns, ifname, ip in ((a, ifa, ipa), (b, ifb, ipb)):
        sh("ip", "addr", "add", f"{ip}/{plen}", "dev", ifname, ns=ns)
        sh("ip", "link", "set", ifname, "up", ns=ns)


def connect_latency(
    topo: Topology, host: str, port: int, count: int, budget: float
) -> dict[str, Any]:
    """Fresh TCP connects from the client namespace; microsecond percentiles."""
    out = sh(PY, "-c", CLIENT, host, str(port), str(count), str(budget), ns=topo.client)
    res = json.loads(out)
    samples: list[float] = sorted(s / 1000 for s in res["samples"])
    if not samples:
        raise BenchError(f"no connection to {host}:{port} succeeded ({res['errors']} errors)")

    def pct(p: float) -> float:
        return round(samples[min(len(samples) - 1, int(p * len(samples)))], 1)

    return {
        "connects": len(samples),
        "errors": res["errors"],
        "p50_us": pct(0.50),
        "p90_us": pct(0.90),
        "p99_us": pct(0.99),
    }


def measure_variant(
    c: gen.Cluster, variant: str, inp: control.Inputs, count: int, budget: float, timeout: float
) -> dict[str, Any]:
    """Load ``variant`` into a fresh node, then connect to the last service and, in the same
    topology with the rules loaded, to the pod directly: the ratio of the two cancels the
    machine's drift between runs."""
    with topology() as topo:
        argv, stdin = control.load_command(variant, topo.node, inp)
        log(f"data plane: {c.services} services, {variant}")
        u = run_measured(argv, stdin=stdin, timeout=timeout)
        if u.rc not in (0, 3) or u.timed_out:
            return {"error": u.stderr.strip()[-300:], "timed_out": u.timed_out}
        lat = connect_latency(topo, c.vip(c.services - 1), gen.PORT, count, budget)
        direct = connect_latency(topo, POD_IP, gen.TARGET_PORT, count, budget)
    return {
        **lat,
        "direct_p50_us": direct["p50_us"],
        "direct_p99_us": direct["p99_us"],
        "p50_over_direct": round(lat["p50_us"] / direct["p50_us"], 3),
    }


def run(
    services: Sequence[int],
    variants: Sequence[str],
    work: Path,
    out: Sink,
    count: int,
    budget: float,
    timeout: float,
) -> None:
    """Latency at each service count for each variant, plus the no-rules floor."""
    for s in services:
        c = gen.Cluster(services=s, endpoints=1, last_endpoints=(POD_IP,))
        log(f"data plane: generating {s} services")
        inp = control.generate(c, work / f"dp-{s}", variants)
        with topology() as topo:
            floor = connect_latency(topo, POD_IP, gen.TARGET_PORT, count, budget)
            emit(out, {"bench": "first_packet", "services": s, "variant": "pod-direct", **floor})
        for variant in variants:
            rec: dict[str, Any] = {"bench": "first_packet", "services": s, "variant": variant}
            if s > LOAD_LIMIT.get(variant, s):
                rec["skipped"] = f"load exceeds the timeout above {LOAD_LIMIT[variant]}"
            else:
                rec.update(measure_variant(c, variant, inp, count, budget, timeout))
            emit(out, rec)


def main() -> int:
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description="first-packet latency benchmark")
    ap.add_argument("--services", default="10,1000")
    ap.add_argument("--variants", default="nlproxy,nft-1.31,nft-1.36,iptables-nft")
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--budget", type=float, default=20)
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nlpb-") as tmp:
        run(
            [int(s) for s in args.services.split(",")],
            args.variants.split(","),
            Path(tmp),
            sys.stdout,
            args.count,
            args.budget,
            args.timeout,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
