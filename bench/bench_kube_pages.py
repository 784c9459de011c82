"""A list of S Services and their EndpointSlices, in pages of 500, with and without the next
page requested while the current one is decoded (``list_kind(..., ahead=...)``), side by side,
and the floor: a bare client that fetches the same pages through the same HTTP client and reads
only their continue tokens (``bare``: the server's work, HTTP, no decoding of the objects).

The in-repo API server (``tests/kube``, realistic bodies) runs in a child process, as a real
API server would be another process: in this one it would share the interpreter lock with the
decoding and hide any overlap. Rounds alternate the two ways; prints JSON lines, one per kind
and way with the median and spread of the rounds, then the ratio, with the load average.

    .venv/bin/python bench/bench_kube_pages.py [--services 10000] [--endpoints 10] [--rounds 5]
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
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nlproxy.cluster.kube import api_client_from_config, kinds  # noqa: E402
from nlproxy.cluster.kube_http import (  # noqa: E402
    LIST_READ_TIMEOUT,
    Http,
    KindSpec,
    list_kind,
)
from tests.kube import scale  # noqa: E402

PAGE = 500
SERVER = """\
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tests.kube import scale
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import TOKEN, write_kubeconfig
api = ApiServer(token=TOKEN)
scale.populate(api, int(sys.argv[3]), int(sys.argv[4]))
api.start()
print(write_kubeconfig(Path(sys.argv[2]), api), flush=True)
sys.stdin.read()
api.stop()
"""


class _Meta(msgspec.Struct):
    continue_: str = msgspec.field(default="", name="continue")


class _Envelope(msgspec.Struct):
    metadata: _Meta


_ENVELOPE = msgspec.json.Decoder(_Envelope)


def bare_list(http: Http, spec: KindSpec, page_size: int) -> int:
    """Fetch every page of ``spec`` as ``list_kind`` does, decoding only the continue token
    (msgspec skips the items without building anything); the pages' bytes."""
    cont, total = "", 0
    while True:
        params = [*spec.params(), ("limit", str(page_size))]
        if cont:
            params.append(("continue", cont))
        raw = http.get(spec, params, LIST_READ_TIMEOUT)
        try:
            data = raw.read()
        finally:
            raw.release_conn()
        total += len(data)
        cont = _ENVELOPE.decode(data).metadata.continue_
        if not cont:
            return total


def emit(**fields: object) -> None:
    print(json.dumps({"bench": "kube_pages", **fields}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--services", type=int, default=10_000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nlpb-pages-") as tmp:
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(ROOT), f"{tmp}/kc",
             str(args.services), str(args.endpoints)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert server.stdout is not None
        assert server.stdin is not None
        try:
            kubeconfig = server.stdout.readline().strip()
            client = api_client_from_config(kubeconfig)
            http = Http(client)
            loads = []
            for spec in kinds(scale.NODE)[:2]:
                runs: dict[bool, list[float]] = {False: [], True: []}
                bare: list[float] = []
                for r in range(args.rounds + 1):  # the first round warms up
                    loads.append(os.getloadavg()[0])
                    started = time.perf_counter()
                    size = bare_list(http, spec, PAGE)
                    if r:
                        bare.append(time.perf_counter() - started)
                    for ahead in (False, True):
                        started = time.perf_counter()
                        listing = list_kind(http, spec, PAGE, ahead=ahead)
                        took = time.perf_counter() - started
                        if len(listing.changes) != args.services:
                            raise RuntimeError(f"{spec.kind}: {len(listing.changes)} objects")
                        del listing
                        if r:
                            runs[ahead].append(took)
                emit(
                    kind=spec.kind,
                    bare=True,
                    objects=args.services,
                    mbytes=round(size / 1e6, 1),
                    seconds=round(statistics.median(bare), 3),
                    min_s=round(min(bare), 3),
                    max_s=round(max(bare), 3),
                )
                for ahead, times in runs.items():
                    emit(
                        kind=spec.kind,
                        next_page_ahead=ahead,
                        objects=args.services,
                        pages=-(-args.services // PAGE),
                        seconds=round(statistics.median(times), 3),
                        min_s=round(min(times), 3),
                        max_s=round(max(times), 3),
                    )
                emit(
                    kind=spec.kind,
                    one_by_one_over_bare=round(
                        statistics.median(runs[False]) / statistics.median(bare), 2
                    ),
                    ahead_over_bare=round(
                        statistics.median(runs[True]) / statistics.median(bare), 2
                    ),
                    ahead_over_one_by_one=round(
                        statistics.median(runs[True]) / statistics.median(runs[False]), 2
                    ),
                    load1_min=round(min(loads), 2),
                    load1_max=round(max(loads), 2),
                )
            client.close()
        finally:
            server.stdin.close()
            server.wait(timeout=60)


if __name__ == "__main__":
    main()
