"""Apply a batch to a view: what a table holds once an operation has been committed.

Written once, for the four places that follow a batch without asking the kernel: the fake
table (``fake.py``: after its own checks that the kernel would take the step), the
programmed cache (``reconcile.advance``), the backend's view of chains and sets
(``backend.NftBackend``) and validation's scope (``validate.py``). A view is a
:class:`~nlproxy.nft.ir.Ruleset`; ``declarations=True`` keeps only chains and sets (what
validation needs), ignoring rules and elements.

Lenient: deleting what is absent, or adding what is present, is no error here (the fake
refuses those itself, before it steps). Elements of a packed set stay packed; an element that
bytes cannot hold (a comment, a timeout) unpacks its set. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

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
from nlproxy.nft.packed import PackedElements, unpack_run

_GONE = frozenset({Verb.DELETE, Verb.DESTROY})


def step(view: Ruleset, op: Operation, *, declarations: bool = False) -> None:
    """Bring ``view`` forward, in place, by one committed operation."""
    obj, verb = op.obj, op.verb
    if obj.__class__ is Element:  # most of a big batch: first, and cheap
        if not declarations:
            _element(view, verb, obj)
        return
    match obj:
        case PackedRun():
            if not declarations:
                _packed(view, verb, obj)
        case Rule():
            if not declarations:
                view.add_rule(obj)
        case Chain():
            if verb is Verb.FLUSH:
                view.rules[obj.name] = []
            elif verb in _GONE:
                view.chains.pop(obj.name, None)
                view.rules.pop(obj.name, None)
            else:
                view.add_chain(obj)
        case Set() | Map():
            if verb is Verb.FLUSH:
                view.elements[obj.name] = {}
            elif verb in _GONE:
                view.sets.pop(obj.name, None)
                view.elements.pop(obj.name, None)
            else:
                view.add_set(obj)
        case Table():
            if verb in _GONE:
                view.chains.clear()
                view.rules.clear()
                view.sets.clear()
                view.elements.clear()


def steps(view: Ruleset, ops: Iterable[Operation], *, declarations: bool = False) -> None:
    """:func:`step` for each of ``ops``, in order."""
    if declarations:  # elements are most of a big batch, and change no declaration
        for op in ops:
            if op.obj.__class__ is not Element:
                step(view, op, declarations=True)
        return
    for op in ops:
        step(view, op)


def _element(view: Ruleset, verb: Verb, el: Element) -> None:
    if verb in _GONE:
        view.elements.get(el.set, {}).pop(el.key, None)
        return
    els = view.elements.get(el.set)
    if isinstance(els, PackedElements) and (el.comment or el.timeout):
        # held packed, now given an element bytes cannot hold: unpack the set
        view.elements[el.set] = dict(els.items())
    view.add_element(el)


def _packed(view: Ruleset, verb: Verb, run: PackedRun) -> None:
    els = view.elements.get(run.set)
    if els is None:
        return
    if not isinstance(els, PackedElements):  # the view holds this set unpacked
        s = view.sets[run.set]
        for el in unpack_run(run, s, verb):
            if verb in _GONE:
                els.pop(el.key, None)
            else:
                els[el.key] = el
    elif verb in _GONE:
        own = els.own()
        for k in run.keys:
            own.pop(k, None)
    else:
        assert run.data is not None or not isinstance(els.set, Map), "a map's add carries data"
        data = run.data if run.data is not None else [b""] * len(run.keys)
        els.own().update(zip(run.keys, data, strict=True))
