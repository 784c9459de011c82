"""Keeping one service the kernel rejects from stalling all the others.

Sits inside the Syncer (``syncer.py``), which turns here only after the kernel refused a sync's
batch. Validation before sending catches what nlproxy knows the kernel refuses; this is for the
rest. A real case: two LoadBalancer services claiming one address and port with overlapping
``loadBalancerSourceRanges`` make overlapping interval elements, which the kernel refuses; left
alone, that one pair would stop every later sync of the whole cluster.

The Syncer leaves a rejected service out and syncs again. Leaving out means planning the service
as it was when the kernel last accepted it (so nothing already programmed for it is lost), or not
at all when it never was. It stays left out until its objects change (or a full verify retries
it). The culprit is found in one of two ways:

* attribution: the kernel's error names the failing operation, and the service whose fragment
  of the plan holds that object is the culprit (one changed since the last accepted sync is
  preferred when several hold it);
* bisection: when nothing can be attributed, the services changed since the last accepted sync
  are reverted by shrinking suffixes, each candidate checked by the kernel without applying it,
  down to the shortest suffix that passes; its first service is a culprit.

:class:`Isolation` holds that state across syncs (what is left out, the snapshot the kernel last
accepted) and logs each service left out or taken back once; the functions below it are pure. No
I/O here: the Syncer plans and asks the kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from nlproxy.cluster.model import ClusterSnapshot, EndpointSlice, Service, ServiceKey
from nlproxy.errors import KernelError
from nlproxy.nft.ir import Family, NftObject, PackedRun, Rule
from nlproxy.proxy.fragments import Fill
from nlproxy.proxy.planner import Plan

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

MAX_EXCLUSIONS = 16
"""Services one sync may newly leave out before it gives up (the fault is then likely
elsewhere); those left out by earlier syncs do not count."""
MAX_CHECKS = 64
"""Kernel checks one sync may spend bisecting for culprits."""


@dataclass(frozen=True, slots=True)
class Exclusion:
    """A service left out: the objects the kernel rejected (kept to notice when they change)."""

    service: Service | None
    slices: tuple[EndpointSlice, ...]
    reason: str

    def still_applies(self, snapshot: ClusterSnapshot, key: ServiceKey) -> bool:
        """True while ``snapshot`` holds the very objects that were rejected."""
        slices = snapshot.slices.get(key, ())
        if snapshot.services.get(key) is not self.service or len(slices) != len(self.slices):
            return False
        return all(a is b for a, b in zip(slices, self.slices, strict=True))


def exclusion(snapshot: ClusterSnapshot, key: ServiceKey, reason: str) -> Exclusion:
    return Exclusion(snapshot.services.get(key), tuple(snapshot.slices.get(key, ())), reason)


def substitute(
    snapshot: ClusterSnapshot, keys: Sequence[ServiceKey], good: ClusterSnapshot | None
) -> ClusterSnapshot:
    """``snapshot`` with the services ``keys`` as they were in ``good`` (absent if not there)."""
    if not keys:
        return snapshot
    services, slices = dict(snapshot.services), dict(snapshot.slices)
    for key in keys:
        old = good.services.get(key) if good is not None else None
        if old is None:
            services.pop(key, None)
            slices.pop(key, None)
            continue
        services[key] = old
        assert good is not None, "an old service comes from the last accepted snapshot"
        old_slices = good.slices.get(key)
        if old_slices:
            slices[key] = old_slices
        else:
            slices.pop(key, None)
    return replace(snapshot, services=services, slices=slices)


def changed_since(snapshot: ClusterSnapshot, good: ClusterSnapshot | None) -> list[ServiceKey]:
    """Services whose objects are not those of ``good`` (all of them when there is none), in
    key order, so a bisection is deterministic."""
    if good is None:
        return sorted(snapshot.services)
    keys = set(snapshot.services) | set(good.services)
    out = []
    for key in sorted(keys):
        a, b = snapshot.slices.get(key, ()), good.slices.get(key, ())
        same = snapshot.services.get(key) is good.services.get(key) and len(a) == len(b)
        if not (same and all(x is y for x, y in zip(a, b, strict=True))):
            out.append(key)
    return out


def owners(
    plan: Plan, family: Family, obj: NftObject, element: bytes | None = None
) -> list[ServiceKey]:
    """The services whose fragment of ``plan`` (in ``family``) adds ``obj``.

    Rules are matched by chain and expressions: what is sent carries a fingerprint comment the
    planned rule does not have. For a packed run, ``element`` is the packed key of the element
    the kernel refused (without it, no service is named).
    """
    match: Callable[[object], bool]
    if isinstance(obj, PackedRun):
        name = obj.set

        def match(op: object) -> bool:
            return isinstance(op, Fill) and op.set == name and element in op.keys
    elif isinstance(obj, Rule):
        chain, exprs = obj.chain, obj.exprs

        def match(op: object) -> bool:
            return isinstance(op, Rule) and op.chain == chain and op.exprs == exprs
    else:

        def match(op: object) -> bool:
            return op is obj or op == obj

    frags = plan.fragments.get(family, {})
    return [key for key, frag in frags.items() if any(match(op) for op in frag.ops)]


def attribute(candidates: Sequence[ServiceKey], changed: Sequence[ServiceKey]) -> list[ServiceKey]:
    """Of the services holding a rejected object, those to leave out: the changed ones when
    any changed (an unchanged service was accepted before, so the change is what broke it),
    else all of them."""
    moved = set(changed)
    fresh = [key for key in candidates if key in moved]
    return fresh or list(candidates)


def bisect_culprit(
    suspects: Sequence[ServiceKey], passes: Callable[[Sequence[ServiceKey]], bool]
) -> ServiceKey | None:
    """A service whose revert makes the batch pass, by binary search over suffixes.

    Suffixes, so that of two services in conflict the later one is blamed, as attribution
    does (the kernel refuses the second of two clashing objects in a batch).

    Args:
        suspects: the services that may be at fault, in a fixed order.
        passes: whether the kernel accepts the plan with the given services reverted.

    Returns:
        ``suspects[k]`` for the largest ``k`` such that reverting ``suspects[k:]`` passes, or
        None when even reverting all of them does not (the fault is elsewhere).
    """
    if not suspects or not passes(suspects):
        return None
    lo, hi = 0, len(suspects)  # reverting suspects[lo:] passes; suspects[hi:] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if passes(suspects[mid:]):
            lo = mid
        else:
            hi = mid
    return suspects[lo]


def reasons(excluded: Mapping[ServiceKey, Exclusion]) -> dict[ServiceKey, str]:
    return {key: ex.reason for key, ex in excluded.items()}


class Isolation:
    """The services left out of the syncs, across syncs.

    A sync calls :meth:`start`, plans :meth:`effective`, and on a rejection asks
    :meth:`culprits`, leaves them out with :meth:`exclude` and plans again; once the kernel
    accepts, :meth:`accepted`.

    Args:
        log: where a service left out (``service.rejected``) or taken back
            (``service.accepted``) is logged, once per reason.
    """

    def __init__(self, log: FilteringBoundLogger) -> None:
        self.log = log
        self.excluded: dict[ServiceKey, Exclusion] = {}
        # The snapshot the kernel last accepted: what a left-out service falls back to.
        self._good: ClusterSnapshot | None = None
        self._reported: dict[ServiceKey, str] = {}
        self._added = 0
        self._budget = MAX_CHECKS

    def start(self, snapshot: ClusterSnapshot) -> None:
        """A sync of ``snapshot`` begins: a service changed since it was rejected is tried again,
        and this sync's limits start afresh."""
        for key in [k for k, ex in self.excluded.items() if not ex.still_applies(snapshot, k)]:
            del self.excluded[key]
        self._added, self._budget = 0, MAX_CHECKS

    def retry_all(self) -> None:
        """Try every left-out service again (after a full verify: what the kernel refused may
        have been a conflict that is gone now)."""
        self.excluded.clear()

    def effective(self, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        """``snapshot`` with the left-out services as the kernel last accepted them."""
        return substitute(snapshot, sorted(self.excluded), self._good)

    def culprits(
        self,
        exc: KernelError,
        effective: ClusterSnapshot,
        held: Sequence[ServiceKey],
        check: Callable[[ClusterSnapshot], bool],
    ) -> list[ServiceKey]:
        """The services to leave out for ``exc``: attributed when services of ``effective``'s
        plan hold the object the kernel refused (``held``), else found by bisecting the services
        changed since the last accepted sync, each candidate snapshot tried with ``check``.
        Empty when this sync may leave out no more.

        Raises:
            KernelError: ``exc``, when this sync's kernel checks are spent.
        """
        if self._added >= MAX_EXCLUSIONS:
            return []
        changed = [k for k in changed_since(effective, self._good) if k not in self.excluded]
        held = [k for k in held if k not in self.excluded]
        if held:
            return attribute(held, changed)

        def passes(keys: Sequence[ServiceKey]) -> bool:
            if self._budget <= 0:
                raise exc
            self._budget -= 1
            return check(substitute(effective, keys, self._good))

        culprit = bisect_culprit(changed, passes)
        return [culprit] if culprit is not None else []

    def exclude(self, snapshot: ClusterSnapshot, keys: Sequence[ServiceKey], reason: str) -> None:
        """Leave ``keys`` out until their objects in ``snapshot`` change."""
        self._added += len(keys)
        for key in keys:
            self.excluded[key] = exclusion(snapshot, key, reason)
            if self._reported.get(key) != reason:  # once, not at every verify
                self._reported[key] = reason
                self.log.error("service.rejected", service=str(key), error=reason)

    def accepted(self, effective: ClusterSnapshot) -> dict[ServiceKey, str]:
        """The kernel accepted the plan of ``effective``; the services left out, with why."""
        self._good = effective
        for key in [k for k in self._reported if k not in self.excluded]:
            del self._reported[key]
            if key in effective.services:  # not when it was deleted
                self.log.info("service.accepted", service=str(key))
        return reasons(self.excluded)
