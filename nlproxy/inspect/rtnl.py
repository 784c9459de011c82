"""rtnetlink read side of the inspector: one dump each of links, routes and neighbours.

Sits under ``inspect.py``: it turns pyroute2's untyped messages into the small frozen values the
classifier reads, and is the only inspector module that talks to the kernel for a snapshot. It
only reads: it never adds, changes or deletes a link, route or neighbour, and never execs.

pyroute2 (``inspect/pyroute.py``) is imported by the first call that talks to the kernel, not with
this module: the daemon imports the inspector at start but first classifies after its first
sync, and a node whose ``nodePortAddresses`` names no CIDR never dumps addresses, so pyroute2's
~50 ms of imports are not on the way to the first sync (``tests/unit/test_daemon_imports.py``).
A pyroute2 that cannot be imported then is a ``ConfigError`` naming it (``inspect/pyroute.py``).
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from ipaddress import ip_address, ip_network
from typing import TYPE_CHECKING, Any, Protocol

from nlproxy.errors import NlproxyError
from nlproxy.netlink import netns
from nlproxy.nft.ir import IPAddress, IPNetwork

IFF_UP = 0x1
RTNH_F_DEAD = 0x1
RTNH_F_LINKDOWN = 0x10
NUD_FAILED = 0x20

_NUD_NAMES = {
    0x01: "incomplete",
    0x02: "reachable",
    0x04: "stale",
    0x08: "delay",
    0x10: "probe",
    0x20: "failed",
    0x40: "noarp",
    0x80: "permanent",
}


class RtnlError(NlproxyError):
    """An rtnetlink dump failed; ``ref`` names the namespace and what was dumped."""


def nud_name(state: int) -> str:
    """Neighbour state (NUD_* bits) as ``ip neigh`` spells it, lower case."""
    names = [name for bit, name in _NUD_NAMES.items() if state & bit]
    return "|".join(names) or "none"


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """One network device. ``peer_index`` is IFLA_LINK (a veth's peer), ``peer_netnsid`` the
    IFLA_LINK_NETNSID of the peer's namespace when it is not this one."""

    index: int
    name: str
    kind: str | None
    admin_up: bool
    oper: str
    peer_index: int | None = None
    peer_netnsid: int | None = None

    @property
    def up(self) -> bool:
        # Tunnels, dummies and loopback report operstate UNKNOWN while they carry traffic.
        return self.admin_up and self.oper in ("UP", "UNKNOWN")


@dataclass(frozen=True, slots=True, kw_only=True)
class NextHop:
    oif: int | None
    gateway: IPAddress | None
    flags: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """One route: ``type`` is RTN_*, ``scope`` RT_SCOPE_*; several next hops for multipath."""

    dst: IPNetwork
    table: int
    type: int
    scope: int
    priority: int
    nexthops: tuple[NextHop, ...]
    onlink: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """Links by index, routes in dump order, neighbour states by (ifindex, address)."""

    links: dict[int, Link] = field(default_factory=dict)
    routes: tuple[Route, ...] = ()
    neighbours: dict[tuple[int, IPAddress], int] = field(default_factory=dict)


def _link(msg: Any) -> Link:
    netnsid = msg.get_attr("IFLA_LINK_NETNSID")
    peer = msg.get_attr("IFLA_LINK")
    return Link(
        index=int(msg["index"]),
        name=str(msg.get_attr("IFLA_IFNAME")),
        kind=msg.get(("linkinfo", "kind")),
        admin_up=bool(msg["flags"] & IFF_UP),
        oper=str(msg.get_attr("IFLA_OPERSTATE") or "UNKNOWN"),
        peer_index=int(peer) if peer else None,
        peer_netnsid=int(netnsid) if netnsid is not None else None,
    )


def _gateway(value: Any) -> IPAddress | None:
    return ip_address(value) if value else None


def _route(msg: Any) -> Route:
    family = int(msg["family"])
    dst = msg.get_attr("RTA_DST") or ("0.0.0.0" if family == socket.AF_INET else "::")
    flags = int(msg["flags"])
    multipath = msg.get_attr("RTA_MULTIPATH")
    if multipath:
        hops = tuple(
            NextHop(
                oif=int(hop["oif"]),
                gateway=_gateway(dict(hop["attrs"]).get("RTA_GATEWAY")),
                flags=int(hop["flags"]),
            )
            for hop in multipath
        )
    else:
        oif = msg.get_attr("RTA_OIF")
        hops = (
            NextHop(
                oif=int(oif) if oif else None,
                gateway=_gateway(msg.get_attr("RTA_GATEWAY")),
                flags=flags,
            ),
        )
    return Route(
        dst=ip_network(f"{dst}/{msg['dst_len']}"),
        table=int(msg.get_attr("RTA_TABLE") or msg["table"]),
        type=int(msg["type"]),
        scope=int(msg["scope"]),
        priority=int(msg.get_attr("RTA_PRIORITY") or 0),
        nexthops=hops,
        onlink=bool(flags & 0x4),  # RTNH_F_ONLINK
    )


def _neighbours(ipr: Any, families: Iterable[int]) -> dict[tuple[int, IPAddress], int]:
    out: dict[tuple[int, IPAddress], int] = {}
    for family in families:
        for msg in ipr.get_neighbours(family=family):
            dst = msg.get_attr("NDA_DST")
            if dst:
                out[(int(msg["ifindex"]), ip_address(dst))] = int(msg["state"])
    return out


def dump(netns_name: str | None, families: Iterable[int]) -> Snapshot:
    """Read links, then routes and neighbours of ``families`` (AF_INET/AF_INET6), one dump each.

    Raises:
        ConfigError: the namespace cannot be entered, or pyroute2 cannot be imported.
        RtnlError: the kernel refused a dump.
    """
    from nlproxy.inspect.pyroute import IPRoute, NetlinkError

    fams = sorted(set(families))
    with netns.entered(netns_name):
        ipr = IPRoute(groups=0)  # dumps only: no multicast subscriptions
    try:
        links = {link.index: link for link in map(_link, ipr.get_links())}
        routes = tuple(_route(m) for fam in fams for m in ipr.get_routes(family=fam))
        neighbours = _neighbours(ipr, fams)
    except NetlinkError as exc:
        where = f"netns {netns_name}" if netns_name else "netns (own)"
        raise RtnlError(f"{where} rtnetlink dump", str(exc)) from exc
    finally:
        ipr.close()
    return Snapshot(links=links, routes=routes, neighbours=neighbours)


def interface_addresses(netns_name: str | None) -> tuple[IPAddress, ...]:
    """Every address on this node's interfaces, as ``ip address`` lists them (one dump).

    Raises:
        ConfigError: the namespace cannot be entered, or pyroute2 cannot be imported.
        RtnlError: the kernel refused the dump.
    """
    from nlproxy.inspect.pyroute import IPRoute, NetlinkError

    with netns.entered(netns_name):
        ipr = IPRoute(groups=0)
    try:
        addrs = [ip_address(msg.get("IFA_ADDRESS")) for msg in ipr.get_addr()]
    except NetlinkError as exc:
        where = f"netns {netns_name}" if netns_name else "netns (own)"
        raise RtnlError(f"{where} rtnetlink address dump", str(exc)) from exc
    finally:
        ipr.close()
    return tuple(dict.fromkeys(addrs))


RTN_LOCAL = 2


def interface_towards(addr: IPAddress, netns_name: str | None) -> str:
    """The interface a packet from ``addr`` comes in on, as the node routes to it (``ip route
    get``: routing is symmetric for a pod, reached through its veth or its bridge); "" for one
    of the node's own addresses or an address the node has no route to.

    Raises:
        ConfigError: the namespace cannot be entered, or pyroute2 cannot be imported.
        RtnlError: the kernel refused the lookup for another reason than no route.
    """
    from nlproxy.inspect.pyroute import IPRoute, NetlinkError

    with netns.entered(netns_name):
        ipr = IPRoute(groups=0)
    try:
        try:
            routes = ipr.route("get", dst=str(addr))
        except NetlinkError as exc:
            if exc.code in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EINVAL):
                return ""
            raise
        oif = routes[0].get_attr("RTA_OIF") if routes else None
        if not oif or int(routes[0]["type"]) == RTN_LOCAL:
            return ""
        return str(ipr.get_links(int(oif))[0].get_attr("IFLA_IFNAME"))
    except NetlinkError as exc:
        where = f"netns {netns_name}" if netns_name else "netns (own)"
        raise RtnlError(f"{where} route to {addr}", str(exc)) from exc
    finally:
        ipr.close()


class NodeRoutes(Protocol):
    """What the sync's effects read of this node: links, routes and neighbours (the
    inspector's classification), and its interface addresses (``nodePortAddresses``). Real:
    :class:`RtnlNode`; fake: ``inspect/fake.py``'s ``FakeNode``."""

    def dump(self, families: Iterable[int]) -> Snapshot:
        """Links, and the routes and neighbours of ``families`` (AF_INET/AF_INET6)."""
        ...

    def addresses(self) -> tuple[IPAddress, ...]:
        """Every address on the node's interfaces."""
        ...


class RtnlNode:
    """The node as rtnetlink shows it in network namespace ``netns`` (None: this one); one
    socket per call, so a call may run in any thread."""

    def __init__(self, netns_name: str | None = None) -> None:
        self.netns = netns_name

    def dump(self, families: Iterable[int]) -> Snapshot:
        return dump(self.netns, families)

    def addresses(self) -> tuple[IPAddress, ...]:
        return interface_addresses(self.netns)


if TYPE_CHECKING:  # what ``NodeRoutes`` declares (mypy checks it)
    _node: NodeRoutes = RtnlNode()
