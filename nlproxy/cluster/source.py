"""What a source of cluster objects gives the daemon: one long-lived trio task that sends the
objects as batches of changes.

Two sources fit it: ``kube.KubeSource`` (the Kubernetes API) and ``watchdir.ManifestSource``
(a directory of manifests). The daemon knows them only through :class:`Source`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import trio

from nlproxy.cluster.model import Change


class Source(Protocol):
    """A source of the cluster's objects."""

    async def run(
        self,
        send: trio.MemorySendChannel[Sequence[Change]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Send the current objects (a ``Replace`` per kind) and report started, then send
        every change until cancelled.

        Cancellation: returns (or raises ``Cancelled``) at the next wait; nothing is left open.
        """
        ...
