"""What the kernel's time per element of a large map owes to its size hint: the lean shape
(``bench_commit.nft_text``) loaded by ``nft -f`` into a fresh namespace, its ``backends`` map
declared without a size (as nlproxy declares its named maps today) and with ``size N`` (N its
element count: ``NFTA_SET_DESC_SIZE``, from which the kernel sizes the hash table at once
instead of growing it during the commit), alternating, at each ``--services``.

Prints one JSON line per load: wall, user and system seconds of ``nft``, system microseconds per
element, the load average and the host's ``NFNLGRP_NFTABLES`` members (one anywhere makes every
commit pay a message per element: such rows are not comparable).

    .venv/bin/python bench/bench_set_size.py --services 10000,40000 --rounds 2
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_commit import nft_text
from bench.listeners import nftables_listeners
from tests.netns import namespace


def load(text: str) -> dict[str, float]:
    with tempfile.NamedTemporaryFile("w", suffix=".nft", delete=False) as f:
        f.write(text)
    try:
        with namespace("nlpss") as ns:
            r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
            subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", f.name], check=True)
            t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        os.unlink(f.name)
    return {
        "wall_s": round(t1 - t0, 3),
        "user_s": round(r1.ru_utime - r0.ru_utime, 3),
        "sys_s": round(r1.ru_stime - r0.ru_stime, 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--services", default="10000,40000", help="sizes, comma-separated")
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    for services in (int(s) for s in args.services.split(",")):
        plain = nft_text(services, args.endpoints)
        elements = services * (args.endpoints + 1)
        backends = services * args.endpoints
        sized = plain.replace("map backends { typeof", f"map backends {{ size {backends}; typeof")
        for rnd in range(args.rounds):
            for variant, text in (("no_size", plain), ("size", sized)):
                listeners = nftables_listeners()
                t = load(text)
                rec = {
                    "bench": "set_size",
                    "services": services,
                    "endpoints": args.endpoints,
                    "variant": variant,
                    "round": rnd,
                    **t,
                    "sys_us_per_element": round(t["sys_s"] / elements * 1e6, 2),
                    "nftables_listeners": max(listeners, nftables_listeners()),
                    "loadavg": [round(x, 2) for x in os.getloadavg()],
                }
                print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
