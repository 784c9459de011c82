"""An in-memory nftables table for tests and tools that must not touch the kernel.

It takes the same :class:`~nlproxy.nft.ir.Operation` batches as the netlink backend and holds the
kernel's rules for them: a batch applies to a copy and replaces the table only when every step
succeeded (all or nothing, like one nfnetlink transaction); each step may only name chains and
sets that exist at that point; a chain or set is deleted only once nothing refers to it (a
chain's own rules go with it, as in the kernel); ``delete`` of something absent and ``create``
of something present fail. A refusal is a :class:`~nlproxy.errors.KernelError` with the
errno the kernel gives and the index of the step, so callers' error handling runs as it would
against the kernel.

Beside ``reconcile.py`` (which computes the batches) and ``backend.py`` (which sends them).
"""

from __future__ import annotations

import copy
import errno
from collections.abc import Iterable, Sequence

from nlproxy.errors import KernelError
from nlproxy.nft.ir import (
    Chain,
    Element,
    Map,
    Operation,
    PackedRun,
    Rule,
    Ruleset,
    Set,
    Table,
    Verb,
)
from nlproxy.nft.packed import unpack_run


def references(rs: Ruleset) -> tuple[set[str], set[str]]:
    """The chains and the sets that rules and verdict-map elements of ``rs`` refer to."""
    chains: set[str] = set()
    sets: set[str] = set()
    for rules in rs.rules.values():
        for rule in rules:
            for expr in rule.exprs:
                chain = getattr(expr, "chain", None)
                if isinstance(chain, str):
                    chains.add(chain)
                for attr in ("set", "map"):
                    name = getattr(expr, attr, None)
                    if isinstance(name, str):
                        sets.add(name)
    for elements in rs.elements.values():
        for el in elements.values():
            chain = getattr(el.value, "chain", None)
            if chain:
                chains.add(chain)
    return chains, sets


def _refuse(index: int, op: Operation, code: int, why: str) -> KernelError:
    return KernelError(f"{op.verb} {type(op.obj).__name__.lower()}", why, errno=code, index=index)


def _step(cur: Ruleset | None, index: int, op: Operation) -> Ruleset:
    obj = op.obj
    if isinstance(obj, Table):
        if op.verb in (Verb.DELETE, Verb.DESTROY):
            raise _refuse(index, op, errno.EOPNOTSUPP, "the fake holds one table")
        return cur or Ruleset(table=obj)
    if cur is None:
        raise _refuse(index, op, errno.ENOENT, f"{obj} before the table exists")
    match op.verb, obj:
        case ((Verb.ADD | Verb.CREATE), Chain()):
            if op.verb is Verb.CREATE and obj.name in cur.chains:
                raise _refuse(index, op, errno.EEXIST, f"chain {obj.name} exists")
            cur.add_chain(obj)
        case Verb.FLUSH, Chain():
            if obj.name not in cur.chains:
                raise _refuse(index, op, errno.ENOENT, f"no chain {obj.name}")
            cur.rules[obj.name] = []
        case ((Verb.DELETE | Verb.DESTROY), Chain()):
            if obj.name not in cur.chains:
                if op.verb is Verb.DESTROY:
                    return cur
                raise _refuse(index, op, errno.ENOENT, f"no chain {obj.name}")
            if obj.name in references(cur)[0]:
                raise _refuse(index, op, errno.EBUSY, f"chain {obj.name} is referenced")
            del cur.chains[obj.name]
            del cur.rules[obj.name]
        case ((Verb.ADD | Verb.CREATE), Set() | Map()):
            if op.verb is Verb.CREATE and obj.name in cur.sets:
                raise _refuse(index, op, errno.EEXIST, f"set {obj.name} exists")
            cur.add_set(obj)
        case Verb.FLUSH, Set() | Map():
            if obj.name not in cur.sets:
                raise _refuse(index, op, errno.ENOENT, f"no set {obj.name}")
            cur.elements[obj.name] = {}
        case ((Verb.DELETE | Verb.DESTROY), Set() | Map()):
            if obj.name not in cur.sets:
                if op.verb is Verb.DESTROY:
                    return cur
                raise _refuse(index, op, errno.ENOENT, f"no set {obj.name}")
            if obj.name in references(cur)[1]:
                raise _refuse(index, op, errno.EBUSY, f"set {obj.name} is referenced")
            del cur.sets[obj.name]
            del cur.elements[obj.name]
        case ((Verb.ADD | Verb.CREATE), Element()):
            if obj.set not in cur.sets:
                raise _refuse(index, op, errno.ENOENT, f"element in unknown set {obj.set}")
            if op.verb is Verb.CREATE and obj.key in cur.elements[obj.set]:
                raise _refuse(index, op, errno.EEXIST, f"element {obj.key} exists in {obj.set}")
            cur.add_element(obj)
        case ((Verb.DELETE | Verb.DESTROY), Element()):
            if obj.key not in cur.elements.get(obj.set, {}):
                if op.verb is Verb.DESTROY:
                    return cur
                raise _refuse(index, op, errno.ENOENT, f"no element {obj.key} in {obj.set}")
            del cur.elements[obj.set][obj.key]
        case Verb.ADD, Rule():
            if obj.chain not in cur.chains:
                raise _refuse(index, op, errno.ENOENT, f"rule in unknown chain {obj.chain}")
            cur.add_rule(obj)
        case _, PackedRun():
            if obj.set not in cur.sets:
                raise _refuse(index, op, errno.ENOENT, f"elements in unknown set {obj.set}")
            for el in unpack_run(obj, cur.sets[obj.set], op.verb):  # as the kernel: one by one
                cur = _step(cur, index, Operation(op.verb, el))
        case _:
            raise _refuse(index, op, errno.EOPNOTSUPP, "not supported by the fake")
    chains, sets = references(cur)
    if not chains <= set(cur.chains):
        unknown = ", ".join(sorted(chains - set(cur.chains)))
        raise _refuse(index, op, errno.ENOENT, f"refers to unknown chain {unknown}")
    if not sets <= set(cur.sets):
        unknown = ", ".join(sorted(sets - set(cur.sets)))
        raise _refuse(index, op, errno.ENOENT, f"refers to unknown set {unknown}")
    return cur


def apply(rs: Ruleset | None, ops: Iterable[Operation]) -> Ruleset:
    """``rs`` after ``ops``, as a new ruleset (``rs`` is left as it was, also on a refusal).

    Raises:
        KernelError: a step the kernel would refuse (its errno and index).
    """
    cur = copy.deepcopy(rs) if rs is not None else None
    for index, op in enumerate(ops):
        cur = _step(cur, index, op)
    if cur is None:
        raise KernelError("batch", "no table", errno=errno.ENOENT)
    return cur


class FakeTable:
    """One table that takes whole batches: all of a batch, or (on a refusal) none of it."""

    def __init__(self, rs: Ruleset | None = None) -> None:
        self.ruleset = rs
        self.batches = 0

    def commit(self, ops: Sequence[Operation]) -> Ruleset:
        """Apply ``ops`` as one transaction and return the new table.

        Raises:
            KernelError: a step was refused; the table is as it was before the batch.
        """
        self.ruleset = apply(self.ruleset, ops)
        self.batches += 1
        return self.ruleset
