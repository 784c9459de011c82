"""Per-service fragments of a plan: what each service added, so it can be replayed.

Sits inside the planner. Everything a service contributes to a table (elements, its share of
the shared dispatch chains, affinity chains and sets) goes through a :class:`Recorder`, which
applies it to the ruleset and logs it. When the next plan sees the very same Service and slice
objects (the cluster state keeps unchanged ones), it replays the log instead of planning the
service again: same operations, same order, so the result is identical to a fresh plan. The
in-place update (``incremental.py``) also undoes a fragment, operation by operation.
Pure: no I/O, clock or logging.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, assert_never

import msgspec

from nlproxy.cluster.model import EndpointSlice, Service
from nlproxy.nft.ir import Chain, Element, Expr, Map, Rule, Ruleset, Set
from nlproxy.nft.packed import PackedElements


class Ensure(NamedTuple):
    """A shared chain a service needs: created with ``rules`` unless it already exists."""

    name: str
    rules: tuple[tuple[Expr, ...], ...]


class Fill(NamedTuple):
    """Elements a service wrote into a packed map (``nft/packed.py``): the kernel's key and
    data bytes, in order. One entry for a frontend's endpoints, not one per element."""

    set: str
    keys: tuple[bytes, ...]
    data: tuple[bytes, ...]
    shuffled: bool = False
    """The data are not in sorted order (``slots.py`` kept the endpoints' earlier slots)."""


Op = Chain | Rule | Set | Map | Element | Ensure | Fill


class Fragment(msgspec.Struct, kw_only=True):
    """One service's contribution to one family's table (and the summary's pieces of it).

    ``pieces`` is opaque here: the planner's per-port summary parts. A msgspec Struct, not a
    dataclass: a plan builds one per service and family (10k Services: 20k), and a Struct's
    ``__init__`` is C (it holds lists, so the collector still tracks it).
    """

    service: Service
    slices: Sequence[EndpointSlice]
    ops: list[Op]
    pieces: list[object]
    shuffled: bool = False
    """Some :class:`Fill` of it is shuffled (``slots.py``)."""

    def reusable_for(self, service: Service, slices: Sequence[EndpointSlice]) -> bool:
        """True when the inputs are the very same (frozen) objects as when it was planned."""
        if service is not self.service or len(slices) != len(self.slices):
            return False
        return all(a is b for a, b in zip(slices, self.slices, strict=True))


class Recorder:
    """Applies objects to a ruleset and logs them in ``ops`` (reset per service)."""

    def __init__(self, rs: Ruleset) -> None:
        self.rs = rs
        self.ops: list[Op] = []

    def add_chain(self, chain: Chain) -> None:
        self.rs.add_chain(chain)
        self.ops.append(chain)

    def add_rule(self, rule: Rule) -> None:
        self.rs.add_rule(rule)
        self.ops.append(rule)

    def add_set(self, s: Set | Map) -> None:
        self.rs.add_set(s)
        self.ops.append(s)

    def add_element(self, el: Element) -> None:
        self.rs.elements[el.set][el.key] = el
        self.ops.append(el)

    def ensure(self, name: str, rules: tuple[tuple[Expr, ...], ...]) -> str:
        return self.ensure_op(Ensure(name, rules))

    def ensure_op(self, op: Ensure) -> str:
        """``ensure``, given the (immutable, shareable) operation."""
        self.ops.append(op)
        ensure_chain(self.rs, op.name, op.rules)
        return op.name

    def replay(self, ops: list[Op]) -> None:
        """Apply a logged fragment again (and log it, so the new plan keeps it)."""
        rs = self.rs
        for op in ops:
            match op:
                case Element():
                    rs.elements[op.set][op.key] = op
                case Fill():
                    packed(rs, op.set).own().update(zip(op.keys, op.data, strict=True))
                case Ensure():
                    ensure_chain(rs, op.name, op.rules)
                case Chain():
                    rs.add_chain(op)
                case Rule():
                    rs.add_rule(op)
                case Set() | Map():
                    rs.add_set(op)
                case _:
                    assert_never(op)
        self.ops.extend(ops)


def packed(rs: Ruleset, name: str) -> PackedElements:
    """The packed elements of map ``name`` (one the planner holds packed)."""
    els = rs.elements[name]
    assert isinstance(els, PackedElements), f"map {name} is held packed"
    return els


def ensure_chain(rs: Ruleset, name: str, rules: tuple[tuple[Expr, ...], ...]) -> None:
    """Create the shared chain ``name`` with ``rules`` unless it exists."""
    if name not in rs.chains:
        rs.add_chain(Chain(name=name))
        for exprs in rules:
            rs.add_rule(Rule(chain=name, exprs=exprs))
