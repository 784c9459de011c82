"""The Syncer's side of a verify off the sync loop (``loop.py``'s verifier).

The loop reads the tables back in a worker thread while syncs go on, one family at a time, and
compares each with the plan there; the version (moved by every sync) tells whether a sync ran
meanwhile, which makes the comparison void.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from nlproxy.cluster.model import ClusterSnapshot
from nlproxy.nft.ir import Family, Operation, Ruleset
from nlproxy.nft.reconcile import diff
from nlproxy.nft.tables import Tables
from nlproxy.proxy.layout import Programmed, programmed_frontends
from nlproxy.proxy.planner import Plan
from nlproxy.sync.fingerprint import take_record
from nlproxy.sync.isolation import Isolation
from nlproxy.sync.kernel import SyncKernel
from nlproxy.sync.result import FAMILIES, as_programmed


@dataclass(frozen=True, slots=True)
class Repair:
    """A drift's repair, prepared off the loop (``Verifying.prepare_repair``)."""

    tables: dict[Family, Ruleset | None]
    """The tables as read back."""
    ops: dict[Family, list[Operation]]
    """What makes each family's table equal to the plan again (empty: nothing)."""
    version: int
    """The Syncer's version at the read-back: the repair is void once a sync ran."""
    frontends: tuple[Programmed, Programmed] | None
    """The frontends of the repaired families' tables as read back and as planned (their
    stale flows are deleted); None: no family is repaired."""


class Verifying:
    """What :class:`~nlproxy.sync.syncer.Syncer` answers a verify with; the attributes are the
    Syncer's own (``syncer.py``)."""

    kernel: SyncKernel
    isolation: Isolation
    conntrack_deleted_total: int
    own_generations: deque[int]
    _version: int
    _last_plan: Plan | None
    _backends: dict[Family, Tables]
    _programmed: dict[Family, Ruleset | None]
    _in_step: bool
    _seeded: bool
    _digest_all: bool
    _recorded: tuple[str, str | None] | None
    _conntrack: dict[Family, tuple[int, float]]

    _apply: Callable[[Family, list[Operation]], None]
    _clean_conntrack: Callable[[Programmed, Programmed, ClusterSnapshot], int]

    @property
    def version(self) -> int:
        """Moves at the start and the end of every sync; odd while one runs."""
        return self._version

    def read_back(self, family: Family) -> Ruleset | None:
        """``family``'s table as the kernel holds it (without its record). Blocking; only reads,
        so it may run in a thread while a sync runs in another."""
        rs = self.kernel.readback.dump(family)
        take_record(rs)
        return rs

    def repair_ops(
        self, family: Family, have: Ruleset | None, version: int
    ) -> list[Operation] | None:
        """What makes ``have`` (a read-back of ``family``) equal to the last plan: empty when
        nothing differs; None when a sync ran since ``version`` (the plan may have changed
        under the comparison)."""
        planned = self._last_plan
        if version % 2 or self._version != version:
            return None
        if planned is None and self._seeded:  # a trusted restart, planned by the next sync
            return None
        try:
            ops = [] if planned is None else diff(planned.rulesets[family], have)
        except Exception:  # a sync may change the plan's dicts while they are read
            if self._version == version:
                raise
            return None
        return None if self._version != version else ops

    def prepare_repair(
        self,
        tables: dict[Family, Ruleset | None],
        repairs: dict[Family, list[Operation]],
        version: int,
    ) -> Repair | None:
        """What a repair of ``tables`` (read back at ``version``) needs besides its operations,
        computed now so that the sync that commits it does not: the frontends whose flows it
        cleans up (a pass over whole tables, ~0.3 s a table at 10k x 10). Only reads, so it
        runs off the loop as ``repair_ops`` does; None when a sync ran since ``version``."""
        planned = self._last_plan
        if version % 2 or self._version != version or planned is None:
            return None
        try:
            olds = [rs for f, rs in tables.items() if rs is not None and repairs.get(f)]
            news = [as_programmed(planned.rulesets[f]) for f in FAMILIES if repairs.get(f)]
            fronts = (programmed_frontends(olds), programmed_frontends(news))
        except Exception:  # a sync may change the plan's dicts while they are read
            if self._version == version:
                raise
            return None
        if self._version != version:
            return None
        return Repair(tables, repairs, version, fronts if olds or news else None)

    def own_commits(self, after: int, upto: int) -> bool:
        """Whether every generation in ``(after, upto]`` is one of this process's commits."""
        span = (upto - after) & 0xFFFFFFFF
        if span > len(self.own_generations):
            return False
        own = set(self.own_generations)
        return all(((after + i) & 0xFFFFFFFF) in own for i in range(1, span + 1))
