"""The netlink decoding hot paths of two checkouts, side by side, without the kernel.

What ``nlproxy rules`` and ``nlproxy conntrack list`` spend their CPU on once the kernel has
answered: element messages of a 220k-element read-back split into elements
(``readsets._parse_elements`` with learnt layouts), and 100k conntrack flows split out of their
datagrams (``kernel._split``), decoded (``decode_flow``) and written as lines (``LineFormatter``,
per message and per datagram). The same synthetic messages go through each checkout's code, in
a fresh interpreter per run, rounds paired and interleaved; figures are CPU seconds, medians and
ratios (of the medians, the median of each round's ratio, and of the minima), never asserted.

    .venv/bin/python bench/bench_decode.py --base ../other-checkout [--rounds 5]
        [--elements 220000] [--flows 100000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import sys
import time
from collections.abc import Callable
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PER_MESSAGE = 120  # elements per NEWSETELEM message (about a 16 KiB dump buffer's worth)
PER_DATAGRAM = 100


def _nla(kind: int, payload: bytes, nested: bool = False) -> bytes:
    length = 4 + len(payload)
    head = struct.pack("=HH", length, kind | (0x8000 if nested else 0))
    return head + payload + bytes(-length % 4)


def element_messages(count: int) -> list[bytes]:
    """NEWSETELEM payloads of a verdict map keyed by ipv4 . port: a service map's shape."""
    out = []
    for first in range(0, count, PER_MESSAGE):
        elems = b""
        for i in range(first, min(first + PER_MESSAGE, count)):
            key = struct.pack(">I", 0x0A000000 + i) + struct.pack(">H", 80 + i % 7) + b"\0\0"
            verdict = _nla(1, struct.pack(">i", -4)) + _nla(2, f"svc-{i:07d}".encode() + b"\0")
            attrs = _nla(1, _nla(1, key), nested=True)
            attrs += _nla(2, _nla(2, verdict, nested=True), nested=True)
            elems += _nla(1, attrs, nested=True)
        payload = struct.pack("=BBH", 2, 0, 0) + _nla(1, b"t\0") + _nla(2, b"m\0")
        out.append(payload + _nla(3, elems, nested=True))
    return out


def flow_datagrams(messages: Any, count: int) -> tuple[list[bytes], list[bytes]]:
    """``count`` TCP flows as dump datagrams (seq 1) and as payloads."""
    flows = [
        messages.Flow(
            orig=messages.FlowTuple(
                IPv4Address(0x0A010000 + i), IPv4Address("10.96.0.10"), 6, 1024 + i % 60000, 80
            ),
            reply=messages.FlowTuple(
                IPv4Address(0x0A020000 + i % 500), IPv4Address(0x0A010000 + i), 6, 8080,
                1024 + i % 60000,
            ),
            timeout=300,
            status=0x18E,
            mark=0,
        )
        for i in range(count)
    ]  # fmt: skip
    framed = [messages.encode_new(f, 1) for f in flows]
    payloads = [m[16:] for m in framed]
    datagrams = [b"".join(framed[i : i + PER_DATAGRAM]) for i in range(0, count, PER_DATAGRAM)]
    return datagrams, payloads


def timed(fn: Callable[[], object]) -> float:
    """CPU seconds of ``fn()``: on a shared machine less noisy than wall time, and these paths
    do no I/O."""
    start = time.process_time()
    fn()
    return time.process_time() - start


def one_run(elements: int, flows: int) -> dict[str, float]:
    """Time each hot path once with the nlproxy found on sys.path."""
    from nlproxy.conntrack import kernel, messages
    from nlproxy.nft import readsets

    try:  # a checkout with the line layouts beside the codec
        from nlproxy.conntrack.lines import LineFormatter
    except ImportError:  # an older one: they were in the codec's module
        LineFormatter = messages.LineFormatter

    elems = element_messages(elements)
    datagrams, payloads = flow_datagrams(messages, flows)

    def parse_elements() -> None:
        layouts: dict[int, list[Any]] = {}
        n = sum(len(readsets._parse_elements(m, layouts)) for m in elems)
        assert n == elements

    def split() -> None:
        n = sum(len(kernel._split(d, 1, None)[0]) for d in datagrams)
        assert n == flows

    def decode() -> None:
        for p in payloads:
            messages.decode_flow(p)

    def lines() -> None:
        fmt = LineFormatter()
        for p in payloads:
            fmt.line(p)

    def datagram_lines() -> None:
        fmt = LineFormatter()
        fmt.line(payloads[0])
        n = sum(len(fmt.datagram(d) or ()) for d in datagrams)
        assert n == flows

    return {
        "parse_elements": timed(parse_elements),
        "split": timed(split),
        "decode_flow": timed(decode),
        "line": timed(lines),
        "datagram_lines": timed(datagram_lines),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="the other checkout")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--elements", type=int, default=220_000)
    ap.add_argument("--flows", type=int, default=100_000)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one_run(args.elements, args.flows)))
        return 0
    sys.path.append(str(REPO))
    from bench import checkout_run

    sizes = ["--elements", str(args.elements), "--flows", str(args.flows)]
    trees = {"base": args.base.resolve(), "this": REPO}
    checkout_run.prepare(trees.values())
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for r in range(args.rounds):
        # paired rounds, the order alternating: a load that comes and goes hits both sides
        for name, tree in sorted(trees.items(), reverse=r % 2 == 1):
            argv = [Path(__file__).resolve(), "--base", tree, "--one", *sizes]
            runs[name].append(checkout_run.json_result("bench_decode", tree, argv, path=[tree]))
    for path in runs["this"][0]:
        base = statistics.median(r[path] for r in runs["base"])
        this = statistics.median(r[path] for r in runs["this"])
        print(
            json.dumps(
                {
                    "bench": "decode",
                    "path": path,
                    "elements": args.elements,
                    "flows": args.flows,
                    "rounds": args.rounds,
                    "base_s": round(base, 4),
                    "this_s": round(this, 4),
                    "ratio": round(this / base, 3),
                    "ratio_paired": round(
                        statistics.median(
                            t[path] / b[path]
                            for t, b in zip(runs["this"], runs["base"], strict=True)
                        ),
                        3,
                    ),
                    "ratio_of_minima": round(
                        min(r[path] for r in runs["this"]) / min(r[path] for r in runs["base"]), 3
                    ),
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
