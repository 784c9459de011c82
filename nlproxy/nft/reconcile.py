"""Reconciler: the smallest transaction that turns what is programmed into what is planned.

Sits between the planner (desired :class:`Ruleset`) and the kernel backend. Pure: it compares two
rulesets and returns operations; it neither reads nor writes the kernel.

How each kind of object is compared:
- chains by name and definition (type, hook, priority, policy);
- rules by fingerprint: a hash of the planned rule is stored in the rule's comment
  (``... fp=1a2b3c4d5e6f``), so a rule read back from the kernel (by this process or an earlier
  one) is compared without decoding it. A chain whose fingerprint list differs is flushed and
  refilled in the same atomic batch: chains are few and short in nlproxy's shape;
- sets and maps by definition; elements by key, then value and comment. Elements of dynamic sets
  (``SetFlag.EVAL``, e.g. session-affinity sets) belong to the data path and are never touched;
- anonymous sets (``__map0`` …) belong to their rules and are ignored.

The order of the operations inside the batch keeps every reference valid at each step: flush
rewritten/stale chains, delete elements, delete sets, delete chains, then add table, chains, sets,
elements, rules.

Two entry points: :func:`diff` compares everything (start-up, after a verify); :func:`ops_for_delta`
compares only the objects a :class:`Delta` names (the planner's in-place update of the changed
services), with the same per-object rules and the same order, so a one-endpoint change costs a
few dictionary look-ups instead of a walk over every element. :func:`advance` brings the cached
programmed state forward by a committed batch without copying it.
"""

from __future__ import annotations

import hashlib
import operator
import re
import struct
from dataclasses import dataclass, field, replace
from typing import TypeAlias

from nlproxy.nft.ir import (
    Chain,
    Element,
    ElementMap,
    Map,
    Operation,
    PackedRun,
    Rule,
    Ruleset,
    SetFlag,
    SetLike,
    Value,
    Verb,
    names,
)
from nlproxy.nft.packed import PackedElements, packable
from nlproxy.nft.view import steps

_FP_RE = re.compile(r"(?:^| )fp=([0-9a-f]{12})$")


def fingerprint(rule: Rule) -> str:
    """A 12-hex-digit hash of what the rule does (chain, expressions and comment)."""
    text = repr((rule.chain, rule.exprs, rule.comment))
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def stamp(rule: Rule) -> Rule:
    """The rule as it is programmed: its comment carries its fingerprint."""
    fp = fingerprint(rule)
    comment = f"{rule.comment} fp={fp}" if rule.comment else f"fp={fp}"
    return replace(rule, comment=comment)


def programmed_fingerprint(rule: Rule) -> str | None:
    """The fingerprint stored in a rule read back from the kernel, or None (not ours/unknown)."""
    m = _FP_RE.search(rule.comment)
    return m.group(1) if m else None


@dataclass(slots=True)
class _Phases:
    """A transaction's operations by phase; :meth:`ordered` is the one order that keeps every
    reference valid at each step (see the module docstring)."""

    flush: list[Operation] = field(default_factory=list)
    del_elements: list[Operation] = field(default_factory=list)
    del_sets: list[Operation] = field(default_factory=list)
    del_chains: list[Operation] = field(default_factory=list)
    add_chains: list[Operation] = field(default_factory=list)
    add_sets: list[Operation] = field(default_factory=list)
    add_elements: list[Operation] = field(default_factory=list)
    add_rules: list[Operation] = field(default_factory=list)

    def ordered(self) -> list[Operation]:
        return [
            *self.flush,
            *self.del_elements,
            *self.del_sets,
            *self.del_chains,
            *self.add_chains,
            *self.add_sets,
            *self.add_elements,
            *self.add_rules,
        ]


def _chain_changed(want: Chain, have: Chain) -> bool:
    return (want.type, want.hook, want.priority, want.policy) != (
        have.type,
        have.hook,
        have.priority,
        have.policy,
    )


# Flags the encoder derives from the key and data types; read-back leaves them out.
_DERIVED_FLAGS = SetFlag.MAP | SetFlag.CONCAT


def _set_changed(want: SetLike, have: SetLike) -> bool:
    if type(want) is not type(have):
        return True
    return (want.key, getattr(want, "data", None), want.flags & ~_DERIVED_FLAGS, want.timeout) != (
        have.key,
        getattr(have, "data", None),
        have.flags & ~_DERIVED_FLAGS,
        have.timeout,
    )


def _referenced_sets(rules: list[Rule]) -> set[str]:
    return {name for rule in rules for e in rule.exprs for name in names(e).sets}


def _element_ops(
    name: str, want: ElementMap, have: ElementMap
) -> tuple[list[Operation], list[Operation]]:
    """(deletes, adds) that make the elements of one set equal; adds in ``want``'s order.

    Each key is hashed once when little differs (a restart compares 200k elements whose keys
    hash in Python): the set operations on the key views reuse the dicts' stored hashes.
    Packed elements are compared as bytes and come out as one :class:`PackedRun` per verb.
    """
    if isinstance(want, PackedElements):
        packed = _packed_ops(name, want, have)
        if packed is not None:
            return packed
        want = {el.key: el for el in want.values()}
    if not have:
        return [], [Operation(Verb.ADD, el) for el in want.values()]
    deletes: list[Operation] = []
    changed: set[tuple[Value, ...]] = set()
    for key, el in have.items():
        w = want.get(key)
        if w is None:
            deletes.append(Operation(Verb.DELETE, el))
        elif w is not el and (w.value, w.comment) != (el.value, el.comment):
            deletes.append(Operation(Verb.DELETE, el))
            changed.add(key)
    if len(deletes) > 1:
        # In a stable order, not the kernel's dump order: a hash set's deferred resize changes
        # that between two reads, and a plan and the sync after it must send one batch.
        deletes.sort(key=_element_order)
    added = want.keys() - have.keys()
    if not added and not changed:
        return deletes, []
    adding = added | changed
    return deletes, [Operation(Verb.ADD, el) for key, el in want.items() if key in adding]


def _element_order(op: Operation) -> str:
    return repr(op.obj.key) if isinstance(op.obj, Element) else ""


def _packed_ops(
    name: str, want: PackedElements, have: ElementMap
) -> tuple[list[Operation], list[Operation]] | None:
    """:func:`_element_ops` for packed elements: no object per element, one run per verb.

    None when ``have`` holds an element a packed set cannot (a comment, a timeout: another
    writer's); the caller then compares elements.
    """
    w = want.raw
    if isinstance(have, PackedElements):
        h = have.raw
    else:
        try:
            h = {want.pack_key(el.key): want.pack_data(el) for el in have.values()}
        except (TypeError, ValueError, OverflowError, AttributeError, struct.error):
            return None
    if h == w:  # an unchanged restart: one comparison in C
        return [], []
    if not h:
        return [], [Operation(Verb.ADD, PackedRun(set=name, keys=list(w), data=list(w.values())))]
    # Sorted: ``h`` is in the kernel's dump order, which a hash set's resize (deferred, after
    # many adds) changes between two reads; a plan and the sync after it send one batch.
    gone = sorted(k for k, d in h.items() if w.get(k) != d)
    adding = [k for k, d in w.items() if h.get(k) != d]
    deletes = [Operation(Verb.DELETE, PackedRun(set=name, keys=gone))] if gone else []
    adds = [Operation(Verb.ADD, PackedRun(set=name, keys=adding, data=[w[k] for k in adding]))]
    return deletes, adds if adding else []


def count_ops(ops: list[Operation]) -> int:
    """How many kernel operations ``ops`` stand for: a packed run counts each of its elements."""
    return len(ops) + sum(len(op.obj.keys) - 1 for op in ops if isinstance(op.obj, PackedRun))


def _chain_ops(
    chain: Chain,
    rules: list[Rule],
    have: Ruleset,
    recreated: set[str],
    ph: _Phases,
) -> None:
    """Operations that make one desired chain and its rules equal to what ``have`` holds."""
    name = chain.name
    old_chain = have.chains.get(name)
    want_rules = [stamp(r) for r in rules]
    have_rules = have.rules.get(name, [])
    rewrite = [programmed_fingerprint(r) for r in have_rules] != [
        programmed_fingerprint(r) for r in want_rules
    ] or bool(recreated & _referenced_sets(have_rules))
    if old_chain is None:
        ph.add_chains.append(Operation(Verb.ADD, chain))
    elif _chain_changed(chain, old_chain):
        ph.flush.append(Operation(Verb.FLUSH, old_chain))
        ph.del_chains.append(Operation(Verb.DELETE, old_chain))
        ph.add_chains.append(Operation(Verb.ADD, chain))
        rewrite = True
    elif rewrite and have_rules:
        ph.flush.append(Operation(Verb.FLUSH, old_chain))
    if rewrite or old_chain is None:
        ph.add_rules += [Operation(Verb.ADD, r) for r in want_rules]


def _drop_chain(name: str, have: Ruleset, ph: _Phases) -> None:
    old_chain = have.chains.get(name)
    if old_chain is None:
        return
    if have.rules.get(name):
        ph.flush.append(Operation(Verb.FLUSH, old_chain))
    ph.del_chains.append(Operation(Verb.DELETE, old_chain))


def diff(desired: Ruleset, current: Ruleset | None) -> list[Operation]:
    """Operations that make ``current`` (None: the table does not exist) equal ``desired``.

    Returns an empty list when nothing differs, so an unchanged sync sends nothing.
    """
    have = current or Ruleset(table=desired.table)
    have_sets = {n: s for n, s in have.sets.items() if not n.startswith("__")}

    ph = _Phases()

    # Sets first: a set whose definition changed is recreated, so chains using it are rewritten.
    recreated: set[str] = set()
    for name, s in desired.sets.items():
        old = have_sets.get(name)
        if old is None:
            ph.add_sets.append(Operation(Verb.ADD, s))
        elif _set_changed(s, old):
            recreated.add(name)
            ph.del_sets.append(Operation(Verb.DELETE, old))
            ph.add_sets.append(Operation(Verb.ADD, s))
    for name, old in have_sets.items():
        if name not in desired.sets:
            ph.del_sets.append(Operation(Verb.DELETE, old))

    # Chains and their rules.
    for name, chain in desired.chains.items():
        _chain_ops(chain, desired.rules.get(name, []), have, recreated, ph)
    for name in have.chains:
        if name not in desired.chains:
            _drop_chain(name, have, ph)

    # Elements of sets that stay (a recreated or new set gets all its elements added).
    for name, s in desired.sets.items():
        if s.flags & SetFlag.EVAL:
            continue
        want_el: ElementMap = desired.elements.get(name, {})
        have_el: ElementMap = (
            {} if name in recreated or name not in have_sets else have.elements.get(name, {})
        )
        d, a = _element_ops(name, want_el, have_el)
        ph.del_elements += d
        ph.add_elements += a

    ops = ph.ordered()
    if current is None:
        ops.insert(0, Operation(Verb.ADD, desired.table))
    return ops


# ---------------------------------------------------------------------------------------------
# Deltas: the objects a planner's in-place update touched

ElementId: TypeAlias = tuple[str, tuple[Value, ...]]
"""(set name, key): where an element lives."""
ChainState: TypeAlias = tuple[Chain, tuple[Rule, ...]]
"""A chain with its rules, in order."""
PackedChanges: TypeAlias = dict[bytes, tuple[bytes | None, bytes | None]]
"""One packed set's changed elements: packed key -> (data before, data after); None: absent."""


@dataclass(slots=True)
class Delta:
    """What changed in one table's desired ruleset, as (before, after) pairs; None: absent.

    Only objects whose value differs are listed. ``before`` is what the previous plan wanted
    (what is programmed when the cache is in step), ``after`` what the new plan wants.
    """

    elements: dict[ElementId, tuple[Element | None, Element | None]] = field(default_factory=dict)
    chains: dict[str, tuple[ChainState | None, ChainState | None]] = field(default_factory=dict)
    sets: dict[str, tuple[SetLike | None, SetLike | None]] = field(default_factory=dict)
    packed: dict[str, PackedChanges] = field(default_factory=dict)
    """Elements of sets the plan holds packed (``packed.py``), by set, as the kernel's bytes:
    compared and sent as bytes, never decoded on the way."""

    def __len__(self) -> int:
        packed = sum(map(len, self.packed.values()))
        return len(self.elements) + len(self.chains) + len(self.sets) + packed


def ops_for_delta(delta: Delta, programmed: Ruleset) -> list[Operation] | None:
    """Operations that make the objects ``delta`` names in ``programmed`` equal its ``after``.

    The same comparison as :func:`diff`, restricted to those objects, in the same order. When
    ``programmed`` equals the previous plan everywhere else, the result leaves the table equal
    to the new plan, as ``diff`` would.

    A set whose definition changed is recreated, as by ``diff``, and every chain using it
    rewritten: the delta must list those chains (unchanged ones with equal before and after).

    Returns:
        The operations, or None when the delta cannot be applied on its own: a recreated set
        is used by a chain the delta does not list, or holds planned elements (only dynamic
        sets, whose elements the data path owns, are recreated here). The caller then diffs
        everything.
    """
    ph = _Phases()
    recreated: set[str] = set()
    for name, (_, want) in delta.sets.items():
        old = programmed.sets.get(name)
        if want is None:
            if old is not None:
                ph.del_sets.append(Operation(Verb.DELETE, old))
        elif old is None:
            ph.add_sets.append(Operation(Verb.ADD, want))
        elif _set_changed(want, old):
            if not want.flags & SetFlag.EVAL:
                return None
            recreated.add(name)
            ph.del_sets.append(Operation(Verb.DELETE, old))
            ph.add_sets.append(Operation(Verb.ADD, want))
    if recreated and not _users_listed(recreated, delta, programmed):
        return None
    for name, (_, after) in delta.chains.items():
        if after is None:
            _drop_chain(name, programmed, ph)
        else:
            _chain_ops(after[0], list(after[1]), programmed, recreated, ph)
    for (set_name, key), (_, want_el) in delta.elements.items():
        s = _desired_set(delta, programmed, set_name)
        if s is None or s.flags & SetFlag.EVAL:
            continue  # the set goes (with its elements), or the data path owns them
        have_el = programmed.elements.get(set_name, {}).get(key)
        _element_change(have_el, want_el, ph)
    for set_name, changes in delta.packed.items():
        s = _desired_set(delta, programmed, set_name)
        if s is None or s.flags & SetFlag.EVAL or not changes:
            continue
        _packed_delta_ops(set_name, s, changes, programmed, ph)
    return ph.ordered()


def _element_change(have: Element | None, want: Element | None, ph: _Phases) -> None:
    """What turns the programmed element ``have`` into the planned ``want`` (None: absent):
    a delete of the one, an add of the other, each only when value or comment differ."""
    differ = (
        have is None or want is None or (want.value, want.comment) != (have.value, have.comment)
    )
    if differ and have is not None:
        ph.del_elements.append(Operation(Verb.DELETE, have))
    if differ and want is not None:
        ph.add_elements.append(Operation(Verb.ADD, want))


def _packed_delta_ops(
    name: str, s: SetLike, changes: PackedChanges, programmed: Ruleset, ph: _Phases
) -> None:
    """The element operations for one packed set's changes: one run per verb, the same
    comparison as :func:`_packed_ops` restricted to the changed keys (at C speed: a look-up
    per key, no object per element)."""
    have = programmed.elements.get(name)
    if not isinstance(have, PackedElements):  # the cache holds this set unpacked (read back)
        have = _repacked(s, have or {})
        if have is None:
            _unpacked_ops(name, s, changes, programmed, ph)
            return
    h = have.raw
    keys = list(changes)
    had = list(map(h.get, keys))
    want = [pair[1] for pair in changes.values()]
    differ = list(map(operator.ne, had, want))
    gone = [k for k, d, x in zip(keys, had, differ, strict=True) if x and d is not None]
    added = [(k, w) for k, w, x in zip(keys, want, differ, strict=True) if x and w is not None]
    if gone:
        ph.del_elements.append(Operation(Verb.DELETE, PackedRun(set=name, keys=gone)))
    if added:
        adding, data = [k for k, _ in added], [w for _, w in added]
        run = PackedRun(set=name, keys=adding, data=data if isinstance(s, Map) else None)
        ph.add_elements.append(Operation(Verb.ADD, run))


def _repacked(s: SetLike, have: ElementMap) -> PackedElements | None:
    """``have`` held as bytes, or None when it holds an element bytes cannot (another
    writer's comment or timeout) or ``s`` cannot be held packed."""
    if not packable(s):
        return None
    store = PackedElements(s)
    try:
        store.own().update((store.pack_key(el.key), store.pack_data(el)) for el in have.values())
    except (TypeError, ValueError, OverflowError, AttributeError, struct.error):
        return None
    return store


def _unpacked_ops(
    name: str, s: SetLike, changes: PackedChanges, programmed: Ruleset, ph: _Phases
) -> None:
    """The packed changes compared element by element (decoded): the cache holds elements
    of this set that bytes cannot hold."""
    store = PackedElements(s)  # the plan holds it packed, so it can be
    have = programmed.elements.get(name, {})
    for k, (_, data) in changes.items():
        want_el = None if data is None else store.element(k, data)
        have_el = have.get(store.decode_key(k))
        _element_change(have_el, want_el, ph)


def _users_listed(recreated: set[str], delta: Delta, programmed: Ruleset) -> bool:
    """Whether every programmed chain using a recreated set is in the delta (a walk over all
    rules, only when a set's definition changed)."""
    return all(
        chain in delta.chains
        for chain, rules in programmed.rules.items()
        if recreated & _referenced_sets(rules)
    )


def _desired_set(delta: Delta, programmed: Ruleset, name: str) -> SetLike | None:
    if name in delta.sets:
        return delta.sets[name][1]
    return programmed.sets.get(name)


def advance(programmed: Ruleset, ops: list[Operation]) -> None:
    """Update ``programmed`` in place to what read-back shows once ``ops`` are committed
    (``view.steps``).

    ``ops`` come from :func:`diff` or :func:`ops_for_delta` against ``programmed`` (so rules
    already carry their fingerprints); elements of dynamic sets are left as they are.
    """
    steps(programmed, ops)
