"""An in-memory nftables table for tests and tools that must not touch the kernel.

It takes the same :class:`~nlproxy.nft.ir.Operation` batches as the netlink backend and holds the
kernel's rules for them: a batch applies to a copy and replaces the table only when every step
succeeded (all or nothing, like one nfnetlink transaction); each step may only name chains and
sets that exist at that point; a chain or set is deleted only once nothing refers to it (a
chain's own rules go with it, as in the kernel); ``delete`` of something absent and ``create``
of something present fail. A refusal is a :class:`~nlproxy.errors.KernelError` with the
errno the kernel gives and the index of the step, so callers' error handling runs as it would
against the kernel.

Beside ``reconcile.py`` (which computes the batches) and ``backend.py`` (which sends them):
:class:`FakeNftables` is one namespace's nftables, :class:`FakeTables` one family's table in it,
standing in for ``NftBackend`` and ``KernelReadBack`` (``tables.py``'s interfaces), so the whole
sync runs in a unit test. It validates as the backend does, counts a generation per commit, and
reads back as the kernel does: plain elements of a named set packed.
"""

from __future__ import annotations

import copy
import errno
from collections.abc import Iterable, Sequence
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_network
from typing import TYPE_CHECKING, Any

from msgspec.structs import replace

from nlproxy.errors import KernelError
from nlproxy.nft import validate as validation
from nlproxy.nft.ir import (
    Chain,
    Element,
    Family,
    Map,
    Operation,
    PackedRun,
    Rule,
    Ruleset,
    Set,
    SetFlag,
    SetLike,
    Table,
    Value,
    Verb,
    Verdict,
    names,
)
from nlproxy.nft.packed import PackedElements, packable, unpack_run
from nlproxy.nft.tables import ReadBack, Tables
from nlproxy.nft.values import Packer
from nlproxy.nft.view import step


def references(rs: Ruleset) -> tuple[set[str], set[str]]:
    """The chains and the sets that rules and verdict-map elements of ``rs`` refer to (each
    expression's as :func:`~nlproxy.nft.ir.names` gives them)."""
    chains: set[str] = set()
    sets: set[str] = set()
    for rules in rs.rules.values():
        for rule in rules:
            for expr in rule.exprs:
                named = names(expr)
                chains.update(named.chains)
                sets.update(named.sets)
    for elements in rs.elements.values():
        for el in elements.values():
            if isinstance(el.value, Verdict):
                chains.update(names(el.value).chains)
    return chains, sets


def _refuse(index: int, op: Operation, code: int, why: str) -> KernelError:
    return KernelError(f"{op.verb} {type(op.obj).__name__.lower()}", why, errno=code, index=index)


def _step(cur: Ruleset | None, index: int, op: Operation) -> Ruleset:
    """``cur`` after ``op``, when the kernel would take it (``view.step`` makes the change)."""
    obj = op.obj
    if isinstance(obj, Table):
        if op.verb in (Verb.DELETE, Verb.DESTROY):
            raise _refuse(index, op, errno.EOPNOTSUPP, "the fake holds one table")
        return cur or Ruleset(table=obj)
    if cur is None:
        raise _refuse(index, op, errno.ENOENT, f"{obj} before the table exists")
    if isinstance(obj, PackedRun):
        if op.verb not in (Verb.ADD, Verb.CREATE, Verb.DELETE, Verb.DESTROY):
            raise _refuse(index, op, errno.EOPNOTSUPP, "not supported by the fake")
        if obj.set not in cur.sets:
            raise _refuse(index, op, errno.ENOENT, f"elements in unknown set {obj.set}")
        for el in unpack_run(obj, cur.sets[obj.set], op.verb):  # as the kernel: one by one
            cur = _step(cur, index, Operation(op.verb, el))
        return cur
    if _absent_ok(cur, index, op):
        return cur  # destroying what is not there
    step(cur, op)
    chains, sets = references(cur)
    if not chains <= set(cur.chains):
        unknown = ", ".join(sorted(chains - set(cur.chains)))
        raise _refuse(index, op, errno.ENOENT, f"refers to unknown chain {unknown}")
    if not sets <= set(cur.sets):
        unknown = ", ".join(sorted(sets - set(cur.sets)))
        raise _refuse(index, op, errno.ENOENT, f"refers to unknown set {unknown}")
    return cur


def _absent_ok(cur: Ruleset, index: int, op: Operation) -> bool:
    """Raise what the kernel answers ``op`` with when it refuses it; True when ``op`` is a
    destroy of something absent (taken, and nothing happens)."""
    obj = op.obj
    match op.verb, obj:
        case ((Verb.ADD | Verb.CREATE), Chain()):
            if op.verb is Verb.CREATE and obj.name in cur.chains:
                raise _refuse(index, op, errno.EEXIST, f"chain {obj.name} exists")
        case Verb.FLUSH, Chain():
            if obj.name not in cur.chains:
                raise _refuse(index, op, errno.ENOENT, f"no chain {obj.name}")
        case ((Verb.DELETE | Verb.DESTROY), Chain()):
            if obj.name not in cur.chains:
                if op.verb is Verb.DESTROY:
                    return True
                raise _refuse(index, op, errno.ENOENT, f"no chain {obj.name}")
            if obj.name in references(cur)[0]:
                raise _refuse(index, op, errno.EBUSY, f"chain {obj.name} is referenced")
        case ((Verb.ADD | Verb.CREATE), Set() | Map()):
            if op.verb is Verb.CREATE and obj.name in cur.sets:
                raise _refuse(index, op, errno.EEXIST, f"set {obj.name} exists")
        case Verb.FLUSH, Set() | Map():
            if obj.name not in cur.sets:
                raise _refuse(index, op, errno.ENOENT, f"no set {obj.name}")
        case ((Verb.DELETE | Verb.DESTROY), Set() | Map()):
            if obj.name not in cur.sets:
                if op.verb is Verb.DESTROY:
                    return True
                raise _refuse(index, op, errno.ENOENT, f"no set {obj.name}")
            if obj.name in references(cur)[1]:
                raise _refuse(index, op, errno.EBUSY, f"set {obj.name} is referenced")
        case ((Verb.ADD | Verb.CREATE), Element()):
            if obj.set not in cur.sets:
                raise _refuse(index, op, errno.ENOENT, f"element in unknown set {obj.set}")
            if op.verb is Verb.CREATE and obj.key in cur.elements[obj.set]:
                raise _refuse(index, op, errno.EEXIST, f"element {obj.key} exists in {obj.set}")
            clash = _overlapped(cur.sets[obj.set], cur.elements[obj.set], obj.key)
            if clash is not None:
                why = f"element {obj.key} overlaps {clash} in {obj.set}"
                raise _refuse(index, op, errno.EEXIST, why)
        case ((Verb.DELETE | Verb.DESTROY), Element()):
            if obj.key not in cur.elements.get(obj.set, {}):
                if op.verb is Verb.DESTROY:
                    return True
                raise _refuse(index, op, errno.ENOENT, f"no element {obj.key} in {obj.set}")
        case Verb.ADD, Rule():
            if obj.chain not in cur.chains:
                raise _refuse(index, op, errno.ENOENT, f"rule in unknown chain {obj.chain}")
        case _:
            raise _refuse(index, op, errno.EOPNOTSUPP, "not supported by the fake")
    return False


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


def _as_ranges(key: tuple[Value, ...]) -> tuple[Value, ...]:
    return tuple(ip_network(v) if isinstance(v, IPv4Address | IPv6Address) else v for v in key)


def _bounds(v: Value) -> tuple[Any, Any]:
    if isinstance(v, IPv4Network | IPv6Network):
        return v.network_address, v.broadcast_address
    return v, v


def _overlapped(s: SetLike, elements: object, key: tuple[Value, ...]) -> tuple[Value, ...] | None:
    """The element of a concatenated interval set that ``key``'s first or last point falls in,
    if that element is not ``key`` itself (None: no overlap the kernel refuses).

    The kernel's set for concatenated intervals (pipapo) looks up the new element's start, then
    its end, among the elements already there; a hit on another element is an overlap, refused
    with EEXIST. A new element that contains an old one hits neither, and is taken.
    """
    if not s.flags & SetFlag.INTERVAL or len(s.key) < 2 or not isinstance(elements, dict):
        return None
    points = list(zip(*map(_bounds, key), strict=True))
    for other in elements:
        if other == key:
            continue
        spans = [_bounds(v) for v in other]
        for point in points:
            if all(lo <= p <= hi for (lo, hi), p in zip(spans, point, strict=True)):
                return tuple(other)
    return None


class FakeNftables:
    """One namespace's nftables in memory: tables by family, and the ruleset's generation.

    Implements :class:`~nlproxy.nft.tables.ReadBack`; :meth:`open` gives a family's
    :class:`FakeTables`. ``batches`` lists every batch committed, with its family, in order.
    The generation moves with each batch, as the kernel's does, but for one that only added
    elements (or the table) already there.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.tables: dict[Family, FakeTable] = {}
        self.gen = 0
        self.batches: list[tuple[Family, list[Operation]]] = []

    def open(self, table: Table) -> FakeTables:
        """``table``'s family, as a backend bound to it sees it."""
        return FakeTables(self, table)

    def ruleset(self, family: Family) -> Ruleset | None:
        """The table as the fake holds it (live: not a copy)."""
        t = self.tables.get(family)
        return None if t is None else t.ruleset

    def dump(self, family: Family) -> Ruleset | None:
        rs = self.ruleset(family)
        if rs is None:
            return None
        out = copy.deepcopy(rs)
        for name, s in out.sets.items():
            # As read-back shows them: a named set's elements packed when there are some and
            # none carries what packed elements cannot (a comment, a timeout).
            els = out.elements.get(name)
            if s.flags & SetFlag.INTERVAL and isinstance(els, dict):
                # An interval set's address is read back as the range it is: a /32 or /128.
                out.elements[name] = {
                    (k := _as_ranges(el.key)): replace(el, key=k) for el in els.values()
                }
            if not (packable(s) and isinstance(els, dict) and els):
                continue
            if all(not el.comment and el.timeout is None for el in els.values()):
                packed = PackedElements(s)
                for el in els.values():
                    packed[el.key] = el
                out.elements[name] = packed
        return out

    def comments(self, family: Family, chain: str) -> list[str] | None:
        rs = self.ruleset(family)
        if rs is None:
            return None
        return [r.comment for r in rs.rules.get(chain, [])]

    def generation(self) -> int:
        return self.gen

    def learned(self, family: Family, m: Map) -> dict[bytes, bytes]:
        """What the fake's map holds, packed: its elements stand for learned clients."""
        rs = self.ruleset(family)
        els = rs.elements.get(m.name) if rs is not None else None
        if not els:
            return {}
        key, data = Packer(m.key), Packer(m.data)
        return {
            key.pack(el.key): data.pack(el.value)
            for el in els.values()
            if isinstance(el.value, tuple)
        }

    def close(self) -> None:
        pass


class FakeTables:
    """One family's table of a :class:`FakeNftables`, as ``NftBackend`` is one of the kernel's:
    validates each batch as the backend does, then applies it all or nothing."""

    def __init__(self, nft: FakeNftables, table: Table) -> None:
        self.nft = nft
        self.table = table
        self._known: Ruleset | None = None

    def _fake(self) -> FakeTable:
        return self.nft.tables.setdefault(self.table.family, FakeTable())

    def apply(self, ops: Sequence[Operation], known: Ruleset | None = None) -> int:
        """Validate and commit ``ops``; returns the operations applied.

        Raises:
            InvalidNftObject: an operation is invalid; nothing was applied.
            KernelError: a step was refused; the table is as it was.
        """
        if not ops:
            return 0
        view = known or self.known()
        validation.validate(self.table, ops, view)
        fake = self._fake()
        before = fake.ruleset
        after = fake.commit(ops)
        # Adding elements or a table that are there makes no transaction in the kernel: a
        # batch of only those, that changed nothing, commits nothing and leaves the generation.
        if after != before or not all(
            op.verb is Verb.ADD and isinstance(op.obj, Element | PackedRun | Table) for op in ops
        ):
            self.nft.gen += 1
        self.nft.batches.append((self.table.family, list(ops)))
        self._known = None  # read again from the table, as the backend keeps it in step
        return len(ops)

    def check(self, ops: Sequence[Operation], known: Ruleset | None = None) -> None:
        if not ops:
            return
        validation.validate(self.table, ops, known or self.known())
        apply(self._fake().ruleset, ops)

    def known(self) -> Ruleset:
        if self._known is None:
            rs = self._fake().ruleset
            self._known = Ruleset(table=self.table)
            if rs is not None:
                self._known.chains = dict(rs.chains)
                self._known.sets = dict(rs.sets)
        return self._known

    def forget(self) -> None:
        self._known = None

    def close(self) -> None:
        pass


if TYPE_CHECKING:  # the fakes stand in for the kernel's (mypy checks it)
    _tables: Tables = FakeTables(FakeNftables("t"), Table(family=Family.IP, name="t"))
    _readback: ReadBack = FakeNftables("t")
