"""What keeps the daemon's memory down: allocator settings, shared names, lean bookkeeping.

The allocator tests run a child Python (a fresh allocator) and look at glibc's own counters.
"""

from __future__ import annotations

import json
import subprocess
import sys
from ipaddress import ip_address, ip_network
from pathlib import Path

import pytest

from nlproxy.cluster.model import Endpoint, EndpointSlice, IPFamily
from nlproxy.cluster.parse import parse_endpoint_slice
from nlproxy.cluster.state import ClusterState
from nlproxy.nft.ir import Family
from nlproxy.proxy import naming as n
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.endpoints import Backend, OnePort, addresses, resolve
from nlproxy.proxy.incremental import Live, attach, hairpin_ints, plan_update
from nlproxy.proxy.planner import Plan, hairpin_of, plan
from tests.unit.builders import NODE, endpoint, eps_slice, port, service, snapshot, upsert

ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import ctypes, sys, threading
from nlproxy.daemon.memory import tune_allocator
if sys.argv[1] == "tuned":
    assert tune_allocator()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
class Info(ctypes.Structure):
    _fields_ = [(f, ctypes.c_size_t) for f in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
libc.free(libc.malloc(16 << 20))  # freeing a large mapped block raises glibc's threshold
before = libc.mallinfo2().hblks
block = libc.malloc(8 << 20)
print("mapped", libc.mallinfo2().hblks - before, flush=True)
libc.free(block)
kept = []
worker = threading.Thread(target=lambda: kept.append(libc.malloc(64)))
worker.start()
worker.join()
libc.malloc_stats()  # one "Arena N:" line per arena, on stderr
"""


def _child(mode: str) -> tuple[int, int]:
    """(8 MiB blocks mapped on their own after a 16 MiB one was freed, arenas after a thread
    allocated) in a fresh process, ``tuned`` or ``plain``."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, mode],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    mapped = int(done.stdout.split()[-1])
    arenas = sum(1 for line in done.stderr.splitlines() if line.startswith("Arena "))
    return mapped, arenas


def test_tuned_allocator_returns_large_blocks_and_shares_one_arena() -> None:
    # Untuned, glibc raised its mmap threshold and keeps the next large block in the heap,
    # and a thread gets an arena of its own; tuned, neither happens.
    assert _child("plain") == (0, 2)
    assert _child("tuned") == (1, 1)


_RELEASE_CHILD = """
import ctypes
from nlproxy.daemon.memory import release
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def rss_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1])
blocks = [libc.malloc(64 << 10) for _ in range(128)]
for b in blocks:
    ctypes.memset(b, 1, 64 << 10)
for b in blocks[:-1]:  # the last one stays: the free 8 MB are not at the heap's top
    libc.free(b)
before = rss_kb()
print(release(), before - rss_kb())
"""


def test_release_returns_free_heap_pages() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _RELEASE_CHILD],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    released, kb = done.stdout.split()
    assert released == "True"
    assert int(kb) > 6 * 1024  # of the 8 MB freed in the middle of the heap


def _slice_doc(name: str, ips: list[str], node_name: str) -> dict[str, object]:
    return {
        "metadata": {
            "name": name,
            "namespace": "shop",
            "labels": {"kubernetes.io/service-name": "web"},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "nodeName": node_name, "zone": "zone-a"} for ip in ips],
    }


def _parsed(doc: dict[str, object]) -> EndpointSlice:
    # Through JSON text, as the API source reads it: every string is a fresh object.
    parsed = parse_endpoint_slice(json.loads(json.dumps(doc)))
    assert parsed is not None
    return parsed


def test_repeated_names_are_one_string() -> None:
    a = _parsed(_slice_doc("web-a", ["10.0.0.1", "10.0.0.2"], "node-7"))
    b = _parsed(_slice_doc("web-b", ["10.0.0.3"], "node-7"))
    eps = [*a.endpoints, *b.endpoints]
    assert {ep.node_name for ep in eps} == {"node-7"}
    assert all(ep.node_name is eps[0].node_name for ep in eps)
    assert all(ep.zone is eps[0].zone for ep in eps)
    assert a.namespace is b.namespace
    assert a.ports[0].name is b.ports[0].name


def test_slow_path_endpoints_share_names_too() -> None:
    doc = _slice_doc("web-a", ["10.0.0.1"], "node-7")
    slow = _slice_doc("web-b", ["10.0.0.2"], "node-7")
    slow["endpoints"][0]["hints"] = {"forZones": [{"name": "zone-a"}]}  # type: ignore[index]
    a, b = _parsed(doc), _parsed(slow)
    assert b.endpoints[0].hints_zones == frozenset({"zone-a"})
    assert a.endpoints[0].node_name is b.endpoints[0].node_name


CONFIG = ProxyConfig(node_name=NODE, cluster_cidrs=(ip_network("10.0.0.0/8"),))


def _extra(p: Plan) -> dict[int, int]:
    """The repeats counted, by address (as an int; counted by packed pair ``a . a``)."""
    assert isinstance(p.live, Live)
    extra = p.live.counts[Family.IP].hairpin_extra
    return {int.from_bytes(pair[:4], "big"): count for pair, count in extra.items()}


def _pairs(p: Plan) -> set[str]:
    return {str(key[0]) for key in p.rulesets[Family.IP].elements[n.HAIRPIN]}


def test_hairpin_counts_only_repeats() -> None:
    state = ClusterState(NODE)
    web = service("a", "web", "172.30.0.1", [port("a", "web")])
    api = service("a", "api", "172.30.0.2", [port("a", "api"), port("a", "api", "p81", 81)])
    ports = [("p80", 8080, "TCP"), ("p81", 8081, "TCP")]
    state.apply(
        [
            upsert(web),
            upsert(api),
            upsert(eps_slice("a", "web", [endpoint("10.0.0.1"), endpoint("10.0.0.2")], ports)),
            upsert(eps_slice("a", "api", [endpoint("10.0.0.2"), endpoint("10.0.0.3")], ports)),
        ]
    )
    live = plan(state.snapshot(), CONFIG)
    assert attach(live, state.snapshot())
    # 10.0.0.1: web's one port; 10.0.0.2: web's port and api's two; 10.0.0.3: api's two.
    assert _pairs(live) == {"10.0.0.1", "10.0.0.2", "10.0.0.3"}
    assert _extra(live) == {int(ip_address("10.0.0.2")): 2, int(ip_address("10.0.0.3")): 1}

    steps = [
        (
            eps_slice("a", "web", [endpoint("10.0.0.1")], ports),
            {"10.0.0.1", "10.0.0.2", "10.0.0.3"},
        ),
        (eps_slice("a", "api", [endpoint("10.0.0.3")], ports), {"10.0.0.1", "10.0.0.3"}),
        (eps_slice("a", "web", [endpoint("10.0.0.3")], ports), {"10.0.0.3"}),
    ]
    for sl, pairs in steps:
        changed = state.apply([upsert(sl)])
        live, deltas = plan_update(live, state.snapshot(), CONFIG, changed)
        assert deltas is not None, "updated in place"
        fresh = plan(state.snapshot(), CONFIG)
        assert _pairs(live) == _pairs(fresh) == pairs
        assert live.rulesets == fresh.rulesets
    assert _extra(live) == {int(ip_address("10.0.0.3")): 2}


def test_attach_lists_the_hairpin_addresses_as_the_planner_lists_them() -> None:
    """``hairpin_ints`` (attach's listing) is ``hairpin_of``'s, as ints in its order: the
    cluster and local sets of each port part, IPv4 and IPv6, a Local policy's too."""
    state = ClusterState(NODE)
    web = service("a", "web", "172.30.0.1", [port("a", "web"), port("a", "web", "p81", 81)])
    local = service("a", "loc", "172.30.0.2", internal_policy_local=True)
    six = service("a", "six", "fd00::1")
    state.apply(
        [
            upsert(web),
            upsert(local),
            upsert(six),
            upsert(
                eps_slice(
                    "a",
                    "web",
                    [endpoint("10.0.0.2"), endpoint("10.0.0.1")],
                    [("p80", 8080, "TCP"), ("p81", 8081, "TCP")],
                )
            ),
            upsert(eps_slice("a", "loc", [endpoint("10.0.0.3", NODE), endpoint("10.0.0.4")])),
            upsert(eps_slice("a", "six", [endpoint("fd00::5"), endpoint("fd00::4")])),
        ]
    )
    planned = plan(state.snapshot(), CONFIG)
    listed = 0
    for frags in planned.fragments.values():
        for frag in frags.values():
            ints: list[int] = []
            hairpin_ints(frag, ints)
            assert ints == [int(ip) for ip in hairpin_of(frag)]
            listed += len(ints)
    assert listed == 2 + 2 + 1 + 2  # web's two ports, loc's local set, six's two


def test_a_ports_backends_are_its_endpoints_and_number_not_pairs() -> None:
    """A port resolved from one slice keeps the slice's endpoints and the port's number (no
    (address, port) pair per endpoint in the plan), and reads as the tuple of pairs it stands
    for: equal to it, hashing as it, indexed, sliced and joined as it."""
    svc = service("a", "web", "172.30.0.1", [port("a", "web")])
    ips = ["10.0.0.3", "10.0.0.1", "10.0.0.2"]  # unsorted: the endpoints are ordered once
    sl = eps_slice("a", "web", [endpoint(ip) for ip in ips], [("p80", 8080, "TCP")])
    backends, _ = resolve(svc.ports[0], [sl], IPFamily.IPV4)
    assert isinstance(backends, OnePort)
    assert backends.port == 8080
    pairs = tuple(Backend(ip_address(ip), 8080) for ip in sorted(ips))
    assert backends == pairs
    assert pairs == backends
    assert hash(backends) == hash(pairs)
    assert backends != pairs[:2]
    assert backends != OnePort(backends.endpoints, 8081)
    assert backends[0] == pairs[0]
    assert backends[-1].ip == ip_address("10.0.0.3")
    assert backends[1:] == pairs[1:]
    assert list(backends) == list(pairs)
    assert backends + pairs[:1] == (*pairs, pairs[0])
    assert pairs[:1] + backends == (
        pairs[0],
        *pairs,
    )
    assert list(addresses(backends)) == [b.ip for b in pairs] == list(addresses(pairs))
    assert pairs[1] in backends
    assert backends.index(pairs[2]) == 2
    assert repr(backends) == repr(pairs)
    with pytest.raises(TypeError):
        backends + [pairs[0]]  # noqa: RUF005 (as a tuple: only a tuple joins it)

    p = plan(snapshot([svc], [sl]), CONFIG)
    summary = p.ports[svc.ports[0].ref]
    assert summary.cluster_endpoints == pairs
    assert isinstance(summary.cluster_endpoints, OnePort)
    assert summary.cluster_endpoints.endpoints == tuple(sorted(sl.endpoints, key=_ip_of))
    # The kernel's elements are the pairs' (what a plan from tuples of pairs had).
    data = sorted(el.value for el in p.rulesets[Family.IP].elements[n.BACKENDS].values())
    assert data == [(b.ip, b.port) for b in pairs]
    assert _pairs(p) == set(ips)


def _ip_of(ep: Endpoint) -> int:
    return int(ep.ip)
