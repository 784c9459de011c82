"""Bulk validation of element additions: one pass per key column instead of one per element.

Sits under ``validate.py``: for a run of element additions to one set (a cold sync adds 200k
elements to a few maps), :func:`elements_ok` checks types and ranges column by column with
C-level ``map``/``min``/``max``. It only ever says "all of these are fine"; when it cannot say
so, ``validate.py`` checks the run element by element, so messages always come from there and
name the offending element. It must not raise, and must never pass what the full check rejects.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from operator import attrgetter, itemgetter

from nlproxy.nft.ir import DataType, Element, Map, Operation, SetFlag, SetLike, Value, Verdict

_KEY, _VALUE = attrgetter("key"), attrgetter("value")
_TIMEOUT, _COMMENT = attrgetter("timeout"), attrgetter("comment")
_ADDRESS_TYPES = {
    (DataType.IPV4_ADDR, False): frozenset({IPv4Address}),
    (DataType.IPV4_ADDR, True): frozenset({IPv4Address, IPv4Network}),
    (DataType.IPV6_ADDR, False): frozenset({IPv6Address}),
    (DataType.IPV6_ADDR, True): frozenset({IPv6Address, IPv6Network}),
}


def run_end(ops: Sequence[Operation], start: int) -> int:
    """The end of the run of element operations with the verb and set of ``ops[start]``."""
    first = ops[start]
    verb, name = first.verb, first.obj.set  # type: ignore[union-attr]
    end = start + 1
    while end < len(ops):
        op = ops[end]
        obj = op.obj
        if op.verb is not verb or obj.__class__ is not Element or obj.set != name:
            break
        end += 1
    return end


def elements_ok(
    s: SetLike,
    els: Sequence[Element],
    *,
    ranges: dict[DataType, int],
    chains: AbstractSet[str],
    comment_max: int,
) -> bool:
    """Whether every element of ``els`` (all of set ``s``, being added) is certainly valid.

    Args:
        s: the set, as the transaction sees it.
        els: its elements; ``Element`` instances only.
        ranges: the largest value of each integer datatype.
        chains: the chains visible to the transaction (verdict-map jump targets).
        comment_max: the longest comment in bytes (checked on 4 bytes per character).
    """
    if set(map(_TIMEOUT, els)) != {None}:
        return False
    if max(map(len, map(_COMMENT, els))) * 4 > comment_max:
        return False
    interval = bool(s.flags & SetFlag.INTERVAL)
    if not _columns_ok(s.key, list(map(_KEY, els)), interval, ranges):
        return False
    values = list(map(_VALUE, els))
    if not isinstance(s, Map):
        return set(map(type, values)) == {type(None)}
    if s.is_vmap:
        if set(map(type, values)) != {Verdict}:
            return False
        targets = {v.chain for v in values if isinstance(v, Verdict)}
        return targets - {None} <= chains
    # tuples, or a tuple type such as the planner's (address, port) Backend pairs
    if not all(issubclass(t, tuple) for t in set(map(type, values))):
        return False
    return _columns_ok(s.data, values, False, ranges)


def _columns_ok(
    types: tuple[DataType, ...],
    rows: list[tuple[Value, ...]],
    interval: bool,
    ranges: dict[DataType, int],
) -> bool:
    if set(map(len, rows)) != {len(types)}:
        return False
    # Column by column with itemgetter (C speed); zip(*rows) would first build one call with
    # 100k arguments.
    return all(
        _column_ok(dt, map(itemgetter(i), rows), interval, ranges) for i, dt in enumerate(types)
    )


def _column_ok(
    dt: DataType, col: Iterable[object], interval: bool, ranges: dict[DataType, int]
) -> bool:
    allowed = _ADDRESS_TYPES.get((dt, interval))
    if allowed is not None:
        return set(map(type, col)) <= allowed
    if dt not in ranges:
        return False
    values = list(col)
    kinds = set(map(type, values))  # int, or an IntEnum such as L4Proto; never bool
    if not all(issubclass(k, int) and k is not bool for k in kinds):
        return False
    return min(values) >= 0 and max(values) <= ranges[dt]  # type: ignore[type-var, operator]
