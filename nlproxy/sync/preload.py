"""A cold start's work done while the initial lists arrive, not after the last page.

The API source lists Services and EndpointSlices in pages; the API server takes most of a list's
time preparing them (10k Services x 10 endpoints: seconds), while the daemon waits. Each page,
as soon as it is decoded (``KubeSource``'s ``on_page``), goes into the cluster state
(``ClusterState.preload``: stored, claims settled) and the restart digest of the services it
changed is taken (``RestartRecords.warm``). Once the Services are listed (``on_listed``), most
of the slices are too: on a cold start the state so far is planned then, in a thread of its own
(``ahead.py``), and that plan follows the pages that come after until the lists end. Their
``Replace`` then finds every object stored and every service hashed, and the first sync updates
the plan for what the last pages brought: only the tail is left.

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

END_AFTER = "EndpointSlice"
"""The kind whose complete initial list ends the plan ahead's following of the pages (the
Services are listed by then, or the plan ahead has not started)."""
PLAN_AFTER = "Service"
"""The kind whose complete initial list starts the plan ahead. A Service's slices usually
follow it (the two are listed side by side and slices are the larger list): planned earlier,
more services would be planned twice (an in-place update costs about four times a service's
share of a full plan, ``proxy/incremental.py``'s ``REPLAN_SHARE``)."""


class Preload:
    """The API source's ``on_page`` (:meth:`page`) and ``on_listed`` (:meth:`listed`) for a
    daemon's cold start: the pages into ``state`` and the digest of what they change into
    ``syncer``, and the plan ahead (see the module docstring)."""

    def __init__(self, state: ClusterState, syncer: Syncer) -> None:
        self.state = state
        self.syncer = syncer
        self.thread: threading.Thread | None = None

    def page(self, changes: Sequence[Upsert | Skip | Invalid]) -> None:
        changed = self.state.preload(changes)
        if not changed:
            return
        snapshot = self.state.snapshot()
        self.syncer.records.warm(snapshot, changed)
        if self.thread is not None:  # planned ahead: the plan follows the pages
            self.syncer.ahead.update(snapshot, changed)

    def listed(self, kind: str) -> None:
        if kind == END_AFTER:
            self.syncer.ahead.end()  # the last kind of the lists that holds services
        if kind != PLAN_AFTER or self.thread is not None:
            return
        syncer, snapshot, fresh = self.syncer, self.state.snapshot(), self.syncer.fresh
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
