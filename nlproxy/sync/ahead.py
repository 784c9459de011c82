"""A cold start's plan made ahead of its first sync, while the last pages of the lists arrive.

Owned by the :class:`~nlproxy.sync.syncer.Syncer` (its ``ahead``); started by ``preload.py``
once the Services are listed, in a thread of its own. The first sync takes the plan and updates
it in place (``proxy/incremental.py``) for the services whose objects are not the ones planned
here, found by identity as for a relist (``relist.narrowed``), instead of planning every
service after the lists. A sync that comes while the plan is being made waits for it.

Only on a cold start: records are kept and no table holds one (a look at each family's record
chain; every commit of a Syncer keeping records writes one). A restart either plans nothing
(its records vouch for the tables) or keeps the backend slots it reads back, which a plan made
here would not. The load-balancing budget is not applied here: the sync applies it, over every
Service as any first sync, and a Service it changes is planned again then.
"""

from __future__ import annotations

import threading

from structlog.typing import FilteringBoundLogger

from nlproxy.cluster.model import ClusterSnapshot
from nlproxy.errors import NlproxyError
from nlproxy.hotpath import collection_paused
from nlproxy.nft.dump import Interrupted
from nlproxy.nft.ir import FAMILIES
from nlproxy.nft.tables import ReadBack
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.incremental import attach
from nlproxy.proxy.planner import Plan, plan
from nlproxy.sync.fingerprint import RECORD_CHAIN
from nlproxy.sync.relist import for_planning


class PlanAhead:
    """At most one plan made ahead, taken once by the first sync (see the module docstring)."""

    def __init__(self) -> None:
        self._done = threading.Event()  # clear while a plan is being made
        self._done.set()
        self._plan: Plan | None = None

    def starting(self) -> None:
        """A :meth:`make` is about to start in another thread: :meth:`take` waits for it from
        now on. Called before that thread starts, so no sync can slip in before it."""
        self._done.clear()

    def make(
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
        kernel holds no record; returns whether it planned. Blocking; ends what
        :meth:`starting` began whatever happens."""
        try:
            if not fresh:
                return False
            try:
                if any(readback.comments(family, RECORD_CHAIN) for family in FAMILIES):
                    return False  # a record: a restart
            except (NlproxyError, Interrupted, OSError):  # not known to be a cold start
                return False
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
            return True
        finally:
            self._done.set()

    def take(self) -> Plan | None:
        """The plan made ahead, once (None: there is none); waits for one being made."""
        self._done.wait()
        planned, self._plan = self._plan, None
        return planned
