"""A cold start's work done while the initial lists arrive, not after the last page.

The API source lists Services and EndpointSlices in pages; the API server takes most of a list's
time preparing them (10k Services x 10 endpoints: seconds), while the daemon waits. Each page,
as soon as it is decoded (``KubeSource``'s ``on_page``), goes into the cluster state
(``ClusterState.preload``: stored, claims settled) and the restart digest of the services it
changed is taken (``RestartRecords.warm``). Once one of the two lists that make services is
complete (``on_listed``: the Services, or the EndpointSlices when theirs ends first), most of the
other is in too: on a cold start the state so far is planned then, in a thread of its own
(``ahead.py``), and that plan follows the pages that come after until both lists are complete.
Their ``Replace`` then finds every object stored and every service hashed, and the first sync
updates the plan for what the last pages brought: only the tail is left.

Nothing here syncs: the loop's first sync still waits for the complete lists (and for a plan
ahead still running), so the kernel never sees a partial cluster (a restart must not delete the
Services of the pages not read yet). The hooks run on the event loop, before the sync loop
starts: nothing else touches the state or the Syncer meanwhile (the plan ahead's thread only
its own plan, and the snapshots it is handed, which do not change).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from nlproxy.cluster.model import Invalid, Skip, Upsert
from nlproxy.cluster.state import ClusterState
from nlproxy.sync.syncer import Syncer

PLANNED = frozenset({"Service", "EndpointSlice"})
"""The kinds whose lists make the services planned. The first of them to be complete starts the
plan ahead; both complete end its following of the pages.

Usually the Services' list ends first (the two are listed side by side, and slices are the
larger list): a Service's slices follow it, and planned any earlier, more services would be
planned twice (an in-place update costs a few times a service's share of a full plan,
``proxy/incremental.py``). When the slices' list ends first (its pages came faster, or the
Services' list was restarted), every service still to come has all its slices already: each is
added once as its page comes, and the plan no longer waits for the last list to end (it was then
made whole after the lists, on the first sync's path)."""
EARLY_SHARE = 0.5
"""The slices' list ending first starts the plan ahead only when the Services listed so far are
at least this share of those the slices name: else most services would be added a page at a
time (each at a few times its share of a full plan), and the plan waits for the Services'
list, as when it ends first."""


class Preload:
    """The API source's ``on_page`` (:meth:`page`) and ``on_listed`` (:meth:`listed`) for a
    daemon's cold start: the pages into ``state`` and the digest of what they change into
    ``syncer``, and the plan ahead (see the module docstring)."""

    def __init__(self, state: ClusterState, syncer: Syncer) -> None:
        self.state = state
        self.syncer = syncer
        self.thread: threading.Thread | None = None
        self._listed: set[str] = set()  # of PLANNED
        self._tried = False  # the plan ahead was started (or its thread could not be)

    def page(self, changes: Sequence[Upsert | Skip | Invalid]) -> None:
        changed = self.state.preload(changes)
        if not changed:
            return
        snapshot = self.state.snapshot()
        self.syncer.records.warm(snapshot, changed)
        if self.thread is not None:  # planned ahead: the plan follows the pages
            self.syncer.ahead.update(snapshot, changed)

    def listed(self, kind: str) -> None:
        if kind not in PLANNED:
            return
        self._listed.add(kind)
        if self._listed >= PLANNED:
            self.syncer.ahead.end()  # both lists that make services are complete
        if self._tried:
            return
        snapshot = self.state.snapshot()
        first = len(self._listed) == 1 and kind != "Service"  # the slices' list ended first
        if first and len(snapshot.services) < EARLY_SHARE * len(snapshot.slices):
            return  # most Services are still to come: planned once they are in
        self._tried = True
        syncer, fresh = self.syncer, self.syncer.fresh
        syncer.ahead.starting()  # before the thread starts: no sync slips in before it

        def run() -> None:
            try:
                syncer.ahead.run(
                    snapshot, syncer.config, syncer.kernel.readback, syncer.log, fresh=fresh
                )
            except Exception as exc:  # noqa: BLE001 - the first sync plans it all, as ever
                syncer.log.warning("sync.plan_ahead_failed", error=repr(exc))

        # A daemon thread: a stop does not wait for it.
        thread = threading.Thread(target=run, name="nlproxy-plan-ahead", daemon=True)
        try:
            thread.start()
        except RuntimeError as exc:  # no thread to be had (a pids limit): nothing planned ahead
            syncer.ahead.cancel()
            syncer.log.warning("sync.plan_ahead_failed", error=str(exc))
            return
        self.thread = thread
