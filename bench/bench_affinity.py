"""ClientIP affinity at scale: one Service with P ports x N endpoints, on the real kernel.

Two measurements, each in its own fresh network namespace:

``nlproxy``, ``nlproxy-nodeport``, ``nlproxy-lb-local``, ``nlproxy-ipv6``, ``nlproxy-random``
    nlproxy's Syncer programs the Service, then one of its endpoints goes, then an unrelated
    one-endpoint Service changes. With ``sessionAffinity: ClientIP`` its ports take the map
    layout whatever their frontends, policies and family (``nlproxy``: ClusterIP only, with
    ``--clients`` clients put in each port's clients map before the endpoint goes, so the sync
    also forgets that endpoint's clients; ``nlproxy-nodeport``: a node port per port;
    ``nlproxy-lb-local``: node ports, a LoadBalancer and an external address, Local policy;
    ``nlproxy-ipv6``: IPv6 with node ports); without affinity it is random choice. (Before,
    every port but an IPv4 ClusterIP-only one kept a chain and a set per endpoint: 101,081
    operations and ~50 s for the first sync of this shape.) Each step prints the operations
    sent, the sync's wall time and this process's system time (the kernel's share: a batch is
    committed in the sending thread), with the host's ``NFNLGRP_NFTABLES`` listeners (each
    one costs every commit); the unrelated change's time plus the step before it is how long
    that change waited behind the Service. ``batch`` counts what the step's batches held
    (verb, kind, role) and ``commit_sys_ms`` is the committing thread's system time alone.
    (A rule that looks a map up makes the kernel walk the whole map as it adds the rule: one
    endpoint change re-adding each port's choice rules cost ~100 ms on the LoadBalancer +
    Local shape before those rules moved to the shared ``dnat-N`` chains.)

``map``
    The layout affinity needs instead, loaded with ``nft -f`` so only the shape differs: per
    Service port one dynamic map ``client address -> endpoint`` (with the timeout); a known
    client is DNAT'd through the map, a new one through the shared ``numgen random`` backends
    map; a chain after DNAT (filter, priority -99) learns ``client -> endpoint`` for every new
    connection (``update`` refreshes the timeout, as upstream's per-endpoint sets do). The
    learning chain is found by the original port alone and checks the original address itself
    (enough for one Service; ``affinity_datapath.py`` has the general two-step dispatch). An
    endpoint change is element operations only. Prints the first load and one endpoint removal
    (wall, and the ``nft`` process's system time: the kernel's share). Then, with ``--clients``
    clients held in each port's map (spread over the endpoints), the clients of the removed
    endpoint are forgotten as the sync will (``nft/dynmap.py``: read each port's map, delete
    the stale ones, read again): wall and this process's system time.

Prints one JSON line per step. Usage:
``.venv/bin/python bench/bench_affinity.py [--ports 20] [--endpoints 1000] [--clients 2000]
[--only nlproxy|map]``
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import resource
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.listeners import nftables_listeners
from nlproxy.cluster.state import ClusterState
from nlproxy.netlink.nlsock import NetfilterSocket
from nlproxy.nft.backend import ApplyResult, NftBackend
from nlproxy.nft.dynmap import Clients, forget_stale, pack_endpoints, read_clients
from nlproxy.nft.ir import (
    DataType,
    Element,
    Family,
    Map,
    Operation,
    PackedRun,
    Rule,
    Ruleset,
    SetFlag,
    Table,
)
from nlproxy.sync.kernel import real as real_kernel
from nlproxy.sync.syncer import Syncer
from tests.netns import namespace as netns
from tests.unit.builders import NODE, OTHER_NODE, endpoint, eps_slice, port, service, upsert
from tests.unit.incremental import CONFIG, state_with_node

VIP = "172.30.0.10"
OTHER_VIP = "172.30.0.11"
TIMEOUT = 10800


def _pod(i: int) -> str:
    return f"10.1.{i // 250}.{i % 250 + 1}"


def _emit(**row: Any) -> None:
    print(json.dumps(row), flush=True)


# ------------------------------------------------------------------------------- nlproxy


LAYOUTS: dict[str, dict[str, Any]] = {
    "nlproxy": {"affinity_timeout": TIMEOUT},
    "nlproxy-nodeport": {"affinity_timeout": TIMEOUT, "node_ports": True},
    "nlproxy-lb-local": {
        "affinity_timeout": TIMEOUT,
        "node_ports": True,
        "load_balancer_ips": ["192.0.2.10"],
        "external_ips": ["192.0.2.11"],
        "external_policy_local": True,
        "health_check_node_port": 32000,
    },
    "nlproxy-ipv6": {"affinity_timeout": TIMEOUT, "ipv6": True, "node_ports": True},
    "nlproxy-random": {},
}
"""What the Service asks besides its ports: ClientIP affinity on a ClusterIP-only port, on
ports with a node port each, with a node port, a LoadBalancer and an external address and
``externalTrafficPolicy: Local`` (every other endpoint on this node), in IPv6 with a node
port each (the address and the port in a map each): all the clients-map layout; and no
affinity (random choice)."""

VIP6 = "fd00:172:30::10"


def _objects(ports: int, eps: int, *, layout: str, drop: int | None = None) -> list[Any]:
    extra = dict(LAYOUTS[layout])
    ipv6, node_ports = extra.pop("ipv6", False), extra.pop("node_ports", False)
    specs = [
        port("b", "big", f"p{k}", 8000 + k, node_port=30000 + k if node_ports else None)
        for k in range(ports)
    ]
    svc = service("b", "big", VIP6 if ipv6 else VIP, specs, **extra)
    members = [
        endpoint(_pod6(i) if ipv6 else _pod(i), NODE if i % 2 else OTHER_NODE)
        for i in range(eps)
        if i != drop
    ]
    sl = eps_slice("b", "big", members, [(f"p{k}", 8000 + k, "TCP") for k in range(ports)])
    return [upsert(svc), upsert(sl)]


def _pod6(i: int) -> str:
    return f"fd01::{i // 250:x}:{i % 250 + 1:x}"


def _other(version: int) -> list[Any]:
    svc = service("b", "other", OTHER_VIP)
    return [upsert(svc), upsert(eps_slice("b", "other", [endpoint(f"10.2.0.{version}")]))]


class _Tallied(NftBackend):
    """The real backend, noting what each batch held (verb, kind, the object's role: the
    name's first word) and the system time of the thread that committed it (the kernel's
    share of the batch: it is committed in the sending thread)."""

    batches: ClassVar[list[tuple[Counter[str], float]]] = []

    def apply(self, ops: Sequence[Operation], known: Ruleset | None = None) -> ApplyResult:
        tally: Counter[str] = Counter()
        for op in ops:
            obj = op.obj
            if isinstance(obj, PackedRun):
                tally[f"{op.verb} elements {obj.set.split('-')[0]}"] += len(obj.keys)
                continue
            name = obj.set if isinstance(obj, Element) else (
                obj.chain if isinstance(obj, Rule) else obj.name)  # fmt: skip
            tally[f"{op.verb} {type(obj).__name__.lower()} {name.split('-')[0]}"] += 1
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_stime
        result = super().apply(ops, known)
        spent = resource.getrusage(resource.RUSAGE_THREAD).ru_stime - before
        self.batches.append((tally, spent))
        return result


def _timed(syncer: Syncer, state: ClusterState, changes: list[Any], **row: Any) -> float:
    changed = state.apply(changes)
    _Tallied.batches.clear()
    start, sys_before = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_stime
    result = syncer.sync(state.snapshot(), changed=changed)
    wall = time.perf_counter() - start
    sys_s = resource.getrusage(resource.RUSAGE_SELF).ru_stime - sys_before
    _emit(
        **row,
        ops=result.total_ops,
        wall_s=round(wall, 3),
        sys_s=round(sys_s, 3),
        plan_ms=round(result.plan_ms, 1),
        commit_ms=round(result.commit_ms, 1),
        incremental=result.incremental,
        nftables_listeners=nftables_listeners(),
        commit_sys_ms=round(1000 * sum(spent for _, spent in _Tallied.batches), 1),
        batch=dict(sum((tally for tally, _ in _Tallied.batches), Counter()).most_common()),
    )
    return wall


def _client_maps(ns: str) -> dict[str, dict[str, str]]:
    """Each clients map: client -> endpoint address, as the kernel holds them."""
    cmd = ["ip", "netns", "exec", ns, "nft", "-j", "list", "maps", "ip"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    maps: dict[str, dict[str, str]] = {}
    for item in json.loads(out)["nftables"]:
        m = item.get("map", {})
        if m.get("name", "").startswith("clients-"):
            maps[m["name"]] = {
                str(k["elem"]["val"] if isinstance(k, dict) else k): str(d["concat"][0])
                for k, d in m.get("elem", [])
            }
    return maps


def _learned(ns: str, clients: int, ports: int, eps: int) -> None:
    """``clients`` clients in each clients map, spread over the endpoints (as if learned)."""
    names = sorted(_client_maps(ns))
    lines = []
    for name in names:
        k = int(name.rsplit("/p", 1)[1])
        for start in range(0, clients, 1000):
            pairs = ", ".join(
                f"{_client(i)} : {_pod(i % eps)} . {8000 + k}"
                for i in range(start, min(start + 1000, clients))
            )
            lines.append(f"add element ip nlproxy {name} {{ {pairs} }}")
    _nft(ns, "\n".join(lines) + "\n")
    del ports


def bench_nlproxy(ports: int, eps: int, clients: int, layouts: list[str]) -> None:
    for layout in layouts:
        affinity = "affinity_timeout" in LAYOUTS[layout]
        shape = {"layout": layout, "affinity": affinity, "ports": ports, "endpoints": eps}
        with netns("bench-aff") as ns:
            state = state_with_node()
            state.apply(_other(1))
            kernel = replace(real_kernel(ns), tables=partial(_Tallied, netns=ns))
            syncer = Syncer(CONFIG, kernel)
            try:
                syncer.sync(state.snapshot())
                _timed(syncer, state, _objects(ports, eps, layout=layout), **shape,
                       step="first sync")  # fmt: skip
                if layout == "nlproxy" and clients:
                    _learned(ns, clients, ports, eps)
                    shape["clients_per_port"] = clients
                one = _objects(ports, eps, layout=layout, drop=eps // 2)
                before = _timed(syncer, state, one, **shape, step="one endpoint removed")
                if "clients_per_port" in shape:
                    held = _client_maps(ns).values()
                    stale = sum(ep == _pod(eps // 2) for m in held for ep in m.values())
                    _emit(**shape, step="its clients forgotten", stale_left=stale,
                          clients_left=sum(len(m) for m in held))  # fmt: skip
                after = _timed(syncer, state, _other(2), **shape, step="unrelated change")
                _emit(**shape, step="unrelated change waited", wall_s=round(before + after, 3))
            finally:
                syncer.close()


# ------------------------------------------------------------------------------- map layout

T = "ip affinity"


def _map_base(ports: int) -> Iterator[str]:
    yield "add table ip affinity"
    yield (
        f"add map {T} backends {{ typeof ip daddr . tcp dport . numgen random mod 1 : "
        "ip daddr . tcp dport ; }"
    )
    yield f"add map {T} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; }}"
    yield f"add map {T} affinity-learn {{ type inet_service : verdict ; }}"
    yield f"add chain {T} services"
    yield f"add rule {T} services ip daddr . meta l4proto . th dport vmap @service-ips"
    yield f"add chain {T} nat-prerouting {{ type nat hook prerouting priority -100 ; }}"
    yield f"add rule {T} nat-prerouting jump services"
    yield f"add chain {T} nat-output {{ type nat hook output priority -100 ; }}"
    yield f"add rule {T} nat-output jump services"
    for hook in ("prerouting", "output"):
        yield f"add chain {T} learn-{hook} {{ type filter hook {hook} priority -99 ; }}"
        yield (
            f"add rule {T} learn-{hook} ct state new ct status dnat meta l4proto tcp "
            "ct original proto-dst vmap @affinity-learn"
        )
    del ports


def _map_port(k: int, eps: list[str]) -> Iterator[str]:
    sp, aff, learn = f"service-{k}", f"aff-{k}", f"learn-{k}"
    yield (
        f"add map {T} {aff} {{ type ipv4_addr : ipv4_addr . inet_service ; "
        f"flags dynamic,timeout ; timeout {TIMEOUT}s ; size 65535 ; }}"
    )
    yield f"add chain {T} {sp}"
    yield f"add rule {T} {sp} meta l4proto tcp dnat ip to ip saddr map @{aff}"
    yield (
        f"add rule {T} {sp} meta l4proto tcp dnat ip to ip daddr . tcp dport . "
        f"numgen random mod {len(eps)} map @backends"
    )
    yield f"add chain {T} {learn}"
    yield f"add rule {T} {learn} ct original ip daddr != {VIP} return"
    yield (
        f"add rule {T} {learn} update @{aff} {{ ip saddr timeout {TIMEOUT}s : "
        "ip daddr . th dport }"
    )
    target = 8000 + k
    slots = ", ".join(f"{VIP} . {target} . {i} : {ip} . {target}" for i, ip in enumerate(eps))
    yield f"add element {T} backends {{ {slots} }}"
    yield f"add element {T} service-ips {{ {VIP} . tcp . {target} : goto {sp} }}"
    yield f"add element {T} affinity-learn {{ {target} : goto {learn} }}"


def _map_remove(k: int, eps: list[str], gone: int) -> Iterator[str]:
    """One endpoint goes: the last slot's endpoint moves into its slot (``slots.py``), the last
    slot goes, the DNAT rule's modulus shrinks. (The clients the map holds for it must go too:
    the packet path cannot delete or re-point a map's element, so the sync deletes them.)"""
    target, last = 8000 + k, len(eps) - 1
    yield f"delete element {T} backends {{ {VIP} . {target} . {last} }}"
    yield f"delete element {T} backends {{ {VIP} . {target} . {gone} }}"
    yield f"add element {T} backends {{ {VIP} . {target} . {gone} : {eps[last]} . {target} }}"
    yield f"flush chain {T} service-{k}"
    yield f"add rule {T} service-{k} meta l4proto tcp dnat ip to ip saddr map @aff-{k}"
    yield (
        f"add rule {T} service-{k} meta l4proto tcp dnat ip to ip daddr . tcp dport . "
        f"numgen random mod {last} map @backends"
    )


def _nft(ns: str, text: str) -> tuple[float, float]:
    """Load ``text`` with ``nft -f`` in ``ns``: (wall seconds, the child's system seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=text.encode(), check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_stime - before.ru_stime


def _client(i: int) -> str:
    return f"10.{100 + i // 65536}.{i // 256 % 256}.{i % 256}"


def _map_clients(k: int, eps: list[str], clients: int) -> Iterator[str]:
    """``clients`` clients in port k's map, client i on endpoint i mod N (as learned)."""
    for start in range(0, clients, 1000):
        chunk = range(start, min(start + 1000, clients))
        pairs = ", ".join(f"{_client(i)} : {eps[i % len(eps)]} . {8000 + k}" for i in chunk)
        yield f"add element {T} aff-{k} {{ {pairs} }}"


def _forget(ns: str, ports: int, eps: list[str], gone: int) -> tuple[int, float, float]:
    """Forget, in every port's map, the clients of endpoint ``gone``: (deleted, wall, sys)."""
    table = Table(family=Family.IP, name="affinity")
    aff = (DataType.IPV4_ADDR,), (DataType.IPV4_ADDR, DataType.INET_SERVICE)
    flags = SetFlag.TIMEOUT | SetFlag.EVAL
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    n = 0
    with NftBackend(table, netns=ns) as backend, NetfilterSocket(ns) as sock:
        for k in range(ports):
            m = Map(name=f"aff-{k}", key=aff[0], data=aff[1], flags=flags, timeout=TIMEOUT)
            kept = [(ipaddress.IPv4Address(ip), 8000 + k) for i, ip in enumerate(eps) if i != gone]
            keep = pack_endpoints(m, kept)

            def read(m: Map = m) -> Clients:
                return read_clients(sock, Family.IP, table.name, m)

            n += forget_stale(m, read, backend.apply, keep)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    return n, wall, after.ru_stime - before.ru_stime


def bench_map(ports: int, eps: int, clients: int) -> None:
    shape = {"layout": "map", "affinity": True, "ports": ports, "endpoints": eps}
    ips = [_pod(i) for i in range(eps)]
    first = [*_map_base(ports)]
    for k in range(ports):
        first += _map_port(k, ips)
    change = [line for k in range(ports) for line in _map_remove(k, ips, eps // 2)]
    with netns("bench-affmap") as ns:
        wall, sys_s = _nft(ns, "\n".join(first) + "\n")
        _emit(**shape, step="first sync", commands=len(first), wall_s=round(wall, 3),
              kernel_s=round(sys_s, 3))  # fmt: skip
        wall, sys_s = _nft(ns, "\n".join(change) + "\n")
        _emit(**shape, step="one endpoint removed", commands=len(change), wall_s=round(wall, 3),
              kernel_s=round(sys_s, 3))  # fmt: skip
        if clients:
            held = [line for k in range(ports) for line in _map_clients(k, ips, clients)]
            _nft(ns, "\n".join(held) + "\n")
            n, wall, sys_s = _forget(ns, ports, ips, eps // 2)
            _emit(**shape, step="its stale clients forgotten", clients=clients * ports,
                  deleted=n, wall_s=round(wall, 3), sys_s=round(sys_s, 3))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ports", type=int, default=20)
    ap.add_argument("--endpoints", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=2000, help="clients per port's map")
    ap.add_argument("--only", choices=("nlproxy", "map", *LAYOUTS))
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_affinity: needs root (network namespaces)", file=sys.stderr)
        return 2
    if args.only in (None, "map"):
        bench_map(args.ports, args.endpoints, args.clients)
    layouts = [args.only] if args.only in LAYOUTS else list(LAYOUTS)
    if args.only != "map":
        bench_nlproxy(args.ports, args.endpoints, args.clients, layouts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
