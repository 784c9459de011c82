"""Shape element operations for the kernel: group them into runs, expand intervals.

Sits under the encoder: ``encode.py``'s :class:`~nlproxy.nft.encode.Batch` groups a stretch of
element operations with :func:`element_runs` (each run becomes bulk NEWSETELEM/DELSETELEM
messages) and turns interval keys into the elements nft sends with :func:`interval_elements`.
Pure: no I/O, no libnftnl; it never reorders operations on one set, and never decides what to
program.
"""

from __future__ import annotations

from collections.abc import Sequence
from ipaddress import IPv4Address, IPv6Address

from nlproxy.nft.ir import DataType, Element, Map, Operation, SetLike, Value, Verb
from nlproxy.nft.uapi import NFT_SET_ELEM_INTERVAL_END
from nlproxy.nft.values import Packer, interval_bounds, interval_last


def element_runs(ops: Sequence[Operation], start: int, stop: int) -> list[tuple[Verb, list[int]]]:
    """Group the element operations ``ops[start:stop]`` into runs that can share messages.

    A run is one set and one verb. Operations on different sets are independent, so a run
    collects its set's operations from the whole stretch; a set's run ends where its verb
    changes (delete then add of the same key must stay in that order). Runs come out in the
    order of their first operation.
    """
    runs: list[tuple[Verb, list[int]]] = []
    current: dict[str, tuple[Verb, list[int]]] = {}
    for k in range(start, stop):
        op = ops[k]
        assert isinstance(op.obj, Element)
        run = current.get(op.obj.set)
        if run is None or run[0] is not op.verb:
            run = current[op.obj.set] = (op.verb, [])
            runs.append(run)
        run[1].append(k)
    return runs


def interval_elements(
    s: SetLike, els: Sequence[Element], ops: Sequence[int], packer: Packer
) -> tuple[list[Element], list[int], bytes | None, list[int] | None]:
    """Interval keys as nft sends them.

    A single-part key becomes two kernel elements: the start, and one past the end flagged
    NFT_SET_ELEM_INTERVAL_END (left out when the range reaches the top of the address
    space). A concatenation keeps one element with NFTA_SET_ELEM_KEY_END, the inclusive end.

    Args:
        s: the interval set.
        els: its elements, in order.
        ops: the operation index behind each element.
        packer: packs ``s``'s keys (for the key ends of a concatenation).

    Returns:
        (kernel elements, the operation behind each, packed key ends or None, each element's
        flags or None).
    """
    if len(s.key) > 1:
        ends = [tuple(interval_last(v) for v in el.key) for el in els]
        return list(els), list(ops), bytes(packer.pack_many(ends)), None
    out: list[Element] = []
    out_ops: list[int] = []
    flags: list[int] = []
    for el, op in zip(els, ops, strict=True):
        first, after = interval_bounds(s.key[0], el.key[0])
        out.append(
            Element(
                set=el.set, key=(first,), value=el.value, timeout=el.timeout, comment=el.comment
            )
        )
        out_ops.append(op)
        flags.append(0)
        if after is not None:
            out.append(Element(set=el.set, key=(after,)))
            out_ops.append(op)
            flags.append(NFT_SET_ELEM_INTERVAL_END)
    return out, out_ops, None, flags


def zero_row(s: SetLike, zero: tuple[int, ...]) -> tuple[Value, ...]:
    """Placeholder data for an interval's closing element (the C side does not send it)."""
    assert isinstance(s, Map)
    return (
        tuple(
            IPv4Address(0)
            if dt is DataType.IPV4_ADDR
            else IPv6Address(0)
            if dt is DataType.IPV6_ADDR
            else 0
            for dt in s.data
        )
        or zero
    )
