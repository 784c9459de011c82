"""The conntrack effect of a commit: delete the flows it left without their backend.

Sits after the Syncer's commits (``syncer.py``), which hand :class:`FlowCleanup` the rulesets
(or frontends) that were and are programmed; it computes the stale flows' filters purely from
them (``conntrack/plan.py``) and deletes them through the ``Flows`` seam. Only after a commit
the kernel accepted (kube-proxy's order). UDP and SCTP flows of removed endpoints always go; TCP
ones only with ``flush_tcp`` (a TCP client sees a reset when its endpoint is gone). A cleanup
that ran out of a resource (``EMFILE``...) is kept pending by the ``Flows`` side and finished
by :meth:`FlowCleanup.finish` at the next sync.

A process stopped between a commit and its cleanup (a stop deadline's SIGKILL, ``kill -9``, an
OOM kill) leaves that commit's stale flows behind, and the next process cannot compute them
from a before and an after: the tables it finds already hold the after. So the first sync of
every process ends with :meth:`FlowCleanup.sweep`, which compares the conntrack table itself
with what is programmed: a UDP or SCTP flow DNAT'd to a frontend nlproxy programs whose backend
(the flow's reply source) is not one of that frontend's backends now, or a UDP flow to a
frontend with backends that was not DNAT'd at all, is one such a cleanup would have deleted.
Chosen over recording the pending filters durably before each commit: that record would be one
more write into every commit (the tables are the only state that outlives the process) to
cover a rare stop, while the sweep costs a listing of the UDP and SCTP flows once per start,
needs no record to be right, and also catches what any earlier process (another version, a
crash mid-cleanup, a cleanup that ran out of descriptors) left behind.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Mapping, Sequence, Set
from typing import TYPE_CHECKING

from nlproxy.cluster.model import ClusterSnapshot, IPAddress
from nlproxy.conntrack.kernel import Conntrack, ConntrackError, Flows, transient
from nlproxy.conntrack.messages import IPS_DST_NAT, Flow, FlowFilter
from nlproxy.conntrack.plan import (
    programmed_frontends,
    stale_flow_filters,
    still_stale,
)
from nlproxy.conntrack.rows import SweepRow, flow_row
from nlproxy.errors import NlproxyError
from nlproxy.nft.ir import ElementMap, Family, L4Proto, Ruleset, Value
from nlproxy.nft.packed import PackedElements
from nlproxy.proxy import naming as n
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.layout import (
    SHAPES,
    Backend,
    FrontKey,
    Programmed,
    front_key,
    frontend,
    proto_number,
    udp_only,
)

_UDP = int(L4Proto.UDP)
_BALANCED = tuple(f"{role}-" for role in n.BALANCED_MAPS)
SWEEP_MAX_DUMPS = 4
"""Past this many frontends, :func:`sweep_dumps` lists each protocol's flows in one dump: a
kernel pass costs ~50 ms at 100k flows whatever it returns, reading a listed flow ~2.5 us
(``SweepReader``), so a few passes cost as much as reading the whole table once."""
SWEPT = ("udp", "sctp")
"""The protocols whose flows :meth:`FlowCleanup.sweep` looks at (TCP too with ``flush_tcp``)."""
SWEEP_TRIES = 3
"""How many times a start-up sweep that ran out of a resource is tried in all."""

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger


class FlowCleanup:
    """Deletes the conntrack flows whose backends a commit removed.

    Args:
        flows: the conntrack table (``SyncKernel.flows``).
        config: the planner's configuration (the node's addresses, for node-port flows).
        log: where each cleanup that deleted flows is logged (``conntrack.flushed``).
        flush_tcp: also delete TCP flows of removed endpoints (UDP/SCTP always are).
    """

    def __init__(
        self, flows: Flows, config: ProxyConfig, log: FilteringBoundLogger, *, flush_tcp: bool
    ) -> None:
        self._flows = flows
        self.config = config
        self.log = log
        self.flush_tcp = flush_tcp
        self._deleted = 0
        self._swept = False  # :meth:`sweep` ran
        self._sweep_tries = 0  # sweeps that ran out of a resource

    def reconfigure(self, config: ProxyConfig) -> None:
        """Read the node's addresses from ``config`` from the next cleanup on."""
        self.config = config

    @property
    def deleted_total(self) -> int:
        """Flows deleted since this object was made."""
        return self._deleted

    @property
    def pending(self) -> bool:
        """Whether an earlier cleanup left filters undone for want of a resource."""
        return bool(self._flows.pending)

    @property
    def owed(self) -> bool:
        """Whether the next sync has flows to clean up whatever it plans: filters left
        undone (:attr:`pending`), or the start-up :meth:`sweep` not done yet (it could not list
        for want of a resource, or nothing was programmed to sweep against)."""
        return self.pending or not self._swept

    def finish(self, programmed: Iterable[Ruleset], snapshot: ClusterSnapshot) -> int:
        """Run what an earlier cleanup left undone for want of a resource (``EMFILE``...),
        less the flows of backends that serve their frontend again by now (in ``programmed``,
        the tables as they are)."""
        now = programmed_frontends(list(programmed))
        filters = still_stale(self._flows.take_pending(), now, node_addrs=self._addrs(snapshot))
        if not filters:
            return 0
        deleted = self._flows.delete(filters)
        self._deleted += deleted
        self.log.info("conntrack.flushed", flows=deleted, filters=len(filters), retried=True)
        return deleted

    def stale(
        self,
        olds: Sequence[Ruleset],
        news: Sequence[Ruleset],
        snapshot: ClusterSnapshot,
        into: dict[Family, tuple[int, float]],
    ) -> int:
        """Delete the flows whose backends the frontends of ``olds`` had and ``news`` lack."""
        if not olds and not news:
            return 0
        return self.between(programmed_frontends(olds), programmed_frontends(news), snapshot, into)

    def between(
        self,
        old: Programmed,
        new: Programmed,
        snapshot: ClusterSnapshot,
        into: dict[Family, tuple[int, float]],
    ) -> int:
        """Delete the flows whose backends the frontends ``old`` had and ``new`` lack; add
        each family's count and seconds to ``into``.

        Raises:
            ConntrackError: a family's deletion ran out of a resource (its filters are kept
                pending; the other family's still ran).
        """
        filters = stale_flow_filters(
            old, new, node_addrs=self._addrs(snapshot), flush_tcp=self.flush_tcp
        )
        if not filters:
            return 0
        # Timed and counted per family, as upstream's reconciler is. Every filter names an
        # address, so has a family; one without would span both and is run with IPv4's.
        groups: dict[Family, list[FlowFilter]] = {}
        for f in filters:
            groups.setdefault(Family.IP6 if f.family == 6 else Family.IP, []).append(f)
        deleted = 0
        failed: ConntrackError | None = None
        for family, mine in sorted(groups.items()):
            t = time.perf_counter()
            try:
                count = self._flows.delete(mine)
            except ConntrackError as exc:
                # The other family's filters still run; what ran out is kept pending.
                failed = failed or exc
                continue
            before, seconds = into.get(family, (0, 0.0))
            into[family] = (before + count, seconds + time.perf_counter() - t)
            deleted += count
        self._deleted += deleted
        if deleted:
            self.log.info("conntrack.flushed", flows=deleted, filters=len(filters))
        if failed is not None:
            raise failed
        return deleted

    def sweep(self, programmed: Mapping[Family, Ruleset | None], snapshot: ClusterSnapshot) -> int:
        """Once per process, at its first call with something ``programmed`` (the tables as
        they are, per family): delete the flows a cleanup of an earlier process would have
        deleted, had it run (see the module docstring): UDP and SCTP flows (TCP too with
        ``flush_tcp``) to a frontend of ``programmed`` whose backend is not one of its
        backends, and UDP flows to a frontend with backends that were not DNAT'd. Flows of
        every backend that serves its frontend stay; flows to anything else are not looked at.

        A dump per frontend while they are few, else per protocol (:func:`sweep_dumps`); the
        frontends the flows name are looked up in ``programmed`` (not every frontend of the
        tables is read). From the kernel's table, flows are read as rows (``SweepReader``:
        only what the decision needs, ~2.5 us a flow instead of ~40 us decoded) and the stale
        ones deleted by their id, without another pass; through any other ``Flows`` (the
        fake, a dry run's) they are listed and deleted by filter. A failure is logged, not
        raised: the sync before it succeeded. What ran out of a resource is tried again by
        the next sync, up to ``SWEEP_TRIES`` times in all (each makes an idle node's next verify
        a sync); the deletions kept pending are finished by :meth:`finish`.
        """
        if self._swept or not programmed:
            return 0
        self._swept = True
        protos = (*SWEPT, "tcp") if self.flush_tcp else SWEPT
        tables = [rs for rs in programmed.values() if rs is not None]
        kernel = self._flows if isinstance(self._flows, Conntrack) else None
        try:
            dumps = sweep_dumps(tables, protos)
            if kernel is not None:  # read lightly, deleted exactly (see sweep_row)
                rows = [r for flt in dumps for r in kernel.sweep_rows(flt)]
            else:
                rows = [flow_row(f) for flt in dumps for f in self._flows.list(flt)]
            if len(dumps) > 1 and any(d.orig_dst is None for d in dumps):
                # A NodePort's dump (by port alone) may list a flow another dump did.
                rows = list({r[6]: r for r in rows}.values())
            filters, stale = swept(rows, tables, self._addrs(snapshot))
            if kernel is not None:
                # The flows found stale, by id: no second pass over the table. One that ran
                # out of a resource leaves the sweep to the next sync.
                deleted = kernel.delete_rows(stale) if stale else 0
            else:
                deleted = self._flows.delete(filters) if filters else 0
        except (NlproxyError, OSError) as exc:  # OSError: a socket for the dump (EMFILE...)
            # Out of a resource: the next sync tries again (or finishes what is pending).
            self._sweep_tries += 1
            again = transient(exc) and self._sweep_tries < SWEEP_TRIES
            self._swept = bool(self._flows.pending) or not again
            self.log.warning("conntrack.sweep_failed", error=str(exc), again=again)
            return 0
        self._deleted += deleted
        self.log.info("conntrack.swept", flows=len(rows), filters=len(filters), deleted=deleted)
        return deleted

    def _addrs(self, snapshot: ClusterSnapshot) -> tuple[IPAddress, ...]:
        if self.config.node_ips:
            return tuple(self.config.node_ips)
        return snapshot.node.addresses if snapshot.node else ()


def udp_part(rs: Ruleset) -> Ruleset:
    """``layout.udp_only(rs)``, the part of a plan whose stale flows a first commit can leave
    (the UDP frontends), without a pass over its packed backends maps (100k elements at 10k
    Services x 10 endpoints, ~50 ms): their UDP part is looked up by each UDP frontend's key,
    index 0, 1, ... up to the first absent (``numgen mod N`` picks among 0..N-1, so a frontend's
    indices have no gap). The dispatch maps, one element per frontend, are still gone through.
    """
    slim = Ruleset(
        table=rs.table, chains=rs.chains, rules=rs.rules, sets=rs.sets, elements=dict(rs.elements)
    )
    for shape, name in ((s, m) for s in SHAPES for m in (s.backends, s.local)):
        els = rs.elements.get(name)
        if not isinstance(els, PackedElements):
            continue  # held as elements: udp_only picks them
        proto = shape.width - 2  # the l4proto's place in the key
        raw = els.raw
        picked: dict[bytes, bytes] = {}
        for key in rs.elements.get(shape.dispatch, {}):
            if key[proto] != _UDP:
                continue
            for i in itertools.count():
                packed = els.key_of((*key, i))
                data = None if packed is None else raw.get(packed)
                if packed is None or data is None:
                    break
                picked[packed] = data
        slim.elements[name] = PackedElements(els.set, picked)
    return udp_only(slim)


def sweep_dumps(programmed: Sequence[Ruleset], protos: Sequence[str]) -> list[FlowFilter]:
    """The dumps :meth:`FlowCleanup.sweep` lists: one per frontend of ``protos`` in
    ``programmed`` (its address and port, or a NodePort's port), which the kernel pre-selects,
    while there are at most ``SWEEP_MAX_DUMPS`` (a pass costs about the same however few flows it
    returns); else one per protocol. So a node's other UDP flows (an overlay's tunnels, its
    own DNS) are not decoded when few Services have UDP or SCTP ports, the usual case."""
    wanted = {proto_number(p) for p in protos}
    fronts: set[FrontKey] = set()
    for rs in programmed:
        # A frontend with no endpoints too: its flows to a removed pod are all stale.
        for shape, name in ((s, m) for s in SHAPES for m in (s.dispatch, s.no_endpoint)):
            els = rs.elements.get(name)
            if not els:
                continue
            at = shape.width - 2  # the l4proto's place in the key
            for number in wanted:
                if isinstance(els, PackedElements):
                    keys: Iterable[tuple[Value, ...]] = map(
                        els.decode_key, els.select(at, number).raw
                    )
                else:
                    keys = (k for k in els if k[at] == number)
                for key in keys:
                    fk = front_key(key, shape.width)
                    if fk is not None:
                        fronts.add(fk)
                if len(fronts) > SWEEP_MAX_DUMPS:
                    return [FlowFilter(proto=p) for p in protos]
    out = []
    for fk in sorted(fronts, key=str):
        fe = frontend(fk)
        if fe.addr is None:  # a NodePort: on every node address
            out.append(FlowFilter(proto=fe.proto, orig_dport=fe.port))
        else:
            out.append(FlowFilter(proto=fe.proto, orig_dst=fe.addr, orig_dport=fe.port))
    return out


def swept_filters(
    flows: Sequence[Flow], programmed: Sequence[Ruleset], node_addrs: Sequence[IPAddress]
) -> list[FlowFilter]:
    """Filters for the ``flows`` (listed from the kernel) that no backend of ``programmed``
    answers any more (:meth:`FlowCleanup.sweep`); :func:`swept` of their rows."""
    return swept([flow_row(f) for f in flows], programmed, node_addrs)[0]


# one piece: a pass over the frontends the flows name, then one over the flows
def swept(
    rows: Sequence[SweepRow], programmed: Sequence[Ruleset], node_addrs: Sequence[IPAddress]
) -> tuple[list[FlowFilter], list[SweepRow]]:
    """The filters for the flows of ``rows`` (listed from the kernel, as ``sweep_row`` reads
    them) that no backend of ``programmed`` answers any more, and those rows
    (:meth:`FlowCleanup.sweep`). A flow to a node address counts for the NodePort frontend of
    its port as well. Pure; the filters sorted, so the same input gives the same filters."""
    nodes = frozenset(node_addrs)
    wanted: set[FrontKey] = set()
    for row in rows:
        wanted.add((row[0], row[1], row[2]))
        if row[1] in nodes:
            wanted.add((row[0], None, row[2]))
    if not wanted:
        return [], []
    parts = [frontends_part(rs, wanted) for rs in programmed]
    programmed_now = programmed_frontends(parts)
    rejected = _without_endpoints(parts)
    # By the key a flow gives (l4proto number, address, port): the frontend's protocol name
    # and its backends, looked up once per frontend, not per flow.
    now: dict[FrontKey, tuple[str, frozenset[Backend]]] = {}
    for key in wanted:
        fe = frontend(key)
        bes = programmed_now.backends.get(fe)
        if bes is None and key in rejected:
            bes = frozenset()  # programmed with no endpoints: every DNAT'd flow is stale
        if bes is not None:
            now[key] = (fe.proto, bes)
    out: set[FlowFilter] = set()
    stale: list[SweepRow] = []
    found: set[tuple[object, ...]] = set()  # one filter per frontend and answering backend
    for row in rows:
        l4, dst, dport, rsrc, rsport, status, _ = row
        # A flow to a node address is the NodePort's of its port as well: stale only if no
        # frontend it may belong to has its backend (another's external IP on that address and
        # port DNATs before the NodePort is looked at).
        served = [
            hit
            for key in ((l4, dst, dport), (l4, None, dport))[: 2 if dst in nodes else 1]
            if (hit := now.get(key)) is not None
        ]
        if not served:
            continue  # not a frontend of nlproxy's
        # DNAT'd: the kernel's status says so, or the reply comes from elsewhere.
        if status & IPS_DST_NAT or (rsrc, rsport) != (dst, dport):
            if any(Backend(rsrc, rsport) in backends for _, backends in served):
                continue
            proto = served[0][0]
            stale.append(row)
            seen = (proto, dst, dport, rsrc, rsport)
            if seen not in found:
                found.add(seen)
                out.add(
                    FlowFilter(
                        proto=proto,
                        orig_dst=dst,
                        orig_dport=dport,
                        reply_src=rsrc,
                        reply_sport=rsport,
                    )
                )
        elif any(proto == "udp" and backends for proto, backends in served):
            stale.append(row)
            out.add(FlowFilter(proto="udp", orig_dst=dst, orig_dport=dport, dnat=False))
    return sorted(out, key=str), stale


def _without_endpoints(parts: Iterable[Ruleset]) -> set[FrontKey]:
    """The frontends in the no-endpoint maps of ``parts`` (:func:`frontends_part`'s)."""
    out: set[FrontKey] = set()
    for rs in parts:
        for shape in SHAPES:
            els = rs.elements.get(shape.no_endpoint)
            if not els:
                continue
            keys = map(els.decode_key, els.raw) if isinstance(els, PackedElements) else iter(els)
            for key in keys:
                if (fk := front_key(key, shape.width)) is not None:
                    out.add(fk)
    return out


def frontends_part(rs: Ruleset, fronts: Set[FrontKey]) -> Ruleset:
    """The part of ``rs`` :func:`~nlproxy.proxy.layout.programmed_frontends` needs to tell the
    backends of ``fronts``: their dispatch, no-endpoint and backends elements, the Local
    policy's too (a packed backends map's are picked by their frontend's bytes, the 4 of the
    index left out), and the round-robin, consistent-hash and ClientIP-affinity ports' own
    maps and chains as they are. Shares what it does not pick with ``rs``; read only."""
    slim = Ruleset(
        table=rs.table,
        chains=rs.chains,
        rules=rs.rules,
        sets=rs.sets,
        elements={k: v for k, v in rs.elements.items() if k.startswith(_BALANCED)},
    )
    for shape in SHAPES:
        if none := rs.elements.get(shape.no_endpoint):
            slim.elements[shape.no_endpoint] = _picked(none, fronts, shape.width)[0]
        dispatch = rs.elements.get(shape.dispatch)
        if not dispatch:
            continue
        slim.elements[shape.dispatch], keys = _picked(dispatch, fronts, shape.width)
        for name in (shape.backends, shape.local):
            els = rs.elements.get(name)
            if not els:
                continue
            if isinstance(els, PackedElements) and len(els.set.key) == shape.width + 1:
                heads = {els.pack_head(key[: shape.width]) for key in keys}  # type: ignore[arg-type]
                chosen = {k: d for k, d in els.raw.items() if k[:-4] in heads}
                slim.elements[name] = PackedElements(els.set, chosen)
            else:
                slim.elements[name] = {
                    k: el for k, el in els.items() if front_key(k, shape.width) in fronts
                }
    return slim


def _picked(
    els: ElementMap, fronts: Set[FrontKey], width: int
) -> tuple[ElementMap, list[tuple[object, ...]]]:
    """The elements of a map keyed by frontend whose frontend is one of ``fronts``, and their
    keys."""
    if isinstance(els, PackedElements):
        raw = {k: d for k, d in els.raw.items() if front_key(els.decode_key(k), width) in fronts}
        return PackedElements(els.set, raw), [els.decode_key(k) for k in raw]
    picked = {k: el for k, el in els.items() if front_key(k, width) in fronts}
    return picked, list(picked)
