"""``nlproxy plan``'s report: a sync's batches told per Service (``plan_render.py`` prints it).

Sits after ``plan.py`` (which ran the sync without applying it). Each operation of each batch
becomes a :class:`Step` (a packed run of elements one step per element, as the kernel counts
them), rendered nft-like with ``nft/render`` and given to the Service it belongs to:

- an element of a map keyed by frontend (``service-ips``, ``backends``, ``firewall-allow``…)
  to the Service whose dispatch element (before or after) carries that frontend's comment;
- a ``cluster-ips`` element to the Service of that address, a ``hairpin`` element to the
  Service its endpoint serves (when only one does);
- a per-port chain, map or set (ClientIP affinity, round-robin, consistent hash) to the Service
  its name or comment names, and a rule to its chain's Service;
- anything else (the table, base and shared dispatch chains, node and range sets) is shared.

Then, per Service, the steps are read as changes: an element deleted and added again with
another value is changed (``~``), a chain flushed and refilled shows only the rules that differ,
a chain or set deleted and added is redefined. Pure: no I/O, no logging.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv6Address
from typing import assert_never

from nlproxy.conntrack.kernel import Flow, FlowFilter
from nlproxy.nft.ir import (
    Chain,
    Element,
    Family,
    IPAddress,
    Map,
    Operation,
    PackedRun,
    Rule,
    Ruleset,
    Set,
    SetLike,
    Table,
    Value,
    Verb,
)
from nlproxy.nft.packed import unpack_run
from nlproxy.nft.reconcile import programmed_fingerprint
from nlproxy.nft.render import priority_text, render_element, render_rule, set_type
from nlproxy.proxy import naming as n
from nlproxy.proxy.layout import (
    SHAPES,
    FrontKey,
    element_front,
    front_key,
    programmed_frontends,
    proto_number,
)

SHARED = ""
"""The owner of what no one Service owns."""
_REF = re.compile(r"^([^/\s]+)/([^:\s]+):[^\s]*$")
"""A service port's comment, ``ns/name:port/PROTO``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One kernel operation of a batch, as it would be sent.

    Attributes:
        verb: add, delete, flush… (``nft/ir.Verb``).
        kind: ``table``, ``chain``, ``rule``, ``set``, ``map`` or ``element``.
        name: the chain of a chain or rule, the set of a set or element ("" for the table).
        text: the object nft-like.
        owner: the Service (``ns/name``) it belongs to, or :data:`SHARED`.
        key: an element's key (to tell a changed element from an added one).
        fp: a rule's fingerprint.
    """

    family: Family
    verb: Verb
    kind: str
    name: str
    text: str
    owner: str
    key: tuple[Value, ...] | None = None
    fp: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """One change to a Service's objects: ``+`` added, ``-`` removed, ``~`` changed."""

    sign: str
    kind: str
    family: Family
    name: str
    text: str
    was: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowCleanup:
    """The flows one conntrack filter of the cleanup would delete."""

    filter: FlowFilter
    flows: int


@dataclass(slots=True, kw_only=True)
class Group:
    """What the batch changes of one Service (or of the shared objects: ``owner`` "")."""

    owner: str
    changes: list[Change] = field(default_factory=list)
    cleanups: list[FlowCleanup] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """The plan: the batches step by step, and per Service what they change."""

    batches: tuple[tuple[Family, tuple[Step, ...]], ...]
    groups: tuple[Group, ...]
    problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    services: int = 0

    @property
    def operations(self) -> dict[Family, int]:
        out: dict[Family, int] = {}
        for family, steps in self.batches:
            out[family] = out.get(family, 0) + len(steps)
        return out

    @property
    def changed(self) -> bool:
        return any(steps for _, steps in self.batches)

    @property
    def flows(self) -> int:
        return sum(c.flows for g in self.groups for c in g.cleanups)


# ---------------------------------------------------------------------------------------------
# Owners


class Owners:
    """Who owns what, from the tables before and after the sync."""

    def __init__(self, rulesets: Iterable[Ruleset]) -> None:
        self.rulesets = list(rulesets)
        self.fronts: dict[FrontKey, str] = {}
        self.addrs: dict[IPAddress, set[str]] = defaultdict(set)
        self._endpoints: dict[IPAddress, set[str]] | None = None
        for rs in self.rulesets:
            for shape in SHAPES:
                for name in (shape.dispatch, shape.no_endpoint):
                    for key, el in rs.elements.get(name, {}).items():
                        fk = front_key(key, shape.width)
                        owner = _service(el.comment)
                        if fk is None or owner is None:
                            continue
                        self.fronts.setdefault(fk, owner)
                        if fk[1] is not None:
                            self.addrs[fk[1]].add(owner)

    def element(self, el: Element, s: SetLike | None) -> str:
        fk = element_front(el.set, el.key)
        if fk is None and el.set in (n.SERVICE_COUNTERS, n.NODEPORT_COUNTERS):
            fk = front_key(el.key, 3 if el.set == n.SERVICE_COUNTERS else 2)
        if fk is not None:
            return self.fronts.get(fk, SHARED)
        if el.set == n.CLUSTER_IPS and el.key and isinstance(el.key[0], IPv4Address | IPv6Address):
            return _one(self.addrs.get(el.key[0], set()))
        if el.set == n.HAIRPIN and el.key and isinstance(el.key[0], IPv4Address | IPv6Address):
            return _one(self.endpoints().get(el.key[0], set()))
        return _named(el.set, s.comment if s is not None else "")

    def endpoints(self) -> dict[IPAddress, set[str]]:
        """The Services each endpoint address serves, before or after (read when first asked:
        only a hairpin element needs it)."""
        if self._endpoints is None:
            self._endpoints = defaultdict(set)
            for rs in self.rulesets:
                found = programmed_frontends([rs])
                for fe, backends in found.backends.items():
                    owner = _service(found.services.get(fe, ""))
                    if owner is not None:
                        for b in backends:
                            self._endpoints[b.addr].add(owner)
        return self._endpoints

    def frontend(self, flt: FlowFilter) -> str:
        if flt.proto is None or flt.orig_dport is None:
            return SHARED
        proto = proto_number(flt.proto)
        return self.fronts.get(
            (proto, flt.orig_dst, flt.orig_dport),
            self.fronts.get((proto, None, flt.orig_dport), ""),
        )


def _one(owners: set[str]) -> str:
    """The one owner, or shared when several (or none) own it."""
    return next(iter(owners)) if len(owners) == 1 else SHARED


def _service(comment: str) -> str | None:
    m = _REF.match(comment)
    return f"{m[1]}/{m[2]}" if m else None


def _named(name: str, comment: str) -> str:
    """The Service a per-port object's comment or name names, else shared."""
    owner = _service(comment)
    if owner is not None:
        return owner
    named = n.port_object_owner(name)
    return f"{named[0]}/{named[1]}" if named else SHARED


# ---------------------------------------------------------------------------------------------
# Steps


def steps(
    family: Family,
    ops: Sequence[Operation],
    before: Ruleset | None,
    after: Ruleset,
    owners: Owners,
) -> list[Step]:
    """Each kernel operation of ``ops`` (``family``'s batch) as a :class:`Step`."""
    return [step for op in ops for step in _steps(family, op, before, after, owners)]


def _declared(name: str, verb: Verb, before: Ruleset | None, after: Ruleset) -> SetLike | None:
    """Set ``name`` as declared where ``verb`` finds it: an add's in ``after`` first, the
    others' in ``before`` first."""
    first, second = (before, after) if verb is not Verb.ADD else (after, before)
    for rs in (first, second):
        if rs is not None and name in rs.sets:
            return rs.sets[name]
    return None


def _chain_owner(name: str, before: Ruleset | None, after: Ruleset) -> str:
    for rs in (after, before):
        if rs is not None and name in rs.chains:
            return _named(name, rs.chains[name].comment)
    return _named(name, "")


def _steps(
    family: Family, op: Operation, before: Ruleset | None, after: Ruleset, owners: Owners
) -> list[Step]:
    """One operation's steps: one, or one per element of a packed run."""
    obj, verb = op.obj, op.verb
    match obj:
        case Table():
            return [
                Step(family=family, verb=verb, kind="table", name=obj.name, text="", owner=SHARED)
            ]
        case Chain():
            owner = _chain_owner(obj.name, before, after)
            text = _chain_text(obj)
            return [
                Step(family=family, verb=verb, kind="chain", name=obj.name, text=text, owner=owner)
            ]
        case Rule():
            return [
                Step(
                    family=family,
                    verb=verb,
                    kind="rule",
                    name=obj.chain,
                    text=render_rule(obj, family=family),
                    owner=_chain_owner(obj.chain, before, after),
                    fp=programmed_fingerprint(obj),
                )
            ]
        case Set() | Map():
            kind = "map" if isinstance(obj, Map) else "set"
            text = f"{{ {set_type(obj)} }}"
            owner = _named(obj.name, obj.comment)
            return [
                Step(family=family, verb=verb, kind=kind, name=obj.name, text=text, owner=owner)
            ]
        case Element():
            return [
                _element_step(family, verb, obj, _declared(obj.set, verb, before, after), owners)
            ]
        case PackedRun():
            s = _declared(obj.set, verb, before, after)
            assert s is not None, f"a packed run of set {obj.set} that is in neither table"
            had = before.elements.get(obj.set, {}) if before is not None else {}
            # A delete sends keys alone: the element it deletes is the one read back.
            return [
                _element_step(
                    family,
                    verb,
                    (had.get(el.key) if verb is Verb.DELETE else None) or el,
                    s,
                    owners,
                )
                for el in unpack_run(obj, s, verb)
            ]
        case _:
            assert_never(obj)


def _element_step(
    family: Family, verb: Verb, el: Element, s: SetLike | None, owners: Owners
) -> Step:
    text = render_element(el, s) if s is not None else repr(el.key)
    return Step(
        family=family,
        verb=verb,
        kind="element",
        name=el.set,
        text=f"{{ {text} }}",
        owner=owners.element(el, s),
        key=el.key,
    )


def _chain_text(chain: Chain) -> str:
    if chain.hook is None:
        return ""
    return f"{{ type {chain.type} hook {chain.hook} priority {priority_text(chain)}; }}"


# ---------------------------------------------------------------------------------------------
# Changes


def report(
    batches: Sequence[tuple[Family, Sequence[Operation]]],
    before: Mapping[Family, Ruleset | None],
    after: Mapping[Family, Ruleset],
    flows: Mapping[FlowFilter, Sequence[Flow]] | None = None,
    *,
    problems: Sequence[str] = (),
    warnings: Sequence[str] = (),
    services: int = 0,
) -> Report:
    """The plan of a sync's ``batches``, ``before`` and ``after`` each family's table."""
    owners = Owners([rs for rs in (*before.values(), *after.values()) if rs is not None])
    done = tuple(
        (family, tuple(steps(family, ops, before.get(family), after[family], owners)))
        for family, ops in batches
    )
    groups: dict[str, Group] = {}
    for family, family_steps in done:
        for owner, mine in _by_owner(family_steps).items():
            group = groups.setdefault(owner, Group(owner=owner))
            group.changes += _changes(family, mine, before.get(family))
    for flt, found in (flows or {}).items():
        owner = owners.frontend(flt)
        groups.setdefault(owner, Group(owner=owner)).cleanups.append(
            FlowCleanup(filter=flt, flows=len(found))
        )
    ordered = sorted(groups.values(), key=lambda g: (g.owner == SHARED, g.owner))
    return Report(
        batches=done,
        groups=tuple(g for g in ordered if g.changes or g.cleanups),
        problems=tuple(problems),
        warnings=tuple(warnings),
        services=services,
    )


def _by_owner(family_steps: Sequence[Step]) -> dict[str, list[Step]]:
    out: dict[str, list[Step]] = {}
    for step in family_steps:
        out.setdefault(step.owner, []).append(step)
    return out


def _changes(family: Family, mine: Sequence[Step], before: Ruleset | None) -> list[Change]:
    """One owner's steps in one family's batch, read as changes."""
    out: list[Change] = []
    verbs: dict[tuple[str, str], dict[Verb, Step]] = defaultdict(dict)
    elements: dict[tuple[str, tuple[Value, ...] | None], dict[Verb, Step]] = defaultdict(dict)
    added_rules: dict[str, list[Step]] = defaultdict(list)
    for st in mine:
        if st.kind == "element":
            elements[(st.name, st.key)][st.verb] = st
        elif st.kind == "rule":
            added_rules[st.name].append(st)
        else:
            verbs[(st.kind, st.name)][st.verb] = st
    for (kind, name), by_verb in verbs.items():
        add, gone = by_verb.get(Verb.ADD), by_verb.get(Verb.DELETE)
        if add is not None and gone is not None:
            out.append(
                Change(
                    sign="~", kind=kind, family=family, name=name, text=f"{add.text} (redefined)"
                )
            )
        elif add is not None:
            out.append(Change(sign="+", kind=kind, family=family, name=name, text=add.text))
        elif gone is not None:
            out.append(Change(sign="-", kind=kind, family=family, name=name, text=gone.text))
        if kind == "chain" and (Verb.FLUSH in by_verb or gone is not None):
            added_rules.setdefault(name, [])
    for chain, new in added_rules.items():
        out += _rule_changes(family, chain, new, before, verbs)
    for (name, _), by_verb in elements.items():
        add, gone = by_verb.get(Verb.ADD), by_verb.get(Verb.DELETE)
        if add is not None and gone is not None:
            out.append(
                Change(
                    sign="~", kind="element", family=family, name=name, text=add.text, was=gone.text
                )
            )
        elif add is not None:
            out.append(Change(sign="+", kind="element", family=family, name=name, text=add.text))
        elif gone is not None:
            out.append(Change(sign="-", kind="element", family=family, name=name, text=gone.text))
    return out


def _rule_changes(
    family: Family,
    chain: str,
    new: Sequence[Step],
    before: Ruleset | None,
    verbs: Mapping[tuple[str, str], Mapping[Verb, Step]],
) -> list[Change]:
    """The rules of ``chain`` that differ: those it held (when the batch flushes or deletes
    it) against those the batch adds."""
    cleared = verbs.get(("chain", chain), {})
    old = (
        before.rules.get(chain, [])
        if before is not None and (Verb.FLUSH in cleared or Verb.DELETE in cleared)
        else []
    )
    old_fps = {programmed_fingerprint(r) for r in old}
    new_fps = {st.fp for st in new}
    out = [
        Change(sign="-", kind="rule", family=family, name=chain, text=render_rule(r, family=family))
        for r in old
        if programmed_fingerprint(r) not in new_fps
    ]
    out += [
        Change(sign="+", kind="rule", family=family, name=chain, text=st.text)
        for st in new
        if st.fp not in old_fps
    ]
    return out
