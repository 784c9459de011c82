"""Services kept as programmed while a source cannot read where they are.

A manifest file that does not parse (or is caught empty) when the daemon starts holds objects
nobody knows: the snapshot lacks its Services (``ClusterSnapshot.unread`` names the file), but
the tables still hold what the previous process programmed for them. Deleting that would cut
their traffic until the file is fixed, for no change anyone made. So while ``unread`` names
anything, the Syncer plans what it knows and keeps, beside it, the objects of the tables as it
found them at start that belong to Services it has never seen (:class:`Keeper`): no delete and
no conntrack flush for them, and no restart record that says they are gone. Once every place is
read, the next sync compares everything and deletes what is really gone. Meanwhile every sync
takes the full path (plan in place, compare whole tables): the plan alone is not what is
programmed, so a delta of it cannot stand for the difference.

Which objects are a Service's: the elements of the per-frontend maps (``layout.py``'s
``ADDRESS_KEYED`` / ``NODEPORT_KEYED``) of every frontend whose commented element (dispatch or
no-endpoint) names it, the chains and sets those reference (the shared dispatch chains, a
ClientIP-affinity or balanced port's own), its ClusterIPs in ``cluster-ips`` and its endpoints'
``hairpin`` pairs. A frontend the plan now gives another Service is the plan's.

Pure but for :class:`Keeper`'s memory of what was seen: no I/O, clock or logging.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from copy import copy
from dataclasses import replace

from nlproxy.cluster.model import ClusterSnapshot
from nlproxy.nft.ir import Dnat, ElementMap, Family, Rule, Ruleset, Value, Verdict, names
from nlproxy.nft.packed import PackedElements
from nlproxy.nft.reconcile import programmed_fingerprint
from nlproxy.proxy import naming as n
from nlproxy.proxy.layout import ADDRESS_KEYED, NODEPORT_KEYED, FrontKey, element_front, target

_KEYED = (*ADDRESS_KEYED, *NODEPORT_KEYED)
_COMMENTED = (n.SERVICE_IPS, n.SERVICE_NODEPORTS, n.NO_ENDPOINT_SERVICES, n.NO_ENDPOINT_NODEPORTS)
"""The maps whose elements name their service port in a comment (``ns/name:port/PROTO``)."""


def _service(comment: str) -> str:
    """``ns/name`` of a service port's comment."""
    return comment.split(":", 1)[0]


def _unstamped(rs: Ruleset, chain: str) -> list[Rule]:
    """``chain``'s rules as planned: without the fingerprint a read-back's comments carry
    (the diff stamps them again) and without handles."""
    out = []
    for rule in rs.rules.get(chain, []):
        comment = rule.comment
        if programmed_fingerprint(rule) is not None:
            comment = comment.rsplit("fp=", 1)[0].rstrip()
        out.append(replace(rule, comment=comment, handle=None))
    return out


def kept_fronts(
    start: Ruleset, desired: Ruleset, known: Set[str], released: Set[FrontKey]
) -> tuple[set[FrontKey], set[FrontKey]]:
    """The frontends of ``start`` (a table read back when this process started) whose commented
    element names a service not in ``known`` (``ns/name``) and that neither ``desired`` nor
    ``released`` claims (those kept), and the ones ``desired`` claims (released from now on:
    a frontend the plan took once is the plan's, even once it no longer holds it)."""
    claimed: set[FrontKey] = set()
    for name in _COMMENTED:
        for key in desired.elements.get(name, {}):
            fk = element_front(name, key)
            if fk is not None:
                claimed.add(fk)
    fronts: set[FrontKey] = set()
    taken: set[FrontKey] = set()
    for name in _COMMENTED:
        for key, el in start.elements.get(name, {}).items():
            if el.comment and _service(el.comment) not in known:
                fk = element_front(name, key)
                if fk is None or fk in released:
                    continue
                (taken if fk in claimed else fronts).add(fk)
    return fronts, taken


def kept_objects(start: Ruleset, desired: Ruleset, fronts: Set[FrontKey]) -> Ruleset:
    """The objects of ``start`` (a table read back when this process started) of ``fronts``
    (:func:`kept_fronts`) that ``desired`` lacks, with every chain and set they reference that
    ``desired`` lacks: what :func:`merged` adds to ``desired``."""
    out = Ruleset(table=desired.table)
    if not fronts:
        return out
    chains: list[str] = []
    sets: list[str] = []
    endpoints: set[object] = set()
    for name in _KEYED:
        have = start.elements.get(name)
        if not have or name not in desired.sets:
            continue
        want = desired.elements.get(name, {})
        if isinstance(have, PackedElements):
            found: dict[bytes, bytes] = {}
            raw = want.raw if isinstance(want, PackedElements) else {}
            heads: dict[bytes, bool] = {}
            for k, d in have.raw.items():
                if k in raw:
                    continue
                head = k[:-4]  # a backends map's index is its last 4 bytes
                mine = heads.get(head)
                if mine is None:
                    mine = heads[head] = element_front(name, have.decode_key(k)) in fronts
                if mine:
                    found[k] = d
                    t = target(have.decode_data(d))
                    if t is not None:
                        endpoints.add(t[0])
            if found:
                out.elements[name] = PackedElements(have.set, found)
            continue
        els: ElementMap = {}
        for key, el in have.items():
            if key in want or element_front(name, key) not in fronts:
                continue
            els[key] = el
            if isinstance(el.value, Verdict) and el.value.chain is not None:
                chains.append(el.value.chain)
            t = target(el.value)
            if t is not None:
                endpoints.add(t[0])
        if els:
            out.elements[name] = els
    _close(start, desired, out, chains, sets, endpoints)
    addresses = {fk[1] for fk in fronts if fk[1] is not None}
    _plain(start, desired, out, n.CLUSTER_IPS, lambda key: key[0] in addresses)
    _plain(start, desired, out, n.HAIRPIN, lambda key: key[0] in endpoints)
    return out


def _close(
    start: Ruleset,
    desired: Ruleset,
    out: Ruleset,
    chains: list[str],
    sets: list[str],
    endpoints: set[object],
) -> None:
    """Add to ``out`` the chains and sets of ``start`` named by ``chains`` and ``sets`` that
    ``desired`` lacks, and everything they name in turn (the kernel holds what a rule or a
    verdict names: it must stay while they do)."""
    while chains or sets:
        while chains:
            name = chains.pop()
            if name in out.chains or name in desired.chains or name not in start.chains:
                continue
            out.chains[name] = start.chains[name]
            out.rules[name] = _unstamped(start, name)
            for rule in out.rules[name]:
                for e in rule.exprs:
                    found = names(e)
                    chains += found.chains
                    sets += found.sets
                    if isinstance(e, Dnat):
                        endpoints.add(e.addr)
        while sets:
            name = sets.pop()
            if name in out.sets or name in desired.sets or name not in start.sets:
                continue
            out.sets[name] = start.sets[name]
            els = start.elements.get(name, {})
            out.elements[name] = copy(els)
            if isinstance(els, PackedElements):  # a balanced map: endpoints, no verdicts
                for data in set(els.raw.values()):
                    t = target(els.decode_data(data))
                    if t is not None:
                        endpoints.add(t[0])
                continue
            for el in els.values():
                if isinstance(el.value, Verdict) and el.value.chain is not None:
                    chains.append(el.value.chain)
                t = target(el.value)
                if t is not None:
                    endpoints.add(t[0])


def _plain(
    start: Ruleset,
    desired: Ruleset,
    out: Ruleset,
    name: str,
    mine: Callable[[tuple[Value, ...]], bool],
) -> None:
    """Add to ``out`` the elements of ``start``'s plain set ``name`` that ``mine`` (a predicate
    on a key) claims and ``desired`` lacks."""
    have, want = start.elements.get(name), desired.elements.get(name)
    if not have or want is None or name not in desired.sets:
        return
    if isinstance(have, PackedElements) and isinstance(want, PackedElements):
        raw = {k: d for k, d in have.raw.items() if k not in want.raw and mine(have.decode_key(k))}
        if raw:
            out.elements[name] = PackedElements(have.set, raw)
        return
    els = {key: el for key, el in have.items() if key not in want and mine(key)}
    if els:
        out.elements[name] = els


def merged(desired: Ruleset, kept: Ruleset) -> Ruleset:
    """``desired`` with ``kept`` (:func:`kept_objects`) added; ``desired`` itself when nothing
    is kept. ``desired``'s maps that gain elements are copied, the rest shared."""
    if not (kept.chains or kept.sets or kept.elements):
        return desired
    out = Ruleset(
        table=desired.table,
        chains={**desired.chains, **kept.chains},
        rules={**desired.rules, **kept.rules},
        sets={**desired.sets, **kept.sets},
        elements=dict(desired.elements),
    )
    for name, els in kept.elements.items():
        base = desired.elements.get(name)
        if base is None:
            out.elements[name] = els
            continue
        both = copy(base)
        if isinstance(both, PackedElements) and isinstance(els, PackedElements):
            both.raw.update(els.raw)
        else:
            both.update(els)
        out.elements[name] = both
    return out


class Keeper:
    """What the Syncer keeps of the tables it found at start while a source cannot read
    everything (see the module docstring).

    The Syncer hands it the tables as first read back (:meth:`found`) and each snapshot it
    syncs (:meth:`sees`); :meth:`wanted` gives what to program instead of the plan.
    """

    def __init__(self) -> None:
        self._start: dict[Family, Ruleset] | None = None
        self._known: set[str] = set()
        self._released: dict[Family, set[FrontKey]] = {}  # kept frontends the plan took
        self._done = False  # every place was read once: nothing is kept any more
        self.kept: set[str] = set()
        """The services (``ns/name``) this sync keeps so far (empty: the plan as it is)."""

    @property
    def active(self) -> bool:
        """Whether syncs are to keep objects of the start-up tables (the full path then runs:
        the plan alone is not what is programmed)."""
        return self._start is not None

    def found(self, tables: Mapping[Family, Ruleset | None]) -> None:
        """The tables as the first read-back of this process found them."""
        if self._done or self._start is not None:
            return
        self._start = {f: rs for f, rs in tables.items() if rs is not None}

    def sees(self, snapshot: ClusterSnapshot) -> bool:
        """A sync of ``snapshot`` begins; returns True when it ends the keeping (every place
        is read now): that sync compares everything, so what is really gone is deleted."""
        if self._done:
            return False
        if not snapshot.unread:
            self._done = True
            ended = self._start is not None
            self._start, self._known, self._released = None, set(), {}
            self.kept = set()
            return ended
        self._known.update(str(key) for key in snapshot.services)
        self.kept = set()
        return False

    def wanted(self, family: Family, desired: Ruleset) -> Ruleset:
        """What to program in ``family``'s table: ``desired`` with what is kept."""
        start = None if self._start is None else self._start.get(family)
        if start is None:
            return desired
        released = self._released.setdefault(family, set())
        fronts, taken = kept_fronts(start, desired, self._known, released)
        released |= taken
        kept = kept_objects(start, desired, fronts)
        self.kept.update(
            _service(el.comment)
            for name in _COMMENTED
            for el in kept.elements.get(name, {}).values()
            if el.comment
        )
        return merged(desired, kept)
