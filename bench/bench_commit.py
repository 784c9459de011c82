"""Encode + commit 10k services' worth of nftables objects, side by side with ``nft -f``.

The shape is DESIGN.md's lean one: one ``backends`` map (service endpoints: ``ipv4_addr .
inet_proto . inet_service . mark`` -> ``ipv4_addr . inet_service``), one service verdict map
(``... : goto lbN``), chains ``lbN`` that DNAT through ``numgen random mod N``, and two base chains.
Each variant loads into its own fresh network namespace. Prints JSON lines: the IR build time,
the encode-only time (no kernel), NftBackend's commit and nft -f's load (wall, user, sys seconds,
objects/s, messages/s) and their ratios.

Usage: ``.venv/bin/python bench/bench_commit.py [--services 10000] [--endpoints 10]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nlproxy.nft.backend import NftBackend
from nlproxy.nft.encode import Batch
from nlproxy.nft.ir import (
    PRIORITY_DSTNAT,
    Chain,
    ChainType,
    DataType,
    DnatMap,
    Element,
    Family,
    Field,
    Hook,
    L4Proto,
    Map,
    Numgen,
    Operation,
    Policy,
    Rule,
    Table,
    Verb,
    VMap,
    goto,
)
from nlproxy.nft.validate import validate
from tests.netns import namespace as netns

TABLE = Table(family=Family.IP, name="nlproxy")
KEY = (Field.IP_DADDR, Field.META_L4PROTO, Field.TH_DPORT)
SVC_BASE = 0x0A600000  # 10.96.0.0
POD_BASE = 0x0AF40000  # 10.244.0.0


def plan(services: int, endpoints: int) -> list[Operation]:
    """The transaction: every object of the lean shape for ``services`` x ``endpoints``."""
    backends = Map(
        name="backends",
        key=(DataType.IPV4_ADDR, DataType.INET_PROTO, DataType.INET_SERVICE, DataType.MARK),
        data=(DataType.IPV4_ADDR, DataType.INET_SERVICE),
    )
    svc = Map(
        name="service-ips",
        key=(DataType.IPV4_ADDR, DataType.INET_PROTO, DataType.INET_SERVICE),
        data=(DataType.VERDICT,),
    )
    objs: list[Any] = [TABLE, backends, svc]
    for n in range(1, endpoints + 1):
        objs.append(Chain(name=f"lb{n}"))
        objs.append(Rule(chain=f"lb{n}", exprs=(DnatMap((*KEY, Numgen(n)), "backends"),)))
    for hook, name in ((Hook.PREROUTING, "nat-prerouting"), (Hook.OUTPUT, "nat-output")):
        objs.append(Chain(name=name, type=ChainType.NAT, hook=hook, priority=PRIORITY_DSTNAT,
                          policy=Policy.ACCEPT))  # fmt: skip
        objs.append(Rule(chain=name, exprs=(VMap(KEY, "service-ips"),)))
    pod = POD_BASE
    for i in range(services):
        vip = IPv4Address(SVC_BASE + i)
        objs.append(Element(set="service-ips", key=(vip, L4Proto.TCP, 80),
                            value=goto(f"lb{endpoints}")))  # fmt: skip
        for j in range(endpoints):
            objs.append(Element(set="backends", key=(vip, L4Proto.TCP, 80, j),
                                value=(IPv4Address(pod), 8080)))  # fmt: skip
            pod += 1
    return [Operation(Verb.ADD, o) for o in objs]


def nft_text(services: int, endpoints: int) -> str:
    """The same objects as nft text (``typeof`` for the numgen key: nft's parser wants it)."""
    out = [
        f"table ip {TABLE.name} {{",
        "  map backends { typeof ip daddr . meta l4proto . th dport . numgen random mod 2 :"
        " ip daddr . th dport; }",
        "  map service-ips { type ipv4_addr . inet_proto . inet_service : verdict; }",
    ]
    out += [
        f"  chain lb{n} {{ dnat ip to ip daddr . meta l4proto . th dport . "
        f"numgen random mod {n} map @backends; }}"
        for n in range(1, endpoints + 1)
    ]
    for hook, name in (("prerouting", "nat-prerouting"), ("output", "nat-output")):
        out.append(f"  chain {name} {{ type nat hook {hook} priority -100; policy accept; "
                   "ip daddr . meta l4proto . th dport vmap @service-ips; }")  # fmt: skip
    out.append("}")
    svc, back = [], []
    pod = POD_BASE
    for i in range(services):
        vip = IPv4Address(SVC_BASE + i)
        svc.append(f"{vip} . tcp . 80 : goto lb{endpoints}")
        for j in range(endpoints):
            back.append(f"{vip} . tcp . 80 . {j} : {IPv4Address(pod)} . 8080")
            pod += 1
    out.append(f"add element ip {TABLE.name} service-ips {{ {', '.join(svc)} }}")
    out.append(f"add element ip {TABLE.name} backends {{ {', '.join(back)} }}")
    return "\n".join(out) + "\n"


def measure(who: int, fn: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    """Run ``fn``; wall time and the user/sys time of ``who`` (RUSAGE_SELF or _CHILDREN)."""
    r0, t0 = resource.getrusage(who), time.perf_counter()
    result = fn()
    t1, r1 = time.perf_counter(), resource.getrusage(who)
    return result, {
        "wall_s": round(t1 - t0, 4),
        "user_s": round(r1.ru_utime - r0.ru_utime, 4),
        "sys_s": round(r1.ru_stime - r0.ru_stime, 4),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--services", type=int, default=10_000)
    ap.add_argument("--endpoints", type=int, default=10)
    args = ap.parse_args()
    size = {"services": args.services, "endpoints": args.endpoints}

    ops, t = measure(resource.RUSAGE_SELF, lambda: plan(args.services, args.endpoints))
    objects = len(ops)
    print(json.dumps({"bench": "build_ir", **size, "objects": objects, **t}))

    def encode_only() -> int:
        validate(TABLE, ops)
        batch = Batch(TABLE, {}, 1)
        batch.add(ops)
        batch.finish()
        return batch.messages

    messages, t = measure(resource.RUSAGE_SELF, encode_only)
    enc = {"bench": "encode_only", **size, "objects": objects, "messages": messages, **t}
    enc["objects_per_s"] = round(objects / t["wall_s"])
    print(json.dumps(enc))

    with netns("nlproxy") as ns, NftBackend(TABLE, netns=ns) as backend:
        result, ours = measure(resource.RUSAGE_SELF, lambda: backend.apply(ops))
    ours = {"bench": "nlproxy_commit", **size, "objects": objects,
            "messages": result.messages, **ours}  # fmt: skip
    ours["messages_per_s"] = round(result.messages / ours["wall_s"])
    ours["objects_per_s"] = round(objects / ours["wall_s"])
    print(json.dumps(ours))

    with tempfile.NamedTemporaryFile("w", suffix=".nft", delete=False) as f:
        f.write(nft_text(args.services, args.endpoints))
    try:
        with netns("nft") as ns:
            cmd = ["ip", "netns", "exec", ns, "nft", "-f", f.name]
            _, theirs = measure(resource.RUSAGE_CHILDREN, lambda: subprocess.run(cmd, check=True))
    finally:
        os.unlink(f.name)
    theirs = {"bench": "nft_f", **size, "objects": objects, **theirs}
    theirs["objects_per_s"] = round(objects / theirs["wall_s"])
    print(json.dumps(theirs))
    ratio = {
        "bench": "ratio_nft_f_over_nlproxy",
        **size,
        **{k: round(theirs[k] / max(ours[k], 1e-6), 2) for k in ("wall_s", "user_s", "sys_s")},
    }
    print(json.dumps(ratio))
    return 0


if __name__ == "__main__":
    sys.exit(main())
