"""Stable backends slots: an endpoint keeps its index while it stays, so a change costs O(1).

Sits inside the planner. Random choice reads ``backends*`` elements keyed by the frontend and
an index 0..N-1 (``numgen random mod N``). Filled in sorted order, removing one endpoint would
shift every index after it: a 1,000-endpoint port rewrites about 1,000 elements per frontend for
one endpoint. So when the planner knows the order a frontend's endpoints were given last time
(the previous plan's fragment, or the map read back from the kernel after a restart), it keeps
every remaining endpoint in its slot and moves the last ones into the freed slots; new endpoints
take the slots left, in sorted order. Each endpoint still holds exactly one of the N slots, so
the choice stays uniform; one endpoint going costs two element changes per frontend (its slot
takes the last endpoint, the last slot goes), one coming costs one.

The order then depends on history, not only on the inputs: a cold plan of the same snapshot
is sorted. :func:`slot_token` names every frontend not in sorted order, so whoever records
"the kernel holds the plan of these inputs" (the restart fingerprint) can tell that a cold plan
would not reproduce the kernel's slots. Pure: no I/O, clock or logging.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from nlproxy.nft.packed import PackedElements, index_bytes


def keep_slots(prior: Sequence[bytes], canonical: tuple[bytes, ...]) -> tuple[bytes, ...]:
    """``canonical`` (the packed endpoints in sorted order) arranged to keep ``prior``'s slots.

    Args:
        prior: the packed endpoints by slot as they were (may hold gone ones).
        canonical: the packed endpoints now, each once, sorted.

    Returns:
        A permutation of ``canonical``: an endpoint of ``prior`` at a slot below the new count
        keeps it; the freed slots take, in order, the endpoints of ``prior`` from slots past
        the new count (the last ones), then the new endpoints in sorted order.
    """
    if len(prior) == len(canonical) and (prior == canonical or set(prior) == set(canonical)):
        return tuple(prior)
    count = len(canonical)
    wanted = set(canonical)
    slots: list[bytes | None] = [d if d in wanted else None for d in prior[:count]]
    slots += [None] * (count - len(slots))
    placed = {d for d in slots if d is not None}
    movers = [d for d in prior[count:] if d in wanted]
    placed.update(movers)
    fill = iter([*movers, *(d for d in canonical if d not in placed)])
    return tuple(d if d is not None else next(fill) for d in slots)


def read_slots(held: object, head: bytes, packer: PackedElements) -> tuple[bytes, ...]:
    """The data of ``head``'s elements at index 0, 1, ... up to the first missing one, from a
    map as programmed (packed, or a mapping of key tuples to elements, packed by ``packer``,
    the planner's own store of that map); empty when there is no such map."""
    out: list[bytes] = []
    if isinstance(held, PackedElements):
        raw = held.raw
        while (data := raw.get(head + index_bytes(len(out)))) is not None:
            out.append(data)
    elif isinstance(held, Mapping):
        while (el := held.get(packer.decode_key(head + index_bytes(len(out))))) is not None:
            out.append(packer.pack_data(el))
    return tuple(out)


def slot_token(shuffled: Mapping[tuple[str, str, bytes], tuple[bytes, ...]]) -> str:
    """A digest of every frontend whose slots are not in sorted order ("" when none is).

    Args:
        shuffled: (family, map, key head) → the packed endpoints by slot.
    """
    if not shuffled:
        return ""
    h = hashlib.blake2b(digest_size=16)
    for ident in sorted(shuffled):
        family, name, head = ident
        h.update(f"{family} {name} {head.hex()}:".encode())
        h.update(b"".join(shuffled[ident]))
        h.update(b";")
    return h.hexdigest()


def with_slots(digest: str, token: str) -> str:
    """``digest`` (of a plan's inputs) as it is to be recorded for a plan whose slots are
    ``token``: itself when every frontend is in sorted order, else another 64-digit digest
    that a cold plan of the same inputs does not match."""
    if not token:
        return digest
    return hashlib.blake2b(f"{digest} slots {token}".encode(), digest_size=32).hexdigest()
