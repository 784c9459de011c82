"""In-place plan updates: re-plan only the changed services and say exactly what changed.

Sits beside the planner, between cluster state and the reconciler. A plan is a ruleset per
family plus, per service, the fragment of operations that service added (``fragments.py``).
:func:`plan_update` keeps the previous plan's rulesets and changes them in place: for each
changed or removed service it undoes its old fragment and applies the new one, and it reports
the objects whose value differs as a :class:`~nlproxy.nft.reconcile.Delta`, so the reconciler
compares those and nothing else. The result equals a fresh :func:`~nlproxy.proxy.planner.plan`
of the same snapshot (the same objects; only the insertion order of dictionaries may differ).

What services share is reference counted (:class:`LiveCounts`): the dispatch chains per
(role, N) and the hairpin pairs. The global sets are shared too, but every element in them is
written by exactly one service — :func:`attach` checks that once, and each update checks it for
the services it touches before changing anything. Anything else (two services claiming the same
element or name, a change of config, node or ServiceCIDRs, a plan without counts) falls back to
a full plan, and the delta is None.

Pure: no I/O, no clock, no logging. The previous plan is consumed: its rulesets, summary and
fragments become the new plan's.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Set
from dataclasses import dataclass, field

from nlproxy.cluster.model import ClusterSnapshot, IPAddress, ServiceKey, ServicePortRef
from nlproxy.nft.ir import Chain, Element, Family, Map, Rule, Ruleset
from nlproxy.nft.ir import Set as NftSet
from nlproxy.nft.reconcile import ChainState, Delta, ElementId
from nlproxy.proxy import naming as n
from nlproxy.proxy.changes import changed_since
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.fragments import Ensure, Fill, Fragment, ensure_chain, packed
from nlproxy.proxy.planner import (
    FamilyPlanner,
    Plan,
    PortPart,
    gc_paused,
    merge_parts,
    plan,
    plan_context,
    prior_slots,
)
from nlproxy.proxy.skeleton import IPV4, IPV6, FamilySpec

_SPECS = {IPV4.family: IPV4, IPV6.family: IPV6}
_STATIC_SETS = frozenset({n.CLUSTER_CIDRS, n.SERVICE_CIDRS, n.NODEPORT_IPS, n.HAIRPIN})
"""Sets filled from the config or from every service together, never by one service."""


@dataclass(slots=True)
class LiveCounts:
    """One family's reference counts: how many fragment operations use each shared object."""

    ensures: dict[str, int] = field(default_factory=dict)
    """Shared chain name → number of ``Ensure`` operations naming it."""
    hairpin_extra: dict[int, int] = field(default_factory=dict)
    """Endpoint address (as an int) → how many more times than once fragments list it.

    A hairpin pair exists exactly while some fragment lists its address, so the pair itself
    stands for the first listing; only the repeats (an endpoint of two ports or services) are
    counted here, which leaves this empty in the common case instead of holding every endpoint.
    """


@dataclass(slots=True)
class Live:
    """What an in-place update needs besides the plan: counts, and the inputs it was made from."""

    counts: dict[Family, LiveCounts]
    services: Mapping[ServiceKey, object]
    slices: Mapping[ServiceKey, object]
    scratch: dict[Family, _Scratch] = field(default_factory=dict)


class _Scratch:
    """A family planner kept to plan changed services into: only the fragments it records are
    used, its own table is emptied each time (building one costs a skeleton)."""

    def __init__(self, spec: FamilySpec, snapshot: ClusterSnapshot, config: ProxyConfig) -> None:
        self.fp = FamilyPlanner(spec, snapshot, config)
        self._chains, self._sets = set(self.fp.rs.chains), set(self.fp.rs.sets)

    def reset(self) -> FamilyPlanner:
        rs = self.fp.rs
        for chain in [c for c in rs.chains if c not in self._chains]:
            del rs.chains[chain], rs.rules[chain]
        for name in [x for x in rs.sets if x not in self._sets]:
            del rs.sets[name], rs.elements[name]
        for els in rs.elements.values():
            els.clear()
        self.fp.hairpin.clear()
        return self.fp


def attach(p: Plan, snapshot: ClusterSnapshot) -> bool:
    """Count what ``p``'s services share, so later plans can update it in place.

    O(every fragment operation); run once after a full plan of ``snapshot``.

    Returns:
        False (and nothing attached) when two services write the same element, chain or set:
        undoing one of them could not tell what the other still needs.
    """
    p.live = None
    counts: dict[Family, LiveCounts] = {}
    with gc_paused():
        for family, frags in p.fragments.items():
            found = _count(p.rulesets[family], frags.values())
            if found is None:
                return False
            counts[family] = found
    p.live = Live(counts=counts, services=snapshot.services, slices=snapshot.slices)
    return True


def _count(rs: Ruleset, frags: Collection[Fragment]) -> LiveCounts | None:
    counts = LiveCounts()
    ensures = counts.ensures
    listed: dict[int, int] = {}  # endpoint address → times listed
    owned: set[tuple[type, str]] = set()
    claimed = 0
    for frag in frags:
        for op in frag.ops:
            t = type(op)
            if t is Element:
                claimed += 1
                if op.set in _STATIC_SETS:  # type: ignore[union-attr]
                    return None
            elif t is Fill:
                claimed += len(op.keys)  # type: ignore[union-attr]
            elif t is Ensure:
                ensures[op.name] = ensures.get(op.name, 0) + 1  # type: ignore[union-attr]
            elif t is not Rule:  # a chain, set or map of the service's own
                if (t, op.name) in owned:  # type: ignore[union-attr]
                    return None
                owned.add((t, op.name))  # type: ignore[union-attr]
        for ip in frag.hairpin:
            listed[int(ip)] = listed.get(int(ip), 0) + 1
    written = sum(len(els) for name, els in rs.elements.items() if name not in _STATIC_SETS)
    if claimed != written:
        # Some key is written twice: fine within one service (a ClusterIP per port), not by
        # two. Hashing every key is slow (ipaddress hashes in Python), so only now.
        claimed = sum(len(_element_ids(f)) for f in frags)
    if claimed != written or any((Chain, name) in owned for name in ensures):
        return None
    counts.hairpin_extra = {k: c - 1 for k, c in listed.items() if c > 1}
    return counts


def _element_ids(frag: Fragment) -> set[tuple[str, object]]:
    """Where the fragment's elements live: (set, key tuple), or (set, packed key)."""
    ids: set[tuple[str, object]] = set()
    for op in frag.ops:
        if isinstance(op, Element):
            ids.add((op.set, op.key))
        elif isinstance(op, Fill):
            ids.update((op.set, k) for k in op.keys)
    return ids


def plan_update(
    prev: Plan,
    snapshot: ClusterSnapshot,
    config: ProxyConfig,
    changed: Set[ServiceKey] | None = None,
) -> tuple[Plan, dict[Family, Delta] | None]:
    """The plan for ``snapshot``, made by updating ``prev`` in place where it can be.

    Args:
        prev: the last plan (consumed: do not use it afterwards).
        snapshot: the cluster objects now.
        config: the planner's configuration.
        changed: every service whose Service or EndpointSlices changed since ``prev`` was made
            (what ``ClusterState.apply`` reported, accumulated); None: found by comparing the
            objects with those ``prev`` was planned from (by identity, as replay does).

    Returns:
        The plan, and per family what changed in its ruleset; None instead of the deltas when
        the plan was made afresh (everything must be compared). A fresh plan is attached.
    """
    with gc_paused():
        deltas = _update(prev, snapshot, config, changed)
    if deltas is None:
        fresh = plan(snapshot, config, previous=prev)
        attach(fresh, snapshot)
        return fresh, None
    assert isinstance(prev.live, Live), "an update needs counts"
    prev.live.services, prev.live.slices = snapshot.services, snapshot.slices
    succ = Plan(rulesets=prev.rulesets, ports=prev.ports, fragments=prev.fragments)
    succ.context, succ.live = prev.context, prev.live
    return succ, deltas


def changed_services(prev: Plan, snapshot: ClusterSnapshot) -> set[ServiceKey]:
    """Services whose Service or slice objects are not the ones ``prev`` was planned from."""
    live, frags = prev.live, prev.fragments.get(Family.IP, {})
    if isinstance(live, Live):
        return changed_since(frags, snapshot, services=live.services, slices=live.slices)
    return changed_since(frags, snapshot)


def _update(
    prev: Plan,
    snapshot: ClusterSnapshot,
    config: ProxyConfig,
    changed: Set[ServiceKey] | None,
) -> dict[Family, Delta] | None:
    live = prev.live
    if not isinstance(live, Live) or prev.context != plan_context(snapshot, config):
        return None
    counts = live.counts
    if set(prev.fragments) != set(_SPECS) or set(counts) != set(_SPECS):
        return None
    keys = _keys(prev, snapshot, changed)
    if keys is None:
        return None
    new: dict[Family, list[tuple[ServiceKey, Fragment | None]]] = {}
    for family, spec in _SPECS.items():
        if family not in live.scratch:
            live.scratch[family] = _Scratch(spec, snapshot, config)
        scratch = live.scratch[family].reset()
        new[family] = _replan(scratch, prev.fragments[family], snapshot, keys)
        if not _safe(prev.rulesets[family], counts[family], prev.fragments[family], new[family]):
            return None
    old_refs = {ref for key in keys for ref in _refs(prev, key)}
    deltas = {}
    for family in _SPECS:
        rs, frags = prev.rulesets[family], prev.fragments[family]
        deltas[family] = _swap(rs, counts[family], frags, new[family])
    _update_ports(prev, keys, old_refs)
    return deltas


def _refs(p: Plan, key: ServiceKey) -> Iterable[ServicePortRef]:
    for frags in p.fragments.values():
        frag = frags.get(key)
        for piece in frag.pieces if frag is not None else ():
            assert isinstance(piece, PortPart), "fragments hold port parts"
            yield piece.ref


def _keys(
    prev: Plan, snapshot: ClusterSnapshot, changed: Set[ServiceKey] | None
) -> list[ServiceKey] | None:
    """The changed services that were or are planned, sorted; None if ``changed`` cannot be
    right (the number of services would not add up)."""
    frags = prev.fragments[Family.IP]
    if changed is None:
        changed = changed_services(prev, snapshot)
    keys = sorted(k for k in changed if k in frags or k in snapshot.services)
    added = sum(1 for k in keys if k not in frags and k in snapshot.services)
    removed = sum(1 for k in keys if k in frags and k not in snapshot.services)
    if len(frags) + added - removed != len(snapshot.services):
        return None
    return keys


def _replan(
    scratch: FamilyPlanner,
    old: Mapping[ServiceKey, Fragment],
    snapshot: ClusterSnapshot,
    keys: list[ServiceKey],
) -> list[tuple[ServiceKey, Fragment | None]]:
    """New fragments of the changed services (None: removed), planned into a scratch table;
    endpoints keep the backends slots the old fragments gave them (``slots.py``)."""
    out: list[tuple[ServiceKey, Fragment | None]] = []
    for key in keys:
        svc = snapshot.services.get(key)
        frag = None
        if svc is not None:
            scratch.prior = prior_slots(old.get(key))
            frag = scratch.add_service(svc, snapshot.slices.get(key, ()))
        out.append((key, frag))
    scratch.prior = {}
    return out


def _safe(
    rs: Ruleset,
    live: LiveCounts,
    old: dict[ServiceKey, Fragment],
    new: list[tuple[ServiceKey, Fragment | None]],
) -> bool:
    """Whether the new fragments keep every element, chain and set to one writer."""
    gone: set[object] = set()
    for key, _ in new:
        frag = old.get(key)
        for op in frag.ops if frag is not None else ():
            match op:
                case Element():
                    gone.add((op.set, op.key))
                case Fill():
                    gone.update((op.set, k) for k in op.keys)
                case Rule() | Ensure():
                    continue
                case _:
                    gone.add((type(op), op.name))
    claims: dict[object, ServiceKey] = {}
    for key, frag in new:
        if frag is not None and not _safe_one(rs, live, gone, claims, key, frag):
            return False
    return True


def _safe_one(
    rs: Ruleset,
    live: LiveCounts,
    gone: set[object],
    claims: dict[object, ServiceKey],
    key: ServiceKey,
    frag: Fragment,
) -> bool:
    mine: set[str] = set()
    own_sets: set[str] = set()  # elements may go into the service's own maps (balance.py)
    for op in frag.ops:
        ident: object
        match op:
            case Rule():
                if op.chain not in mine:  # rules only go into the service's own chains
                    return False
                continue
            case Ensure():
                shared_here = ("shared", op.name)
                claims[shared_here] = claims.get(shared_here, key)
                taken = op.name in rs.chains and op.name not in live.ensures
                if taken or (Chain, op.name) in claims:
                    return False
                continue
            case Element():
                if op.set in _STATIC_SETS or (op.set not in rs.elements and op.set not in own_sets):
                    return False
                ident, exists = (op.set, op.key), op.key in rs.elements.get(op.set, ())
            case Fill():
                raw = packed(rs, op.set).raw
                for k in op.keys:
                    if claims.setdefault((op.set, k), key) != key or (
                        k in raw and (op.set, k) not in gone
                    ):
                        return False
                continue
            case Chain():
                ident, exists = (Chain, op.name), op.name in rs.chains
                if ("shared", op.name) in claims:
                    return False
                mine.add(op.name)
            case _:
                ident, exists = (type(op), op.name), op.name in rs.sets
                own_sets.add(op.name)
        if claims.setdefault(ident, key) != key or (exists and ident not in gone):
            return False
    return True


def _swap(
    rs: Ruleset,
    live: LiveCounts,
    frags: dict[ServiceKey, Fragment],
    new: list[tuple[ServiceKey, Fragment | None]],
) -> Delta:
    """Undo the old fragments, apply the new ones, and return what differs."""
    olds = [f for f in (frags.get(k) for k, _ in new) if f is not None]
    news = [f for _, f in new if f is not None]
    touched = _Touched(rs)
    for frag in (*olds, *news):
        touched.note(frag)
    for frag in olds:
        _undo(rs, live, frag)
    for frag in news:
        _apply(rs, live, frag)
    for key, replacement in new:
        if replacement is None:
            frags.pop(key, None)
        else:
            frags[key] = replacement
    return touched.delta()


class _Touched:
    """The objects some fragment of an update names, with their values before it."""

    def __init__(self, rs: Ruleset) -> None:
        self.rs = rs
        self.elements: dict[ElementId, Element | None] = {}
        self.packed: dict[tuple[str, bytes], bytes | None] = {}
        """Elements of packed maps by packed key: compared as bytes, decoded when they differ."""
        self.chains: dict[str, ChainState | None] = {}
        self.sets: dict[str, NftSet | Map | None] = {}

    def note(self, frag: Fragment) -> None:
        rs, elements = self.rs, self.elements
        for op in frag.ops:
            match op:
                case Element():
                    ident: ElementId = (op.set, op.key)
                    if ident not in elements:
                        elements[ident] = rs.elements.get(op.set, {}).get(op.key)
                case Fill():
                    self._note_packed(op.set, op.keys)
                case Ensure() | Chain():
                    if op.name not in self.chains:
                        self.chains[op.name] = _chain_state(rs, op.name)
                case Rule():
                    continue
                case _:
                    if op.name not in self.sets:
                        self.sets[op.name] = rs.sets.get(op.name)
        if frag.hairpin:
            pairs = packed(rs, n.HAIRPIN)
            self._note_packed(n.HAIRPIN, pairs.pack_keys([(ip, ip) for ip in frag.hairpin]))

    def _note_packed(self, name: str, keys: Iterable[bytes]) -> None:
        raw, seen = packed(self.rs, name).raw, self.packed
        for k in keys:
            ident = (name, k)
            if ident not in seen:
                seen[ident] = raw.get(k)

    def delta(self) -> Delta:
        rs, out = self.rs, Delta()
        # Decoded only where they differ: the delta names elements as the reconciler does.
        for (name, k), b in self.packed.items():
            store = packed(rs, name)
            a = store.raw.get(k)
            if a != b:
                out.elements[(name, store.decode_key(k))] = (
                    None if b is None else store.element(k, b),
                    None if a is None else store.element(k, a),
                )
        for ident, before in self.elements.items():
            after = rs.elements.get(ident[0], {}).get(ident[1])
            if before is not after and before != after:
                out.elements[ident] = (before, after)
        for name, set_before in self.sets.items():
            set_after = rs.sets.get(name)
            if set_before != set_after:
                out.sets[name] = (set_before, set_after)
        # A redefined set is recreated, so every chain using it is rewritten: list them all
        # (only the updated services' own chains can use their sets).
        redefined = any(b is not None and a is not None for b, a in out.sets.values())
        for name, chain_before in self.chains.items():
            chain_after = _chain_state(rs, name)
            if chain_before != chain_after or (redefined and chain_after is not None):
                out.chains[name] = (chain_before, chain_after)
        return out


def _chain_state(rs: Ruleset, name: str) -> ChainState | None:
    chain = rs.chains.get(name)
    return None if chain is None else (chain, tuple(rs.rules.get(name, ())))


def _undo(rs: Ruleset, live: LiveCounts, frag: Fragment) -> None:
    """Take one service's fragment out of the ruleset (it is the only writer of its objects)."""
    for op in frag.ops:
        match op:
            case Element():  # its own map (balance.py) may be gone already
                rs.elements.get(op.set, {}).pop(op.key, None)
            case Fill():
                raw = packed(rs, op.set).raw
                for k in op.keys:
                    raw.pop(k, None)
            case Ensure():
                left = live.ensures[op.name] - 1
                if left:
                    live.ensures[op.name] = left
                else:
                    del live.ensures[op.name]
                    _drop_chain(rs, op.name)
            case Chain():
                _drop_chain(rs, op.name)
            case Rule():
                continue  # gone with its chain
            case _:
                rs.sets.pop(op.name, None)
                rs.elements.pop(op.name, None)
    _hairpin(rs, live, frag.hairpin, -1)


def _apply(rs: Ruleset, live: LiveCounts, frag: Fragment) -> None:
    """Put one service's fragment into the ruleset, as a fresh plan's replay would."""
    for op in frag.ops:
        match op:
            case Element():
                rs.elements[op.set][op.key] = op
            case Fill():
                packed(rs, op.set).raw.update(zip(op.keys, op.data, strict=True))
            case Ensure():
                live.ensures[op.name] = live.ensures.get(op.name, 0) + 1
                ensure_chain(rs, op.name, op.rules)
            case Chain():
                rs.add_chain(op)
            case Rule():
                rs.add_rule(op)
            case _:
                rs.add_set(op)
    _hairpin(rs, live, frag.hairpin, 1)


def _drop_chain(rs: Ruleset, name: str) -> None:
    rs.chains.pop(name, None)
    rs.rules.pop(name, None)


def _hairpin(rs: Ruleset, live: LiveCounts, ips: list[IPAddress], step: int) -> None:
    """Count endpoint addresses in or out; a pair exists while some service lists the address
    (the pair counts the first listing, ``hairpin_extra`` the others)."""
    if not ips:
        return
    store, extra = packed(rs, n.HAIRPIN), live.hairpin_extra
    pairs = store.raw
    for ip, key in zip(ips, store.pack_keys([(ip, ip) for ip in ips]), strict=True):
        k = int(ip)
        more = extra.get(k, 0)
        if step > 0:
            if key in pairs:
                extra[k] = more + 1
            else:
                pairs[key] = b""
        elif more > 1:
            extra[k] = more - 1
        elif more:
            del extra[k]
        else:
            pairs.pop(key, None)


def _update_ports(prev: Plan, keys: list[ServiceKey], old_refs: set[ServicePortRef]) -> None:
    """Replace the changed services' port summaries (both families' parts, ``ip`` first)."""
    parts: dict[ServicePortRef, list[PortPart]] = {}
    for key in keys:
        for family in _SPECS:
            frag = prev.fragments[family].get(key)
            for piece in frag.pieces if frag is not None else ():
                assert isinstance(piece, PortPart), "fragments hold port parts"
                parts.setdefault(piece.ref, []).append(piece)
    for ref in old_refs - parts.keys():
        del prev.ports[ref]
    for ref, p in parts.items():
        prev.ports[ref] = merge_parts(ref, p)
