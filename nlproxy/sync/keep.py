"""Services kept as programmed while a source cannot read where they are.

A manifest file that does not parse (or is caught empty) when the daemon starts holds objects
nobody knows: the snapshot lacks its Services (``ClusterSnapshot.unread`` names the file), but
the tables still hold what the previous process programmed for them. Deleting that would cut
their traffic until the file is fixed, for no change anyone made. So while ``unread`` names
anything, the Syncer plans what it knows and keeps, beside it, the objects of the tables as it
found them at start that belong to Services it has never seen (:class:`Keeper`): no delete and
no conntrack flush for them, and no restart record that says they are gone. Once every place is
read, the next sync compares everything and deletes what is really gone. Meanwhile a change
that no kept object depends on (:meth:`Keeper.affects`) is sent alone, as any incremental
sync's; one that may change what is kept (a kept frontend taken, a kept Service read again, a
chain or set of the start-up table added or deleted) takes the full path: what to keep is
worked out again and whole tables are compared.

Which objects are a Service's: the elements of the per-frontend maps (``layout.py``'s
``ADDRESS_KEYED`` / ``NODEPORT_KEYED``) of every frontend whose commented element (dispatch or
no-endpoint) names it, the chains and sets those reference (the shared dispatch chains, a
ClientIP-affinity or balanced port's own), its ClusterIPs in ``cluster-ips`` and its endpoints'
``hairpin`` pairs. A frontend the plan now gives another Service is the plan's.

A kept Service's health-check node port is kept too (:meth:`Keeper.kept_health`): the tables'
health-check record (``health.py``) holds its port and local endpoint count, which the daemon
answers with as the previous process did (a load balancer sends a Local Service's traffic only
to nodes whose port answers). A port the plan gives a Service is the plan's.

Pure but for :class:`Keeper`'s memory of what was seen: no I/O, clock or logging.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Set
from copy import copy
from dataclasses import replace

from nlproxy.cluster.model import ClusterSnapshot, ServiceKey
from nlproxy.nft.ir import Dnat, ElementMap, Family, Rule, Ruleset, Value, Verdict, names
from nlproxy.nft.packed import PackedElements
from nlproxy.nft.reconcile import Delta, programmed_fingerprint
from nlproxy.proxy import naming as n
from nlproxy.proxy.layout import ADDRESS_KEYED, NODEPORT_KEYED, FrontKey, element_front, target
from nlproxy.proxy.planner import Plan
from nlproxy.serve.healthcheck import HealthCheck, health_checks
from nlproxy.sync.health import fitted

_KEYED = (*ADDRESS_KEYED, *NODEPORT_KEYED)
_COMMENTED = (n.SERVICE_IPS, n.SERVICE_NODEPORTS, n.NO_ENDPOINT_SERVICES, n.NO_ENDPOINT_NODEPORTS)
"""The maps whose elements name their service port in a comment (``ns/name:port/PROTO``)."""
_SHARED = (n.CLUSTER_IPS, n.HAIRPIN)
"""Plain sets a kept frontend may share elements of with the plan."""


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


def kept_objects(
    start: Ruleset, desired: Ruleset, fronts: Set[FrontKey]
) -> tuple[Ruleset, set[object]]:
    """The objects of ``start`` (a table read back when this process started) of ``fronts``
    (:func:`kept_fronts`) that ``desired`` lacks, with every chain and set they reference that
    ``desired`` lacks: what :func:`merged` adds to ``desired``; and the endpoint addresses
    they reach (whose ``hairpin`` pairs they keep)."""
    out = Ruleset(table=desired.table)
    if not fronts:
        return out, set()
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
    return out, endpoints


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
            both.own().update(els.raw)
        else:
            both.update(els)
        out.elements[name] = both
    return out


def _touches(
    changes: Mapping[str, tuple[object, object]], had: Container[str], held: Container[str]
) -> bool:
    """Whether ``changes`` (a delta's chains or sets: before, after) change one of ``held``
    or add or delete one of ``had``."""
    return any(
        name in held or ((before is None or after is None) and name in had)
        for name, (before, after) in changes.items()
    )


class Keeper:
    """What the Syncer keeps of the tables it found at start while a source cannot read
    everything (see the module docstring).

    The Syncer hands it the tables as first read back (:meth:`found`) and each snapshot it
    syncs (:meth:`sees`). A full sync programs what :meth:`keep` gives instead of the plan; a
    sync whose plan change no kept object depends on (:meth:`affects`) sends that change
    alone, and what is programmed is then :meth:`remerged`.
    """

    def __init__(self) -> None:
        self._start: dict[Family, Ruleset] | None = None
        self._health: dict[int, HealthCheck] = {}  # the health-check record found at start
        self._known: set[str] = set()
        self._released: dict[Family, set[FrontKey]] = {}  # kept frontends the plan took
        # :meth:`keep`'s: what is kept, of which frontends, reaching which endpoints.
        self._kept: dict[Family, tuple[Ruleset, set[FrontKey], set[object]]] = {}
        self._done = False  # every place was read once: nothing is kept any more
        self.kept: set[str] = set()
        """The services (``ns/name``) the last full sync kept (empty: the plan as it is)."""

    @property
    def active(self) -> bool:
        """Whether syncs are to keep objects of the start-up tables (the plan alone is not
        what is programmed)."""
        return self._start is not None

    def found(
        self,
        tables: Mapping[Family, Ruleset | None],
        health: Mapping[int, HealthCheck] | None = None,
    ) -> None:
        """The tables as the first read-back of this process found them, and the health-check
        record they held (``health.py``)."""
        if self._done or self._start is not None:
            return
        self._start = {f: rs for f, rs in tables.items() if rs is not None}
        self._health = dict(health or {})

    def health(self, planned: Plan | None) -> dict[int, HealthCheck]:
        """The health checks to answer for after a sync of ``planned``: the plan's, with the
        kept ones (:meth:`kept_health`)."""
        checks = {} if planned is None else health_checks(planned.ports)
        checks.update(self.kept_health(checks))
        return checks

    def kept_health(self, planned: Mapping[int, HealthCheck]) -> dict[int, HealthCheck]:
        """The health checks of the start-up record that are kept beside ``planned`` (the
        plan's, port → check): those of Services never seen since the start, on ports the plan
        does not give a Service. Empty once every place was read."""
        if self._start is None or not self._health:
            return {}
        known = self._known
        out: dict[int, HealthCheck] = {}
        for port, check in self._health.items():
            if port in planned:
                continue
            name = str(check.service)
            if name in known:
                continue
            count = check.local_endpoints
            # A name that fills its room may be cut (``health.fitted``): a known Service's name
            # cut alike is that Service.
            if fitted(name + "-", port, count) == name and any(
                fitted(k, port, count) == name for k in known if len(k) > len(name)
            ):
                continue
            out[port] = check
        return out

    def sees(self, snapshot: ClusterSnapshot, changed: Set[ServiceKey] | None = None) -> bool:
        """A sync of ``snapshot`` begins (``changed``: the only Services that may differ from
        the last one's; None: any); returns True when it ends the keeping (every place is read
        now): that sync compares everything, so what is really gone is deleted."""
        if self._done:
            return False
        if not snapshot.unread:
            self._done = True
            ended = self._start is not None
            self._start, self._known, self._released, self._kept = None, set(), {}, {}
            self._health = {}
            self.kept = set()
            return ended
        services = snapshot.services
        keys = services if changed is None else [k for k in changed if k in services]
        self._known.update(str(key) for key in keys)
        return False

    def wanted(self, family: Family, desired: Ruleset) -> Ruleset:
        """What to program in ``family``'s table for ``desired``: it with what is kept. Only
        tells (for a plan that is checked, not synced): :meth:`keep` is a sync's."""
        if self._start is None:
            return desired
        kept, _, _, _ = self._kept_of(family, desired)
        return merged(desired, kept)

    def keep(self, rulesets: Mapping[Family, Ruleset]) -> dict[Family, Ruleset]:
        """What a full sync programs per family for the plan's ``rulesets``: each with what is
        kept. The frontends the plan takes are released for good; what is kept is remembered
        (:attr:`kept`, :meth:`affects`, :meth:`remerged`)."""
        self.kept = set()
        self._kept = {}
        out: dict[Family, Ruleset] = {}
        for family, desired in rulesets.items():
            kept, fronts, endpoints, taken = self._kept_of(family, desired)
            self._released.setdefault(family, set()).update(taken)
            self._kept[family] = (kept, fronts, endpoints)
            self.kept.update(
                _service(el.comment)
                for name in _COMMENTED
                for el in kept.elements.get(name, {}).values()
                if el.comment
            )
            out[family] = merged(desired, kept)
        return out

    def _kept_of(
        self, family: Family, desired: Ruleset
    ) -> tuple[Ruleset, set[FrontKey], set[object], set[FrontKey]]:
        """What is kept beside ``desired``, of which frontends, reaching which endpoints, and
        the frontends ``desired`` takes."""
        start = None if self._start is None else self._start.get(family)
        if start is None:
            return Ruleset(table=desired.table), set(), set(), set()
        released = self._released.get(family, set())
        fronts, taken = kept_fronts(start, desired, self._known, released)
        kept, endpoints = kept_objects(start, desired, fronts)
        return kept, fronts, endpoints, taken

    def affects(
        self, deltas: Mapping[Family, Delta] | None, changed: Set[ServiceKey] | None
    ) -> bool:
        """Whether a change of the plan (``deltas`` per family, of the Services ``changed``;
        None: not known) may change what the last :meth:`keep` kept, so that only a full sync
        tells what to program: it names a kept Service, takes a kept frontend, or adds or
        deletes a chain or set the start-up table has (kept objects may name it), or one that
        is kept, or deletes a ClusterIP or ``hairpin`` pair a kept frontend shares (kept only
        while the plan lacks it)."""
        if deltas is None or changed is None:
            return True
        if self.kept and any(str(key) in self.kept for key in changed):
            return True
        return any(self._affects(family, delta) for family, delta in deltas.items())

    def _affects(self, family: Family, delta: Delta) -> bool:
        """:meth:`affects` for one family's delta, past the Services it names."""
        start = None if self._start is None else self._start.get(family)
        entry = self._kept.get(family)
        if start is None or entry is None:
            return start is not None  # (no keep() yet: a full sync first)
        kept, fronts, endpoints = entry
        addresses = {fk[1] for fk in fronts}
        for (set_name, key), (_, after) in delta.elements.items():
            if after is not None:
                if set_name in _COMMENTED and element_front(set_name, key) in fronts:
                    return True
            elif (set_name == n.CLUSTER_IPS and key[0] in addresses) or (
                set_name == n.HAIRPIN and key[0] in endpoints
            ):
                return True
        for name, changes in delta.packed.items():
            if name in _COMMENTED:
                return True  # (not planned packed)
            if name in _SHARED:
                have = start.elements.get(name)
                if not isinstance(have, PackedElements):
                    return True
                mine = addresses if name == n.CLUSTER_IPS else endpoints
                if any(
                    after is None and have.decode_key(k)[0] in mine
                    for k, (_, after) in changes.items()
                ):
                    return True
        return _touches(delta.chains, start.chains, kept.chains) or _touches(
            delta.sets, start.sets, kept.sets
        )

    def remerged(self, family: Family, desired: Ruleset) -> Ruleset:
        """``desired`` (the plan, changed since the last :meth:`keep` by what it did not
        :meth:`affects`) with what that kept."""
        entry = self._kept.get(family)
        return desired if entry is None else merged(desired, entry[0])
