"""One sync: planner → reconciler → kernel → effects (conntrack cleanup).

Used by ``nlproxy run --once`` and by the daemon's sync loop; holds no scheduling of its own.
What is programmed is read back from the kernel the first time (so a restarted process sends only
the difference) and cached afterwards; ``verify()`` reads it back again to catch drift.
Effects run only after the kernel accepted the transaction.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from nlproxy.cluster.model import ClusterSnapshot, IPAddress
from nlproxy.conntrack import Conntrack, programmed_frontends, stale_flow_filters
from nlproxy.log import get_logger
from nlproxy.nft.backend import NftBackend
from nlproxy.nft.ir import Family, Ruleset, Table
from nlproxy.nft.readback import read_ruleset
from nlproxy.nft.reconcile import diff, stamp
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.planner import Plan, plan

TABLE_NAME = "nlproxy"
FAMILIES = (Family.IP, Family.IP6)


@dataclass(slots=True, kw_only=True)
class SyncResult:
    """What one sync did: operations sent per family, timings, conntrack flows deleted."""

    ops: dict[Family, int] = field(default_factory=dict)
    plan_ms: float = 0.0
    apply_ms: float = 0.0
    conntrack_deleted: int = 0
    plan: Plan | None = None

    @property
    def total_ops(self) -> int:
        return sum(self.ops.values())


def as_programmed(rs: Ruleset) -> Ruleset:
    """``rs`` as read-back would show it once applied (rule comments carry fingerprints)."""
    return Ruleset(
        table=rs.table,
        chains=dict(rs.chains),
        rules={c: [stamp(r) for r in rules] for c, rules in rs.rules.items()},
        sets=dict(rs.sets),
        elements={s: dict(els) for s, els in rs.elements.items()},
    )


class Syncer:
    """Keeps the ``ip``/``ip6`` nlproxy tables equal to the plan for a snapshot.

    Args:
        config: the planner's configuration.
        netns: network namespace to program (None: the current one).
        owner: create the tables with NFT_TABLE_F_OWNER (+ PERSIST); see ``nft/backend.py``.
        flush_tcp: also delete TCP flows of removed endpoints (UDP/SCTP always are).
    """

    def __init__(
        self,
        config: ProxyConfig,
        *,
        netns: str | None = None,
        owner: bool = False,
        flush_tcp: bool = False,
    ) -> None:
        self.config = config
        self.netns = netns
        self.owner = owner
        self.flush_tcp = flush_tcp
        self.log = get_logger("sync")
        self._backends: dict[Family, NftBackend] = {}
        self._programmed: dict[Family, Ruleset | None] = {}
        self._seeded = False
        self._last_plan: Plan | None = None
        self.conntrack_deleted_total = 0

    def _table(self, family: Family) -> Table:
        return Table(family=family, name=TABLE_NAME, owner=self.owner, persist=self.owner)

    def _backend(self, family: Family) -> NftBackend:
        if family not in self._backends:
            self._backends[family] = NftBackend(self._table(family), netns=self.netns)
        return self._backends[family]

    def verify(self) -> None:
        """Forget the cache: the next sync compares against what the kernel really holds."""
        for family in FAMILIES:
            self._programmed[family] = read_ruleset(family, TABLE_NAME, netns=self.netns)
        self._seeded = True

    def sync(self, snapshot: ClusterSnapshot) -> SyncResult:
        """Plan ``snapshot`` and apply the difference, then clean up conntrack.

        Raises:
            KernelError: the kernel rejected the transaction (nothing of it was applied).
        """
        if not self._seeded:
            self.verify()
        result = SyncResult()
        t0 = time.perf_counter()
        # The previous plan lets the planner replay the fragments of unchanged services.
        planned = plan(snapshot, self.config, previous=self._last_plan)
        result.plan = planned
        t1 = time.perf_counter()
        result.plan_ms = (t1 - t0) * 1000
        before = {f: self._programmed.get(f) for f in FAMILIES}
        for family in FAMILIES:
            desired = planned.rulesets.get(family)
            if desired is None:
                continue
            ops = diff(desired, before[family])
            if ops:
                self._backend(family).apply(ops)
            self._programmed[family] = as_programmed(desired)
            result.ops[family] = len(ops)
        self._last_plan = planned
        result.apply_ms = (time.perf_counter() - t1) * 1000
        result.conntrack_deleted = self._clean_conntrack(before, snapshot)
        self.conntrack_deleted_total += result.conntrack_deleted
        return result

    def _node_addrs(self, snapshot: ClusterSnapshot) -> tuple[IPAddress, ...]:
        if self.config.node_ips:
            return tuple(self.config.node_ips)
        return snapshot.node.addresses if snapshot.node else ()

    def _clean_conntrack(
        self, before: Mapping[Family, Ruleset | None], snapshot: ClusterSnapshot
    ) -> int:
        old = programmed_frontends([rs for rs in before.values() if rs is not None])
        new = programmed_frontends([rs for rs in self._programmed.values() if rs is not None])
        filters = stale_flow_filters(
            old, new, node_addrs=self._node_addrs(snapshot), flush_tcp=self.flush_tcp
        )
        if not filters:
            return 0
        deleted = Conntrack(self.netns).delete(filters)
        if deleted:
            self.log.info("conntrack.flushed", flows=deleted, filters=len(filters))
        return deleted

    def close(self) -> None:
        for backend in self._backends.values():
            backend.close()
        self._backends.clear()


def with_node_ips(config: ProxyConfig, ips: tuple[IPAddress, ...]) -> ProxyConfig:
    """``config`` with explicit node addresses (``--node-ip``)."""
    return replace(config, node_ips=ips)
