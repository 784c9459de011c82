"""Maglev lookup tables: which endpoint each slot of a consistent-hash service port sends to.

Sits inside the planner, under ``balance.py``, which puts the table in the port's map (slot →
endpoint) and hashes the client into a slot with ``jhash … mod M seed S``. Maglev's permutation
method (Eisenbud et al., NSDI 2016): every endpoint has its own permutation of the slots, derived
from its address and port alone, and the endpoints take turns claiming their next free preferred
slot until the table is full. So the table depends only on the set of endpoints (never on the
node or the order they were listed in), each endpoint gets M/N slots give or take one, and when
one of N endpoints goes, its slots are shared out and few others move (about 1/N of the clients
move in all, plus a small excess).

Table size M: the smallest prime at least 400 times the endpoint count rounded up to a power of
two (401 for 1, 809 for 2, 1601 for 3-4, 3203 for 5-8, 6421 for 9-16, ... 51203 for 65-128), at
most 65521. Rounding to a power of two keeps M, and so every client's slot, unchanged while the
count varies within the same power of two; crossing one resizes the table and moves most
clients, as any change of modulus must. 400 rather than Maglev's minimum of 100: Maglev's excess
over 1/N shrinks as M/N grows, and with 100-135 slots per endpoint it measured up to 5.8% for
small N (N = 6..16), against at most 1.6% with 400 (N up to 128, bench/bench_lb.py).
Beyond 163 endpoints M stays 65521 (fewer slots each; at least 100 up to 655 endpoints), which
bounds the elements of a table. Pure: no I/O, clock or logging; deterministic.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache

from nlproxy.cluster.model import Service
from nlproxy.proxy.endpoints import Backend

SLOTS_PER_ENDPOINT = 400
MAX_TABLE = 65521
"""The largest prime below 2**16: the bound on a table's elements (and the modulus)."""


def _is_prime(n: int) -> bool:
    if n < 2 or n % 2 == 0:
        return n == 2
    return all(n % d for d in range(3, int(n**0.5) + 1, 2))


@lru_cache(maxsize=64)
def table_size(count: int) -> int:
    """The table size M for ``count`` endpoints (see the module docstring)."""
    rounded = 1 << max(count - 1, 0).bit_length()
    m = SLOTS_PER_ENDPOINT * rounded
    if m >= MAX_TABLE:
        return MAX_TABLE
    while not _is_prime(m):
        m += 1
    return m


def _preference(b: Backend, size: int) -> tuple[int, int]:
    """An endpoint's permutation of the slots, as (offset, skip): slot j is offset + j·skip."""
    ip, port = b
    digest = hashlib.blake2b(f"{ip}/{port}".encode(), digest_size=8).digest()
    h1, h2 = int.from_bytes(digest[:4], "big"), int.from_bytes(digest[4:], "big")
    return h1 % size, h2 % (size - 1) + 1


def lookup_table(backends: Sequence[Backend], size: int) -> list[int]:
    """Maglev's population: for each slot, the index in ``backends`` of its endpoint.

    ``backends`` must be in a canonical order (the planner's: by address and port), since ties
    go to the endpoint listed first; ``size`` must be a prime, so each permutation visits every
    slot.
    """
    if not backends:
        return []
    prefs = [_preference(b, size) for b in backends]
    nxt = [0] * len(backends)
    table = [-1] * size
    filled = 0
    while True:
        for i, (offset, skip) in enumerate(prefs):
            c = (offset + nxt[i] * skip) % size
            while table[c] >= 0:
                nxt[i] += 1
                c = (offset + nxt[i] * skip) % size
            table[c] = i
            nxt[i] += 1
            filled += 1
            if filled == size:
                return table


def default_seed(svc: Service) -> int:
    """The hash seed of a Service when none is configured: from its UID, which every node sees
    the same (from its namespace/name when it has none, as manifests may not)."""
    text = svc.uid or str(svc.key)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big")
