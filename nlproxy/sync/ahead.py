"""A cold start's plan made ahead of its first sync, while the last pages of the lists arrive.

Owned by the :class:`~nlproxy.sync.syncer.Syncer` (its ``ahead``); started by ``preload.py``
once the Services (or, when theirs ends first, the EndpointSlices) are listed, in a thread of its
own, which then follows the pages that come after (each page's services updated in place, or
added, ``proxy/incremental.py``) until the lists end.
The first sync takes the plan and updates it for the services whose objects are still not the
ones planned, found by identity as for a relist (``relist.narrowed``): what the last page
brought, instead of every service after the lists. A sync that comes while the plan is being
made or followed waits for it.

Only on a cold start: records are kept and no table holds one (a look at each family's record
chain; every commit of a Syncer keeping records writes one). A restart either plans nothing
(its records vouch for the tables) or keeps the backend slots it reads back, which a plan made
here would not. The load-balancing budget is not applied here: the sync applies it, over every
Service as any first sync, and a Service it changes is planned again then.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Set
from dataclasses import replace

from structlog.typing import FilteringBoundLogger

from nlproxy.cluster.model import ClusterSnapshot, ServiceKey
from nlproxy.errors import NlproxyError
from nlproxy.nft.dump import Interrupted
from nlproxy.nft.ir import FAMILIES
from nlproxy.nft.tables import ReadBack
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.incremental import attach, plan_update
from nlproxy.proxy.planner import Plan, plan
from nlproxy.runtime.hotpath import collection_paused
from nlproxy.sync.fingerprint import RECORD_CHAIN
from nlproxy.sync.relist import for_planning


class PlanAhead:
    """At most one plan made ahead, taken once by the first sync (see the module docstring)."""

    def __init__(self) -> None:
        self._done = threading.Event()  # clear while a plan is being made or followed
        self._done.set()
        self._plan: Plan | None = None
        self._updates: queue.SimpleQueue[tuple[ClusterSnapshot, Set[ServiceKey]] | None] = (
            queue.SimpleQueue()
        )
        self._following = False  # updates are taken (from starting() until run() ends)
        self._ended = False  # the lists are complete (end())
        self._lock = threading.Lock()  # over _following and what is queued

    def starting(self) -> None:
        """A :meth:`run` is about to start in another thread: :meth:`take` waits for it from
        now on. Called before that thread starts, so no sync can slip in before it."""
        self._following = True
        self._done.clear()

    def cancel(self) -> None:
        """No :meth:`run` after all (its thread could not start): what :meth:`starting` began
        ends, and :meth:`take` finds no plan."""
        with self._lock:
            self._following = False
        self._done.set()

    def run(
        self,
        snapshot: ClusterSnapshot,
        config: ProxyConfig,
        readback: ReadBack,
        log: FilteringBoundLogger,
        *,
        fresh: bool,
    ) -> bool:
        """Plan ``snapshot`` (most of the cluster, its lists not complete yet) when ``fresh``
        (the Syncer has neither synced, read back nor planned, and keeps records) and the
        kernel holds no record, then follow each :meth:`update` until :meth:`end`; returns
        whether it planned. Blocking; ends what :meth:`starting` began whatever happens."""
        planned = None
        try:
            planned = self._first(snapshot, config, readback, log, fresh=fresh)
            if planned is not None:
                services = snapshot.services
                sliced = {k for k, v in snapshot.slices.items() if v and k in services}
                self._follow(planned, config, sliced)
        except BaseException:
            self._plan = None  # a plan half updated is none
            raise
        finally:
            with self._lock:
                self._following = False
                while not self._updates.empty():  # nothing is kept once it has stopped
                    self._updates.get_nowait()
            self._done.set()
        return planned is not None

    def _follow(self, planned: Plan, config: ProxyConfig, sliced: set[ServiceKey]) -> None:
        """Update ``planned`` with each :meth:`update` until :meth:`end`; ``sliced``: the
        services planned with endpoints so far. Without counts (two services write one element)
        each update would be a full plan: the first sync makes the one that is needed."""
        while planned.live is not None and not (self._ended and self._updates.empty()):
            update = self._updates.get()
            if update is None:
                break
            later, changed = update
            snapshot = for_planning(later)
            # A service planned with endpoints already (its slices on pages both sides) is
            # planned again from nothing: updated in place it would keep the backend slots its
            # first slices took, which no commit gave them, and differ from a cold plan (and
            # from its record). One planned without any just takes its endpoints.
            again = changed & sliced
            sliced |= {k for k in changed if snapshot.slices.get(k) and k in snapshot.services}
            if again:
                without = replace(
                    snapshot,
                    services={k: v for k, v in snapshot.services.items() if k not in again},
                    slices={k: v for k, v in snapshot.slices.items() if k not in again},
                )
                planned, _ = plan_update(planned, without, config, again, deltas=False)
                self._plan = planned  # (the plan updated is consumed)
                if planned.live is None:
                    break
            planned, _ = plan_update(planned, snapshot, config, changed, deltas=False)
            self._plan = planned

    def update(self, snapshot: ClusterSnapshot, changed: Set[ServiceKey]) -> None:
        """The services ``changed`` names came or changed after the snapshot planned, as
        ``snapshot`` holds them (a page): :meth:`run` updates the plan for them, in its thread
        (nothing once it has ended, or when it did not plan)."""
        with self._lock:
            if self._following:
                self._updates.put((snapshot, changed))

    def end(self) -> None:
        """The lists are complete: :meth:`run` ends once it has followed every update (at
        once if it starts after this)."""
        self._ended = True
        with self._lock:
            if self._following:
                self._updates.put(None)

    def _first(
        self,
        snapshot: ClusterSnapshot,
        config: ProxyConfig,
        readback: ReadBack,
        log: FilteringBoundLogger,
        *,
        fresh: bool,
    ) -> Plan | None:
        if not fresh:
            return None
        try:
            if any(readback.comments(family, RECORD_CHAIN) for family in FAMILIES):
                return None  # a record: a restart
        except (NlproxyError, Interrupted, OSError):  # not known to be a cold start
            return None
        snapshot = for_planning(snapshot)
        with collection_paused():
            planned = plan(snapshot, config)
            attach(planned, snapshot)
        self._plan = planned
        log.info(
            "sync.planned_ahead",
            services=len(snapshot.services),
            incremental=planned.live is not None,
        )
        return planned

    def take(self) -> Plan | None:
        """The plan made ahead, once (None: there is none); waits for one being made."""
        self._done.wait()
        planned, self._plan = self._plan, None
        return planned
