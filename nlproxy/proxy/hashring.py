"""Consistent-hash lookup tables: which endpoint each slot of a consistent-hash port sends to.

Sits inside the planner, under ``balance.py``, which puts the table in the port's map (slot →
endpoint) and hashes the client into a slot with ``jhash … mod M seed S``. The kernel scales the
32-bit hash into ``[0, M)`` by ``reciprocal_scale``, so slot s holds the hashes from
⌈s·2³²/M⌉ up to the next slot's first. A hash ring over those same 32 bits fills the table:
every endpoint puts :data:`POINTS` points on it, derived from its address and port alone
(SHAKE-128), and a slot goes to the endpoint of the first point at or after the slot's first
hash (wrapping round). So the table depends only on the set of endpoints (never on the node
or the order they were listed in), and when an endpoint comes or goes only the slots it takes
or held change hands: one endpoint more or less moves its own share of the clients and no
others' (about 1/(N+1); at most 0.61 of 2/(N+1) measured for N = 1…64, bench/bench_lb.py). An
endpoint's share varies with where its points fall: within 1.4 times the mean for N up to 65.

Maglev's permutation tables, used before, balance to one slot but move more than their own
share (1.07 times 2/(N+1) at N = 64 with 8191 slots), and their size had to follow the endpoint
count, so every power of two crossed reshuffled most clients.

Table size M (:func:`table_size`): 4096 for up to 128 endpoints (so an endpoint added or
removed never resizes a table below that), 16384 up to 512, 65536 beyond: a change across 128
or 512 resizes the table and moves most clients. Pure: no I/O, clock or logging; deterministic.
"""

from __future__ import annotations

import hashlib
import struct
from bisect import bisect_left
from collections.abc import Sequence

from nlproxy.cluster.model import Service
from nlproxy.proxy.endpoints import Backend

POINTS = 128
"""Points per endpoint on the ring: more spread shares more evenly (1.53 times the mean at 64,
1.39 at 128, 1.37 at 256 for N up to 65) and costs a little more to plan."""
_WORDS = struct.Struct(f">{POINTS}I")
TIERS = ((128, 4096), (512, 16384))
"""(most endpoints, table size); more than the last: :data:`MAX_TABLE`."""
MAX_TABLE = 65536
"""The bound on a table's elements (and the modulus)."""


def table_size(count: int) -> int:
    """The table size M for ``count`` endpoints (see the module docstring)."""
    return next((size for most, size in TIERS if count <= most), MAX_TABLE)


def _points(b: Backend) -> tuple[int, ...]:
    """An endpoint's points: 32-bit words of SHAKE-128 of its address and port (one call)."""
    ip, port = b
    return _WORDS.unpack(hashlib.shake_128(f"{ip}/{port}".encode()).digest(4 * POINTS))


def lookup_table(backends: Sequence[Backend], size: int) -> list[int]:
    """For each of ``size`` slots, the index in ``backends`` of its endpoint.

    ``backends`` must be in a canonical order (the planner's: by address and port): two
    endpoints whose points coincide are told apart by it.
    """
    if not backends:
        return []
    # Each point with its endpoint's index in the low bits: one sort of ints, not of tuples.
    bits = max(len(backends) - 1, 1).bit_length()
    ring = sorted([(p << bits) | i for i, b in enumerate(backends) for p in _points(b)])
    mask = (1 << bits) - 1
    hashes = [x >> bits for x in ring]
    owners = [x & mask for x in ring]
    owners.append(owners[0])  # past the last point: round to the first
    # Slot s's first hash, rounded up: the kernel's reciprocal_scale sends h to (h * size) >> 32.
    return [owners[bisect_left(hashes, -(-(s << 32) // size))] for s in range(size)]


def default_seed(svc: Service) -> int:
    """The hash seed of a Service when none is configured: from its UID, which every node sees
    the same (from its namespace/name when it has none, as manifests may not)."""
    text = svc.uid or str(svc.key)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big")
