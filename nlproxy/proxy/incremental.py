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

import operator
from collections import Counter, deque
from collections.abc import Collection, Iterable, Mapping, Set
from dataclasses import dataclass, field
from itertools import chain as concat
from itertools import compress, repeat
from operator import attrgetter

from nlproxy.cluster.model import ClusterSnapshot, ServiceKey, ServicePortRef
from nlproxy.nft.ir import Chain, Element, Family, Map, Rule, Ruleset, Value
from nlproxy.nft.ir import Set as NftSet
from nlproxy.nft.packed import PackedElements
from nlproxy.nft.reconcile import ChainState, Delta, ElementId
from nlproxy.proxy import naming as n
from nlproxy.proxy.changes import changed_since
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.endpoints import addresses
from nlproxy.proxy.fragments import Ensure, Fill, Fragment, ensure_chain, packed
from nlproxy.proxy.planner import (
    FamilyPlanner,
    Plan,
    PortPart,
    hairpin_of,
    merge_parts,
    plan,
    plan_context,
    prior_slots,
)
from nlproxy.proxy.skeleton import IPV4, IPV6, FamilySpec
from nlproxy.proxy.sorted_ops import Fills, SortedOps
from nlproxy.runtime.hotpath import collection_paused

_SPECS = {IPV4.family: IPV4, IPV6.family: IPV6}
_STATIC_SETS = frozenset({n.CLUSTER_CIDRS, n.SERVICE_CIDRS, n.NODEPORT_IPS, n.HAIRPIN})
"""Sets filled from the config or from every service together, never by one service."""
REPLAN_SHARE = 1.0
"""From this share of the services changed on, the plan is made afresh and compared with the
last one instead of updated in place. Measured at 10k Services x 10 endpoints
(``bench/bench_burst.py``, CPU seconds afresh / in place): 2.5 at 10% changed, 1.2 at 50%,
1.0-1.03 at 90-100% (one earlier run: 0.95 at 100%); a fresh plan also holds two plans at
once. So only when every service changed, where the two cost the same and a fresh plan sheds
whatever an in-place history left behind (dictionary order, scratch tables)."""
_ip_int = attrgetter("_ip")
"""An address's int, without a Python-level call (as the planner packs hairpin pairs)."""


@dataclass(slots=True)
class LiveCounts:
    """One family's reference counts: how many fragment operations use each shared object."""

    ensures: dict[str, int] = field(default_factory=dict)
    """Shared chain name → number of ``Ensure`` operations naming it."""
    hairpin_extra: dict[bytes, int] = field(default_factory=dict)
    """Hairpin pair (packed ``a . a``) → how many more times than once fragments list ``a``.

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
    with collection_paused():
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
    listed: list[int] = []  # each hairpin address listed, as its int
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
        if frag.pieces:
            hairpin_ints(frag, listed)
    written = sum(len(els) for name, els in rs.elements.items() if name not in _STATIC_SETS)
    if claimed != written:
        # Some key is written twice: fine within one service (a ClusterIP per port), not by
        # two. Hashing every key is slow (ipaddress hashes in Python), so only now.
        claimed = sum(len(_element_ids(f)) for f in frags)
    if claimed != written or any((Chain, name) in owned for name in ensures):
        return None
    counts.hairpin_extra = _listed_again(rs, listed)
    return counts


def hairpin_ints(frag: Fragment, out: list[int]) -> None:
    """Append to ``out`` the addresses ``planner.hairpin_of`` lists, as ints, in its order,
    without a generator step per address (``attach`` lists every address of a cold plan)."""
    extend = out.extend
    for piece in frag.pieces:
        assert isinstance(piece, PortPart), "fragments hold port parts"
        cat = piece.cat
        extend(map(_ip_int, addresses(cat.cluster)))
        if cat.local:
            extend(map(_ip_int, addresses(cat.local)))


def _listed_again(rs: Ruleset, listed: list[int]) -> dict[bytes, int]:
    """Hairpin pair → how many times more than once its address is listed. A pair is its
    address packed twice, so the addresses are counted as ints (C-speed hashing) and only the
    ones listed again are packed; most clusters list each address once."""
    if len(set(listed)) == len(listed):
        return {}
    again = [(ip, c - 1) for ip, c in Counter(listed).items() if c > 1]
    pairs = packed(rs, n.HAIRPIN).pack_pairs(ip for ip, _ in again)
    return {pair: extra for pair, (_, extra) in zip(pairs, again, strict=True)}


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
    *,
    replan_share: float = REPLAN_SHARE,
    deltas: bool = True,
) -> tuple[Plan, dict[Family, Delta] | None]:
    """The plan for ``snapshot``, made by updating ``prev`` in place where it can be.

    Args:
        prev: the last plan (consumed: do not use it afterwards).
        snapshot: the cluster objects now.
        config: the planner's configuration.
        changed: every service whose Service or EndpointSlices changed since ``prev`` was made
            (what ``ClusterState.apply`` reported, accumulated); None: found by comparing the
            objects with those ``prev`` was planned from (by identity, as replay does).
        replan_share: from this share of the services changed on, the plan is made afresh
            (unchanged services replayed) and the deltas found by comparing the changed
            services' objects in it and in ``prev``: cheaper than swapping that many fragments.
        deltas: find what changed (False: only the plan is wanted, as a plan made ahead of a
            commit follows the pages: the same plan, without noting what each update touched).

    Returns:
        The plan, and per family what changed in its ruleset; None instead of the deltas when
        the plan was made afresh and not compared (everything must be), or when ``deltas``
        is False. A fresh plan is attached.
    """
    with collection_paused():
        keys = _keys_if_in_place(prev, snapshot, config, changed)
        if keys is not None and len(keys) >= max(replan_share * len(snapshot.services), 1):
            return _replanned(prev, snapshot, config, keys, deltas=deltas)
        found = None if keys is None else _update(prev, snapshot, config, keys, deltas=deltas)
    if found is None:
        fresh = plan(snapshot, config, previous=prev)
        attach(fresh, snapshot)
        return fresh, None
    assert isinstance(prev.live, Live), "an update needs counts"
    prev.live.services, prev.live.slices = snapshot.services, snapshot.slices
    succ = Plan(rulesets=prev.rulesets, ports=prev.ports, fragments=prev.fragments)
    succ.context, succ.live = prev.context, prev.live
    return succ, found if deltas else None


def _replanned(
    prev: Plan,
    snapshot: ClusterSnapshot,
    config: ProxyConfig,
    keys: list[ServiceKey],
    *,
    deltas: bool,
) -> tuple[Plan, dict[Family, Delta] | None]:
    """A fresh plan (unchanged services replayed, slots kept) and its deltas from ``prev``
    when asked: the objects the changed services' old and new fragments name, compared between
    the two plans (nothing else can differ: the context is the same)."""
    fresh = plan(snapshot, config, previous=prev)
    if not attach(fresh, snapshot) or not deltas:
        return fresh, None
    found: dict[Family, Delta] = {}
    for family in _SPECS:
        olds = [f for f in map(prev.fragments[family].get, keys) if f is not None]
        news = [f for f in map(fresh.fragments[family].get, keys) if f is not None]
        before, after = prev.rulesets[family], fresh.rulesets[family]
        found[family] = _noted(before, olds, news, SortedOps(olds), SortedOps(news)).delta(after)
    return fresh, found


def changed_services(prev: Plan, snapshot: ClusterSnapshot) -> set[ServiceKey]:
    """Services whose Service or slice objects are not the ones ``prev`` was planned from."""
    live, frags = prev.live, prev.fragments.get(Family.IP, {})
    if isinstance(live, Live):
        return changed_since(frags, snapshot, services=live.services, slices=live.slices)
    return changed_since(frags, snapshot)


def _keys_if_in_place(
    prev: Plan, snapshot: ClusterSnapshot, config: ProxyConfig, changed: Set[ServiceKey] | None
) -> list[ServiceKey] | None:
    """The changed services, when ``prev`` can be updated in place for them at all."""
    live = prev.live
    if not isinstance(live, Live) or prev.context != plan_context(snapshot, config):
        return None
    if set(prev.fragments) != set(_SPECS) or set(live.counts) != set(_SPECS):
        return None
    return _keys(prev, snapshot, changed)


def _update(
    prev: Plan,
    snapshot: ClusterSnapshot,
    config: ProxyConfig,
    keys: list[ServiceKey],
    *,
    deltas: bool,
) -> dict[Family, Delta] | None:
    """``prev`` updated in place for ``keys`` and its deltas if asked; None: it cannot be."""
    live = prev.live
    assert isinstance(live, Live), "an update needs counts"
    counts = live.counts
    new: dict[Family, list[tuple[ServiceKey, Fragment | None]]] = {}
    olds: dict[Family, tuple[list[Fragment], SortedOps, SortedOps]] = {}
    for family, spec in _SPECS.items():
        if family not in live.scratch:
            live.scratch[family] = _Scratch(spec, snapshot, config)
        scratch = live.scratch[family].reset()
        frags = prev.fragments[family]
        new[family] = _replan(scratch, frags, snapshot, keys)
        mine = [f for f in map(frags.get, keys) if f is not None]
        sorted_olds = SortedOps(mine)
        sorted_news = SortedOps([f for _, f in new[family] if f is not None])
        if not _safe(prev.rulesets[family], counts[family], sorted_olds, sorted_news):
            return None
        olds[family] = (mine, sorted_olds, sorted_news)
    old_refs = {ref for key in keys for ref in _refs(prev, key)}
    found: dict[Family, Delta] = {}
    for family in _SPECS:
        rs, frags = prev.rulesets[family], prev.fragments[family]
        delta = _swap(rs, counts[family], frags, new[family], *olds[family], deltas=deltas)
        if delta is not None:
            found[family] = delta
    _update_ports(prev, keys, old_refs)
    return found


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


def _safe(rs: Ruleset, live: LiveCounts, olds: SortedOps, news: SortedOps) -> bool:
    """Whether the new fragments keep every element, chain and set to one writer: each is
    written by one new fragment, and is not in the ruleset unless an old fragment of the
    update wrote it; rules and elements go only into the writer's own chains and sets (or
    the global maps), shared chains are only ever shared."""
    gone: set[object] = {(Chain, op.name) for op, _ in olds.chains}
    gone.update((type(op), op.name) for op, _ in olds.sets)
    claims: dict[object, int] = {}
    for obj, i in news.chains:
        ident = (Chain, obj.name)
        if claims.setdefault(ident, i) != i or (obj.name in rs.chains and ident not in gone):
            return False
    for s, i in news.sets:
        sid = (type(s), s.name)
        if claims.setdefault(sid, i) != i or (s.name in rs.sets and sid not in gone):
            return False
    for ensure, _ in news.ensures:
        name = ensure.name
        if (Chain, name) in claims or (name in rs.chains and name not in live.ensures):
            return False
    own_chains = {op.name: i for op, i in news.chains}
    if any(own_chains.get(rule.chain) != i for rule, i in news.rules):
        return False  # rules only go into the service's own chains
    if news.elements and not _safe_elements(rs, olds, news):
        return False
    return _safe_fills(rs, olds.fills, news.fills)


def _safe_elements(rs: Ruleset, olds: SortedOps, news: SortedOps) -> bool:
    own_sets = {s.name: i for s, i in news.sets}  # elements may go into the service's own
    gone = {(el.set, el.key) for el, _ in olds.elements}  # maps (balance.py)
    claims: dict[tuple[str, tuple[Value, ...]], int] = {}
    for el, i in news.elements:
        name = el.set
        store = rs.elements.get(name)
        if name in _STATIC_SETS or (store is None and own_sets.get(name) != i):
            return False
        ident = (name, el.key)
        if claims.setdefault(ident, i) != i:
            return False
        if store is not None and el.key in store and ident not in gone:
            return False
    return True


def _safe_fills(rs: Ruleset, olds: Fills, news: Fills) -> bool:
    """Whether no packed key is written by two of the new fragments, nor is already in its
    map unless an old fragment of the update wrote it: per map, in a few set operations."""
    for name, (keys, _, owners) in news.items():
        store = rs.elements.get(name)
        if not isinstance(store, PackedElements) or name in _STATIC_SETS:
            return False
        mine = dict(zip(keys, owners, strict=True))
        if len(mine) != len(keys):  # a key written twice: fine by one service, not by two
            first: dict[bytes, int] = {}
            if any(first.setdefault(k, o) != o for k, o in zip(keys, owners, strict=True)):
                return False
        taken = store.raw.keys() & mine.keys()
        if taken and not taken <= set(olds.get(name, ((), (), ()))[0]):
            return False
    return True


def _swap(
    rs: Ruleset,
    live: LiveCounts,
    frags: dict[ServiceKey, Fragment],
    new: list[tuple[ServiceKey, Fragment | None]],
    olds: list[Fragment],
    sorted_olds: SortedOps,
    sorted_news: SortedOps,
    *,
    deltas: bool,
) -> Delta | None:
    """Undo the old fragments, apply the new ones, and return what differs (None: not asked).

    Each kind of operation is handled for all fragments together; the packed maps' elements
    (most of what a service writes) with dictionary operations that run at C speed: a burst
    of thousands of services costs a few passes over their keys, not a Python loop per
    service and key.
    """
    news = [f for _, f in new if f is not None]
    touched = _noted(rs, olds, news, sorted_olds, sorted_news) if deltas else None
    old_pairs, new_pairs = touched.pairs if touched is not None else _net_pairs(rs, olds, news)
    for name, (keys, _, _) in sorted_olds.fills.items():
        _pop_all(packed(rs, name).own(), keys)
    if old_pairs:  # (own(): a copy of a map the programmed state shares, only if written)
        _unpair(packed(rs, n.HAIRPIN).own(), live.hairpin_extra, old_pairs)
    _undo(rs, live, sorted_olds)
    _apply(rs, live, sorted_news)
    for name, (keys, data, _) in sorted_news.fills.items():
        packed(rs, name).own().update(zip(keys, data, strict=True))
    if new_pairs:
        _pair(packed(rs, n.HAIRPIN).own(), live.hairpin_extra, new_pairs)
    for key, replacement in new:
        if replacement is None:
            frags.pop(key, None)
        else:
            frags[key] = replacement
    return None if touched is None else touched.delta()


def _noted(
    rs: Ruleset, olds: list[Fragment], news: list[Fragment], old_ops: SortedOps, new_ops: SortedOps
) -> _Touched:
    """Every object the fragments name, with its value in ``rs``."""
    touched = _Touched(rs)
    for ops in (old_ops, new_ops):
        touched.note(ops)
    old_fills, new_fills = old_ops.fills, new_ops.fills
    for name in old_fills.keys() | new_fills.keys():
        noted = concat(old_fills.get(name, ((),))[0], new_fills.get(name, ((),))[0])
        touched.note_packed(name, noted)
    old_pairs, new_pairs = _net_pairs(rs, olds, news)
    touched.note_packed(n.HAIRPIN, concat(old_pairs, new_pairs))
    touched.pairs = (old_pairs, new_pairs)
    return touched


def _net_pairs(
    rs: Ruleset, olds: list[Fragment], news: list[Fragment]
) -> tuple[list[bytes], list[bytes]]:
    """The hairpin listings the update takes out and puts in, less those it keeps (an
    endpoint that stays is listed again): as packed pairs, each as often as it goes or comes.

    Only an address whose listings change can gain or lose its pair, so counting these in and
    out leaves the pairs and counts that counting every old listing out and every new one in
    leaves. Addresses as ints (set operations at C speed; ``ipaddress`` hashes in Python).
    """
    was = list(map(_ip_int, concat.from_iterable(map(hairpin_of, olds))))
    now = list(map(_ip_int, concat.from_iterable(map(hairpin_of, news))))
    before, after = set(was), set(now)
    if len(before) == len(was) and len(after) == len(now):  # each listed once: the usual case
        return _pairs_of(rs, before - after), _pairs_of(rs, after - before)
    gone, came = Counter(was), Counter(now)
    gone.subtract(now)
    came.subtract(was)
    return _pairs_of(rs, gone.elements()), _pairs_of(rs, came.elements())


def _pairs_of(rs: Ruleset, addresses: Iterable[int]) -> list[bytes]:
    return packed(rs, n.HAIRPIN).pack_pairs(addresses)


def _pop_all(raw: dict[bytes, bytes], keys: Iterable[bytes]) -> None:
    """Remove every key of ``keys`` present in ``raw`` (C speed: no Python frame per key)."""
    deque(map(raw.pop, keys, repeat(None)), maxlen=0)


class _Touched:
    """The objects some fragment of an update names, with their values before it."""

    def __init__(self, rs: Ruleset) -> None:
        self.rs = rs
        self.elements: dict[ElementId, Element | None] = {}
        self.packed: dict[str, dict[bytes, bytes | None]] = {}
        """Elements of packed maps by packed key: compared as bytes, never decoded."""
        self.chains: dict[str, ChainState | None] = {}
        self.sets: dict[str, NftSet | Map | None] = {}
        self.pairs: tuple[list[bytes], list[bytes]] = ([], [])
        """The hairpin pairs the old and the new fragments list (packed, in order)."""

    def note(self, ops: SortedOps) -> None:
        """Note the objects of ``ops`` but their ``Fill`` s (``note_packed``)."""
        rs, elements, chains, sets = self.rs, self.elements, self.chains, self.sets
        for el, _ in ops.elements:
            ident: ElementId = (el.set, el.key)
            if ident not in elements:
                elements[ident] = rs.elements.get(el.set, {}).get(el.key)
        for name in concat((op.name for op, _ in ops.ensures), (op.name for op, _ in ops.chains)):
            if name not in chains:
                chains[name] = _chain_state(rs, name)
        for s, _ in ops.sets:
            if s.name not in sets:
                sets[s.name] = rs.sets.get(s.name)

    def note_packed(self, name: str, keys: Iterable[bytes]) -> None:
        """Note the packed elements ``keys`` of map ``name`` (once per map and update)."""
        assert name not in self.packed, "each packed map is noted once"
        found = dict.fromkeys(keys)
        store = self.rs.elements.get(name)
        if isinstance(store, PackedElements) and found:
            found = dict(zip(found, map(store.raw.get, found), strict=True))
        self.packed[name] = found

    def delta(self, after: Ruleset | None = None) -> Delta:
        """What differs between the noted values and those in ``after`` (None: the ruleset
        noted from, changed since)."""
        rs, out = self.rs if after is None else after, Delta()
        for name, had in self.packed.items():
            store = rs.elements.get(name)
            if not isinstance(store, PackedElements) or not had:
                continue
            get = store.raw.get
            differ = list(compress(had, map(operator.ne, had.values(), map(get, had))))
            if differ:
                out.packed[name] = {k: (had[k], get(k)) for k in differ}
        for ident, before in self.elements.items():
            now = rs.elements.get(ident[0], {}).get(ident[1])
            if before is not now and before != now:
                out.elements[ident] = (before, now)
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


def _undo(rs: Ruleset, live: LiveCounts, ops: SortedOps) -> None:
    """Take the old fragments out of the ruleset (each the only writer of its objects), but
    their ``Fill`` s and hairpin pairs (``_swap`` takes those out per map)."""
    for el, _ in ops.elements:  # its own map (balance.py) may be gone already
        rs.elements.get(el.set, {}).pop(el.key, None)
    ensures = live.ensures
    for ensure, _ in ops.ensures:
        left = ensures[ensure.name] - 1
        if left:
            ensures[ensure.name] = left
        else:
            del ensures[ensure.name]
            _drop_chain(rs, ensure.name)
    for chain, _ in ops.chains:  # its rules go with it
        _drop_chain(rs, chain.name)
    for s, _ in ops.sets:
        rs.sets.pop(s.name, None)
        rs.elements.pop(s.name, None)


def _apply(rs: Ruleset, live: LiveCounts, ops: SortedOps) -> None:
    """Put the new fragments into the ruleset, as a fresh plan's replay would, but their
    ``Fill`` s and hairpin pairs (``_swap`` puts those in per map). Kind by kind: sets before
    their elements, chains before their rules (each chain's rules in order)."""
    for s, _ in ops.sets:
        rs.add_set(s)
    for chain, _ in ops.chains:
        rs.add_chain(chain)
    ensures = live.ensures
    for ensure, _ in ops.ensures:
        ensures[ensure.name] = ensures.get(ensure.name, 0) + 1
        ensure_chain(rs, ensure.name, ensure.rules)
    for rule, _ in ops.rules:
        rs.add_rule(rule)
    for el, _ in ops.elements:
        rs.elements[el.set][el.key] = el


def _drop_chain(rs: Ruleset, name: str) -> None:
    rs.chains.pop(name, None)
    rs.rules.pop(name, None)


def _unpair(pairs: dict[bytes, bytes], extra: dict[bytes, int], keys: list[bytes]) -> None:
    """Count the hairpin listings ``keys`` out: a pair goes with its address's last listing
    (the pair counts the first, ``extra`` the others)."""
    if not extra:  # every address listed once: each pair goes
        _pop_all(pairs, keys)
        return
    for key in keys:
        more = extra.get(key, 0)
        if more > 1:
            extra[key] = more - 1
        elif more:
            del extra[key]
        else:
            pairs.pop(key, None)


def _pair(pairs: dict[bytes, bytes], extra: dict[bytes, int], keys: list[bytes]) -> None:
    """Count the hairpin listings ``keys`` in: a new pair, or one more listing of it."""
    fresh = dict.fromkeys(keys, b"")
    if len(fresh) == len(keys) and pairs.keys().isdisjoint(fresh):
        pairs.update(fresh)  # no address listed before nor twice here: all new pairs
        return
    for key in keys:
        if key in pairs:
            extra[key] = extra.get(key, 0) + 1
        else:
            pairs[key] = b""


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
