"""What one sync did (:class:`SyncResult`), and the families and programmed copies every part
of the Syncer (``syncer.py``, ``verify.py``, ``restart.py``) shares."""

from __future__ import annotations

from copy import copy
from dataclasses import dataclass, field

from nlproxy.cluster.model import ServiceKey
from nlproxy.nft.ir import Family, Ruleset
from nlproxy.nft.reconcile import stamp
from nlproxy.proxy.planner import Plan
from nlproxy.serve.healthcheck import HealthCheck


@dataclass(slots=True, kw_only=True)
class SyncResult:
    """What one sync did: operations sent per family, timings, conntrack flows deleted.

    ``plan_ms`` is planning, ``diff_ms`` comparing (diff or delta → operations), ``commit_ms``
    the kernel batches, ``apply_ms`` everything after planning (those, caching, conntrack);
    ``incremental`` tells which path ran. The plan is the Syncer's live one: read it before the
    next sync, which updates it.
    """

    ops: dict[Family, int] = field(default_factory=dict)
    plan_ms: float = 0.0
    diff_ms: float = 0.0
    commit_ms: float = 0.0
    apply_ms: float = 0.0
    conntrack_deleted: int = 0
    plan: Plan | None = None
    incremental: bool = False
    excluded: dict[ServiceKey, str] = field(default_factory=dict)
    """Services left out because the kernel rejected them, with the kernel's error."""
    deferred: set[ServiceKey] = field(default_factory=set)
    """Services whose round-robin or consistent-hash tables wait for the next sync (past the
    quota of ``Syncer.balancing``): sync again soon."""
    conntrack: dict[Family, tuple[int, float]] = field(default_factory=dict)
    """Per family whose flows were cleaned up: (flows deleted, seconds it took)."""
    narrowed: set[ServiceKey] | None = None
    """The services this sync found changed among more it was told of (a relist after this
    Node changed names every one: ``relist.py``); None: it took what it was told."""
    restarted: bool = False
    """The tables' records showed they already held this plan: nothing was read back or
    diffed (``fingerprint.py``); a full verify is due."""
    health_checks: dict[int, HealthCheck] | None = None
    """What the health-check node ports answer after this sync: the plan's, with those of
    Services kept as programmed (``keep.py``); None when there is no plan."""

    @property
    def total_ops(self) -> int:
        return sum(self.ops.values())


def as_programmed(rs: Ruleset, *, share: bool = False) -> Ruleset:
    """``rs`` as read-back would show it once applied (rule comments carry fingerprints).

    ``share``: the element maps are ``rs``'s own, not copies (at 10k Services x 10 endpoints,
    copying the packed maps is most of the work after a commit): the result is then only good
    until ``rs`` or it changes, and :func:`unshare` makes it a copy before either does.
    """
    return Ruleset(
        table=rs.table,
        chains=dict(rs.chains),
        rules={c: [stamp(r) for r in rules] for c, rules in rs.rules.items()},
        sets=dict(rs.sets),
        elements=dict(rs.elements) if share else {s: copy(els) for s, els in rs.elements.items()},
    )


def unshare(programmed: Ruleset, rs: Ruleset) -> int:
    """Copy the element maps ``programmed`` shares with ``rs`` (``as_programmed(rs,
    share=True)``); returns how many were shared."""
    shared = 0
    for name, els in programmed.elements.items():
        if rs.elements.get(name) is els:
            programmed.elements[name] = copy(els)  # packed stays packed
            shared += 1
    return shared
