"""A node's links, routes, neighbours and addresses in memory, standing in for
:class:`~nlproxy.inspect.rtnl.RtnlNode` (beside ``rtnl.py``; the same ``NodeRoutes``
interface). A test builds the :class:`~nlproxy.inspect.rtnl.Snapshot` it wants the inspector to
see. Pure: no I/O.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from nlproxy.inspect.rtnl import Snapshot
from nlproxy.nft.ir import IPAddress

if TYPE_CHECKING:
    from nlproxy.inspect.rtnl import NodeRoutes


class FakeNode:
    """``snapshot`` (routes and neighbours of both families) and ``addrs``; ``dumps`` counts
    the dumps asked for."""

    def __init__(self, snapshot: Snapshot | None = None, addrs: Iterable[IPAddress] = ()) -> None:
        self.snapshot = snapshot or Snapshot()
        self.addrs = tuple(addrs)
        self.dumps = 0

    def dump(self, families: Iterable[int]) -> Snapshot:
        """The snapshot's links, with the routes and neighbours of ``families`` only."""
        self.dumps += 1
        versions = {4 if f == socket.AF_INET else 6 for f in families}
        snap = self.snapshot
        return replace(
            snap,
            routes=tuple(r for r in snap.routes if r.dst.version in versions),
            neighbours={k: v for k, v in snap.neighbours.items() if k[1].version in versions},
        )

    def addresses(self) -> tuple[IPAddress, ...]:
        return self.addrs


if TYPE_CHECKING:  # the fake stands in for the kernel's (mypy checks it)
    _node: NodeRoutes = FakeNode()
