"""The verify off the sync loop (``loop.py``'s verifier), as an object the Syncer owns.

The loop reads the tables back in a worker thread while syncs go on, one family at a time, and
compares each with the plan there; the version (moved by every sync) tells whether a sync ran
meanwhile, which makes the comparison void.

:class:`Verifier` owns that version and the generation ids of this process's commits (how a
read-back or the drift monitor tells them from another writer's). It reads back and compares;
it changes nothing: the Syncer hands it the plan to compare with, and applies a :class:`Repair`
itself (``Syncer.repair``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from nlproxy.nft.ir import FAMILIES, Element, Family, Operation, PackedRun, Ruleset, Verb, Verdict
from nlproxy.nft.reconcile import count_ops, diff
from nlproxy.nft.tables import ReadBack
from nlproxy.proxy import naming as n
from nlproxy.proxy.layout import Programmed, programmed_frontends
from nlproxy.sync.cleanup import udp_part
from nlproxy.sync.fingerprint import take_record
from nlproxy.sync.result import as_programmed

OWN_GENERATIONS = 64
"""Generation ids of this process's recent commits kept to tell them from another writer's."""

LATER_SETS = frozenset({n.HAIRPIN, n.CLUSTER_IPS, n.SERVICE_COUNTERS, n.NODEPORT_COUNTERS})
"""Sets whose elements a packet does not need to reach an endpoint: a large repair adds them in
a batch after the rest (:func:`traffic_first`). Missing, they leave a packet no worse off than
no table at all would: ``hairpin`` (a pod reaching itself through its Service is not
masqueraded: that connection fails, as it does with no table), ``cluster-ips`` (a ClusterIP's
unused port is dropped by ``service-cidrs`` or not answered, instead of rejected), the counter
sets (not counted). Every set a verdict depends on stays in the first batch: the dispatch and
backends maps, ``nodeport-ips``, the no-endpoint maps, the shortcuts and the firewall sets
(``firewall-ips`` without ``firewall-allow``, or the reverse, would drop or let through what the
source ranges say otherwise)."""

STAGE_REPAIR_AT = 2_000
"""A repair whose elements of :data:`LATER_SETS` are this many or more sends them in a second
batch (a table deleted at 10k Services x 10 endpoints: 110k of 220k operations); below, one
batch (the repair stays atomic)."""


@dataclass(frozen=True, slots=True)
class Repair:
    """A drift's repair, prepared off the loop (``Verifier.prepare_repair``)."""

    tables: dict[Family, Ruleset | None]
    """The tables as read back."""
    ops: dict[Family, list[Operation]]
    """What makes each family's table equal to the plan again (empty: nothing)."""
    version: int
    """The Syncer's version at the read-back: the repair is void once a sync ran."""
    frontends: tuple[Programmed, Programmed] | None
    """The frontends of the repaired families' tables as read back and as planned (their
    stale flows are deleted); None: no family is repaired."""


def traffic_first(ops: list[Operation]) -> tuple[list[Operation], list[Operation]]:
    """``ops`` (one family's repair, in the reconciler's order) as two batches: what carries
    traffic (the table, every chain, set and rule, every delete, and the elements of every set
    but :data:`LATER_SETS`), then the elements added to those.

    The first batch is whole by itself: the later elements are plain keys (no verdict, so no
    chain they need), in sets the first batch declares; nothing references an element.
    """
    first: list[Operation] = []
    later: list[Operation] = []
    for op in ops:
        obj = op.obj
        if (
            op.verb is Verb.ADD
            and isinstance(obj, Element | PackedRun)
            and obj.set in LATER_SETS
            and not (isinstance(obj, Element) and isinstance(obj.value, Verdict))
        ):
            later.append(op)
        else:
            first.append(op)
    return first, later


def staged(
    repairs: dict[Family, list[Operation]], at: int = STAGE_REPAIR_AT
) -> tuple[list[tuple[Family, list[Operation]]], list[tuple[Family, list[Operation]]]]:
    """The batches that send ``repairs``: those that carry traffic (each family's, in
    ``repairs``' order) and those that follow them. Each family's later elements
    (:func:`traffic_first`) come apart when they are ``at`` operations or more; else every
    family's repair is one batch of the first kind and none follows."""
    split = {f: traffic_first(ops) for f, ops in repairs.items() if ops}
    if sum(count_ops(later) for _, later in split.values()) < at:
        return [(f, ops) for f, ops in repairs.items() if ops], []
    firsts = [(f, first) for f, (first, _) in split.items() if first]
    return firsts, [(f, later) for f, (_, later) in split.items() if later]


class Verifier:
    """Reads the tables back and compares them with a plan, off the sync loop.

    Args:
        readback: the tables' read-back (``SyncKernel.readback``); its calls may run in a
            thread beside a sync's commit.
    """

    def __init__(self, readback: ReadBack) -> None:
        self._readback = readback
        self._version = 0  # odd while a sync or a repair may change the plan or the cache
        self._own: deque[int] = deque(maxlen=OWN_GENERATIONS)

    @property
    def version(self) -> int:
        """Moves at the start and the end of every sync; odd while one runs."""
        return self._version

    @property
    def own_generations(self) -> tuple[int, ...]:
        """The kernel generation ids of this process's recent commits (those known exactly:
        nobody else committed between the GETGEN before and the one after), oldest first."""
        return tuple(self._own)

    def current(self, version: int) -> bool:
        """Whether nothing changed the plan or the cache since ``version`` was read."""
        return not version % 2 and self._version == version

    @contextmanager
    def changing(self) -> Iterator[None]:
        """Around what may change the plan or the cache (a sync, a repair): a comparison that
        overlaps it is void."""
        self._version += 1
        try:
            yield
        finally:
            self._version += 1

    def committed(self, before: int, after: int) -> None:
        """A commit of this process was made between the generations ``before`` and ``after``
        (read just ahead of and just after it): it is known as this process's when nobody
        else's came between."""
        if after == (before + 1) & 0xFFFFFFFF:
            self._own.append(after)

    def own_commits(self, after: int, upto: int) -> bool:
        """Whether every generation in ``(after, upto]`` is one of this process's commits."""
        span = (upto - after) & 0xFFFFFFFF
        if span > len(self._own):
            return False
        own = set(self._own)
        return all(((after + i) & 0xFFFFFFFF) in own for i in range(1, span + 1))

    def read_back(self, family: Family) -> Ruleset | None:
        """``family``'s table as the kernel holds it (without its record). Blocking; only reads,
        so it may run in a thread while a sync runs in another."""
        rs = self._readback.dump(family)
        take_record(rs)
        return rs

    def repair_ops(
        self,
        family: Family,
        have: Ruleset | None,
        version: int,
        wanted: Mapping[Family, Ruleset] | None,
    ) -> list[Operation] | None:
        """What makes ``have`` (a read-back of ``family``) equal to ``wanted`` (the plan's
        rulesets, or what is programmed beside it; None: nothing planned, nothing programmed):
        empty when nothing differs; None when a sync ran since ``version`` (the plan may have
        changed under the comparison)."""
        if not self.current(version):
            return None
        try:
            ops = [] if wanted is None else diff(wanted[family], have)
        except Exception:  # a sync may change the plan's dicts while they are read
            if self._version == version:
                raise
            return None
        return ops if self._version == version else None

    def prepare_repair(
        self,
        tables: dict[Family, Ruleset | None],
        repairs: dict[Family, list[Operation]],
        version: int,
        wanted: Mapping[Family, Ruleset],
    ) -> Repair | None:
        """What a repair of ``tables`` (read back at ``version``) needs besides its operations,
        computed now so that the sync that commits it does not: the frontends whose flows it
        cleans up (a pass over whole tables, ~0.3 s a table at 10k x 10). Only reads, so it
        runs off the loop as ``repair_ops`` does; None when a sync ran since ``version``."""
        if not self.current(version):
            return None
        try:
            olds = [rs for f, rs in tables.items() if rs is not None and repairs.get(f)]
            news = [
                as_programmed(wanted[f], share=True)  # only read
                for f in FAMILIES
                if repairs.get(f)
            ]
            if not olds:
                # The repaired tables were deleted: as after a first commit, only the UDP
                # frontends they serve again can have stale flows (``cleanup.udp_part``).
                news = [udp_part(rs) for rs in news]
            fronts = (programmed_frontends(olds), programmed_frontends(news))
        except Exception:  # a sync may change the plan's dicts while they are read
            if self._version == version:
                raise
            return None
        if self._version != version:
            return None
        return Repair(tables, repairs, version, fronts if olds or news else None)
