"""A cold start's work done while the initial lists arrive, not after the last page.

The API source lists Services and EndpointSlices in pages; the API server takes most of a list's
time preparing them (10k Services x 10 endpoints: seconds), while the daemon waits. Each page,
as soon as it is decoded (``KubeSource``'s ``on_page``), goes into the cluster state
(``ClusterState.preload``: stored, claims settled) and the restart digest of the services it
changed is taken (``Syncer.warm``). When the lists end, their ``Replace`` finds every object
stored and every service hashed: the first sync starts with only the tail left (what the last
pages changed, and what the lists removed).

Nothing here syncs: the loop's first sync still waits for the complete lists, so the kernel
never sees a partial cluster (a restart must not delete the Services of the pages not read yet).
Runs on the event loop, before the sync loop starts: nothing else touches the state or the
Syncer meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from nlproxy.cluster.model import Invalid, Skip, Upsert
from nlproxy.cluster.state import ClusterState
from nlproxy.sync.syncer import Syncer


def preloading(
    state: ClusterState, syncer: Syncer
) -> Callable[[Sequence[Upsert | Skip | Invalid]], None]:
    """The ``on_page`` of a daemon's API source: each page into ``state``, and the digest of
    what it changed into ``syncer`` (see the module docstring)."""

    def on_page(changes: Sequence[Upsert | Skip | Invalid]) -> None:
        changed = state.preload(changes)
        if changed:
            syncer.warm(state.snapshot(), changed)

    return on_page
