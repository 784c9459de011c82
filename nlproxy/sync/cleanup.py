"""The conntrack effect of a commit: delete the flows it left without their backend.

Sits after the Syncer's commits (``syncer.py``), which hand :class:`FlowCleanup` the rulesets
(or frontends) that were and are programmed; it computes the stale flows' filters purely from
them (``conntrack/plan.py``) and deletes them through the ``Flows`` seam. Only after a commit
the kernel accepted (kube-proxy's order). UDP and SCTP flows of removed endpoints always go; TCP
ones only with ``flush_tcp`` (a TCP client sees a reset when its endpoint is gone). A cleanup
that ran out of a resource (``EMFILE``...) is kept pending by the ``Flows`` side and finished
by :meth:`FlowCleanup.finish` at the next sync.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from nlproxy.cluster.model import ClusterSnapshot, IPAddress
from nlproxy.conntrack.kernel import ConntrackError, Flows
from nlproxy.conntrack.messages import FlowFilter
from nlproxy.conntrack.plan import programmed_frontends, stale_flow_filters, still_stale
from nlproxy.nft.ir import Family, L4Proto, Ruleset
from nlproxy.nft.packed import PackedElements
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.layout import SHAPES, Programmed, udp_only

_UDP = int(L4Proto.UDP)

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
    for shape in SHAPES:
        els = rs.elements.get(shape.backends)
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
        slim.elements[shape.backends] = PackedElements(els.set, picked)
    return udp_only(slim)
