"""The descriptors the HTTP side may hold: every listener and every connection of ``/healthz``,
``/metrics`` and the health-check node ports comes out of one :class:`DescriptorBudget`.

Sized from ``RLIMIT_NOFILE`` (read at each decision, so a limit changed at run time is followed):
a part is kept for the rest of the daemon (the sync path's netlink sockets, the manifests
directory, the API connections), never touched here. Of the HTTP share, the ``/healthz`` and
``/metrics`` listeners always have their place, connections always keep a floor, and the
health-check listeners take what is left; one that does not fit waits (its caller names it).

Connections are admitted by eviction, never refused for being late: when the budget is full,
the oldest idle connection of the client holding the most goes, so a probe from an address that
holds nothing is always answered, however many addresses hold idle connections. A connection
is idle while its client has sent nothing it has not read (not its whole request yet) and again
while its answer is written; one whose request waits in its socket, or whose handler is at
work, is never cut short. Loopback sources are one client: any local user can bind every
address of ``127.0.0.0/8``, so counting them apart would let one user hold the whole budget.

Bookkeeping: no I/O but ``getrlimit`` and the connection's own ``spoke`` check; cancelling a
connection's scope is how it is closed.
"""

from __future__ import annotations

import ipaddress
import resource
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

KEPT_MIN = 64
"""Descriptors always left to the rest of the daemon (netlink sockets of the sync, the drift
monitor and the inspector, the manifests directory's walk and inotify, API connections)."""
KEPT_FRACTION = 4
"""... or a quarter of the limit, if more."""
MIN_CONNECTIONS = 16
MAX_CONNECTIONS = 4096
"""Bounds of the connections all servers hold at once."""
CONNECTION_FLOOR_FRACTION = 4
"""Connections keep at least a quarter of the HTTP share (and :data:`MIN_CONNECTIONS`), however
many health-check listeners ask for descriptors: probes of ``/healthz`` need somewhere to land."""
MAX_PER_CLIENT = 16
"""Connections one client may hold at once; its next one takes the place of its oldest idle."""
UNLIMITED = 1 << 20
"""The limit assumed for ``RLIM_INFINITY``."""

LOOPBACK_CLIENT = "127.0.0.0/8"


def client_of(address: str) -> str:
    """The client a source address counts as: itself, but every loopback IPv4 address (also
    written IPv4-mapped) is :data:`LOOPBACK_CLIENT`."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if isinstance(ip, ipaddress.IPv4Address) and ip.is_loopback:
        return LOOPBACK_CLIENT
    return str(ip)


@dataclass(eq=False, slots=True)
class Connection:
    """One admitted connection; ``scope`` cancelled closes it."""

    client: str
    spoke: Callable[[], bool] | None = None
    """Whether bytes from the client wait to be read: a request come but not yet read is not
    idle (a probe is never taken for an idle connection in the instant before it is read)."""
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    busy: bool = False
    """Its request has been read: not to be evicted while its handler works."""
    evicted: bool = False

    def idle(self) -> bool:
        return not self.busy and not (self.spoke is not None and self.spoke())


class DescriptorBudget:
    """Listeners and connections of every HTTP server of the daemon, within the descriptor
    limit (``limit``: fixed, for tests; None: ``RLIMIT_NOFILE``'s soft value, read each time)."""

    def __init__(self, limit: int | None = None) -> None:
        self._limit = limit
        self.listeners = 0
        """Listening sockets held (``/healthz``, ``/metrics``, health-check node ports)."""
        self.held = 0
        """Connections held."""
        self.evictions = 0
        self.refusals = 0
        # client → its connections, oldest first (dicts keep insertion order).
        self._clients: dict[str, dict[Connection, None]] = {}
        # connection count → clients holding that many, in the order they came to hold it.
        self._by_count: dict[int, dict[str, None]] = {}
        self._most = 0

    @property
    def limit(self) -> int:
        if self._limit is not None:
            return self._limit
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return UNLIMITED if soft == resource.RLIM_INFINITY else soft

    @property
    def kept(self) -> int:
        """Descriptors left to the rest of the daemon."""
        limit = self.limit
        return max(KEPT_MIN, limit // KEPT_FRACTION)

    @property
    def share(self) -> int:
        """Descriptors of the HTTP servers: listeners and connections."""
        return max(0, self.limit - self.kept)

    @property
    def connection_floor(self) -> int:
        return min(MAX_CONNECTIONS, max(MIN_CONNECTIONS, self.share // CONNECTION_FLOOR_FRACTION))

    @property
    def total(self) -> int:
        """Connections that may be held now: the share less the listeners, within the bounds."""
        return min(MAX_CONNECTIONS, max(MIN_CONNECTIONS, self.share - self.listeners))

    # Listeners.

    def open_listener(self) -> None:
        """An essential listener (``/healthz``, ``/metrics``): counted, never refused."""
        self.listeners += 1

    def try_listener(self) -> bool:
        """Whether an optional listener (a health-check node port) fits; counted if it does."""
        if self.listeners + 1 + self.connection_floor > self.share:
            return False
        self.listeners += 1
        return True

    def close_listener(self) -> None:
        self.listeners -= 1

    # Connections.

    def take(self, address: str, spoke: Callable[[], bool] | None = None) -> Connection | None:
        """Admit a connection from ``address``, evicting to make room; None when nothing can
        go (no held connection is idle). ``spoke``: see :attr:`Connection.spoke`."""
        client = client_of(address)
        mine = self._clients.get(client)
        if mine is not None and len(mine) >= MAX_PER_CLIENT and not self._evict_from(client):
            self.refusals += 1
            return None
        while self.held >= self.total:
            if not self._evict():
                self.refusals += 1
                return None
        conn = Connection(client, spoke)
        self._add(conn)
        return conn

    def give(self, conn: Connection) -> None:
        """``conn`` is closed (a no-op if it was evicted)."""
        if not conn.evicted:
            self._remove(conn)

    def _evict(self) -> bool:
        """Evict the oldest idle connection of the client holding the most (among clients
        holding as many, the one that came to hold that many first)."""
        for count in range(self._most, 0, -1):
            for client in self._by_count.get(count, ()):
                if self._evict_from(client):
                    return True
        return False

    def _evict_from(self, client: str) -> bool:
        for conn in self._clients.get(client, ()):
            if conn.idle():
                conn.evicted = True
                conn.scope.cancel()  # its descriptor goes as its handler unwinds
                self._remove(conn)
                self.evictions += 1
                return True
        return False

    def _add(self, conn: Connection) -> None:
        mine = self._clients.setdefault(conn.client, {})
        self._move(conn.client, len(mine), len(mine) + 1)
        mine[conn] = None
        self.held += 1

    def _remove(self, conn: Connection) -> None:
        mine = self._clients[conn.client]
        del mine[conn]
        self._move(conn.client, len(mine) + 1, len(mine))
        if not mine:
            del self._clients[conn.client]
        self.held -= 1

    def _move(self, client: str, before: int, after: int) -> None:
        if before:
            level = self._by_count[before]
            del level[client]
            if not level:
                del self._by_count[before]
        if after:
            self._by_count.setdefault(after, {})[client] = None
        if after > self._most:
            self._most = after
        while self._most and self._most not in self._by_count:
            self._most -= 1

    def clients(self) -> dict[str, int]:
        """Connections held, by client."""
        return {client: len(conns) for client, conns in self._clients.items()}
