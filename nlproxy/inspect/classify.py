"""The endpoint inspector: can this node actually reach the addresses nlproxy DNATs to?

An effect after a commit (DESIGN §6): kube-proxy trusts EndpointSlice conditions, nlproxy also
checks each endpoint against the CNI's host routes. :func:`classify` takes one rtnetlink dump of
links, routes and neighbours (``rtnl.py``) and looks every endpoint up in it, the way the
kernel's FIB would with the default policy rules (tables local, main, default), so ten thousand
endpoints cost three dumps, not ten thousand requests. :func:`classify_snapshot` and
:func:`transitions` are pure. Nothing here changes routes or links, logs, or execs.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from nlproxy.inspect.rtnl import (
    NUD_FAILED,
    RTNH_F_DEAD,
    RTNH_F_LINKDOWN,
    Link,
    NextHop,
    NodeRoutes,
    Route,
    RtnlNode,
    Snapshot,
    nud_name,
)
from nlproxy.nft.ir import IPAddress

Kind = Literal["local", "remote", "unreachable"]

RTN_UNICAST = 1
RTN_LOCAL = 2
RTN_THROW = 9
_RTN_NAMES = {
    3: "broadcast",
    4: "anycast",
    5: "multicast",
    6: "blackhole",
    7: "unreachable",
    8: "prohibit",
}
RT_SCOPE_LINK = 253
RT_SCOPE_HOST = 254
_SCOPE_NAMES = {RT_SCOPE_LINK: "link", RT_SCOPE_HOST: "host"}
# Default policy rules: 0 lookup local, 32766 lookup main, 32767 lookup default.
_TABLE_ORDER = (255, 254, 253)
# Devices that carry traffic to another node rather than to a pod on this one.
TUNNEL_KINDS = frozenset(
    {"vxlan", "ipip", "gre", "gretap", "ip6tnl", "ip6gre", "sit", "geneve", "wireguard"}
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Reachability:
    """How this node reaches one endpoint address.

    Attributes:
        kind: ``local`` (a pod on this node), ``remote`` (via another node) or ``unreachable``.
        reachable: whether traffic DNAT'd to the address can leave this node toward it.
        device: the output device's name, when the route has one.
        gateway: the next hop toward another node, when there is one.
        state: the state that decided: device oper state, neighbour state or route type.
        reason: one line for an operator, naming the route and what is wrong or right.
        route: the route that matched, spelled like ``ip route`` (empty when none matched).
    """

    kind: Kind
    reachable: bool
    device: str | None
    gateway: IPAddress | None
    state: str
    reason: str
    route: str = ""


class RouteIndex:
    """Longest-prefix match over dumped routes, table by table in policy order."""

    def __init__(self, routes: Iterable[Route]) -> None:
        # (family bits, table) -> prefix length -> masked network int -> best route
        self._tables: dict[tuple[int, int], dict[int, dict[int, Route]]] = {}
        for route in routes:
            if route.table not in _TABLE_ORDER:
                continue
            bits = route.dst.max_prefixlen
            by_len = self._tables.setdefault((bits, route.table), {})
            slot = by_len.setdefault(route.dst.prefixlen, {})
            key = int(route.dst.network_address)
            best = slot.get(key)
            if best is None or route.priority < best.priority:
                slot[key] = route
        self._lengths = {key: sorted(by_len, reverse=True) for key, by_len in self._tables.items()}

    def lookup(self, addr: IPAddress) -> Route | None:
        """The route the kernel would pick for ``addr`` (ignoring source, mark and tos)."""
        bits = addr.max_prefixlen
        value = int(addr)
        for table in _TABLE_ORDER:
            by_len = self._tables.get((bits, table))
            if by_len is None:
                continue
            for plen in self._lengths[(bits, table)]:
                mask = ((1 << plen) - 1) << (bits - plen)
                route = by_len[plen].get(value & mask)
                if route is None:
                    continue
                if route.type == RTN_THROW:
                    break  # continue with the next table
                return route
        return None


def describe(route: Route, links: Mapping[int, Link]) -> str:
    """The route as ``ip route`` prints it: ``10.244.3.0/24 via 10.0.0.2 dev eth0``."""
    dst = route.dst
    words = [str(dst.network_address) if dst.prefixlen == dst.max_prefixlen else str(dst)]
    if route.type in _RTN_NAMES:
        words.insert(0, _RTN_NAMES[route.type])
    multipath = len(route.nexthops) > 1
    for hop in route.nexthops:
        if multipath:
            words.append("nexthop")
        if hop.gateway is not None:
            words += ["via", str(hop.gateway)]
        if hop.oif is not None:
            link = links.get(hop.oif)
            words += ["dev", link.name if link else f"if{hop.oif}"]
    if route.scope in _SCOPE_NAMES:
        words += ["scope", _SCOPE_NAMES[route.scope]]
    if route.onlink:
        words.append("onlink")
    return " ".join(words)


def _result(
    kind: Kind, ok: bool, state: str, why: str, *, route: str, link: Link | None = None
) -> Reachability:
    prefix = f"route {route}: " if route else ""
    return Reachability(
        kind=kind if ok else "unreachable",
        reachable=ok,
        device=link.name if link else None,
        gateway=None,
        state=state,
        reason=prefix + why,
        route=route,
    )


def _neighbour_check(
    snap: Snapshot, link: Link, addr: IPAddress, kind: Kind, route: str, what: str
) -> Reachability:
    """Reachable unless the neighbour entry for ``addr`` on ``link`` is FAILED."""
    state = snap.neighbours.get((link.index, addr))
    if state is None:
        # Never resolved yet: the first packet resolves it, so this is not a failure.
        return _result(kind, True, "up", f"{what}, no neighbour entry yet", route=route, link=link)
    name = nud_name(state)
    if state & NUD_FAILED:
        why = f"neighbour {addr} on {link.name} is FAILED"
        return _result(kind, False, name, why, route=route, link=link)
    return _result(kind, True, name, f"{what}, neighbour {addr} {name}", route=route, link=link)


def _veth_peer_gone(snap: Snapshot, link: Link) -> bool:
    if link.peer_index is None:
        return True
    # A peer in another namespace (link-netnsid) lives as long as this end does: deleting
    # either end, or the namespace holding it, destroys the pair.
    return link.peer_netnsid is None and link.peer_index not in snap.links


def _via_hop(addr: IPAddress, hop: NextHop, snap: Snapshot, route: str) -> Reachability:
    link = snap.links.get(hop.oif) if hop.oif is not None else None
    if link is None:
        return _result("unreachable", False, "gone", "output device is gone", route=route)
    if not link.up or hop.flags & (RTNH_F_DEAD | RTNH_F_LINKDOWN):
        state = link.oper.lower() if link.admin_up else "down"
        return _result("unreachable", False, state, "device is down", route=route, link=link)
    if hop.gateway is not None:
        res = _neighbour_check(snap, link, hop.gateway, "remote", route, "next hop up")
        return replace(res, gateway=hop.gateway)
    if link.kind == "veth":
        if _veth_peer_gone(snap, link):
            why = f"veth {link.name} peer is gone"
            return _result("unreachable", False, "gone", why, route=route, link=link)
        return _neighbour_check(snap, link, addr, "local", route, "pod veth up")
    if link.kind == "bridge":
        return _neighbour_check(snap, link, addr, "local", route, f"pod on bridge {link.name}")
    if link.kind in TUNNEL_KINDS:
        return _result("remote", True, "up", f"{link.kind} tunnel up", route=route, link=link)
    return _neighbour_check(snap, link, addr, "remote", route, f"on-link via {link.name}")


def classify_one(addr: IPAddress, snap: Snapshot, index: RouteIndex) -> Reachability:
    """Classify one address against a snapshot and its route index (pure)."""
    route = index.lookup(addr)
    if route is None:
        return _result("unreachable", False, "no-route", f"no route to {addr}", route="")
    text = describe(route, snap.links)
    if route.type == RTN_LOCAL:
        hop = route.nexthops[0]
        link = snap.links.get(hop.oif) if hop.oif is not None else None
        why = "address belongs to this node"
        return _result("local", True, "local", why, route=f"local {text}", link=link)
    if route.type != RTN_UNICAST:
        name = _RTN_NAMES.get(route.type, f"type {route.type}")
        return _result("unreachable", False, name, f"{name} route", route=text)
    results = [_via_hop(addr, hop, snap, text) for hop in route.nexthops]
    return next((r for r in results if r.reachable), results[0])


def classify_snapshot(
    endpoints: Iterable[IPAddress], snap: Snapshot
) -> dict[IPAddress, Reachability]:
    """Classify every endpoint against one snapshot (pure; duplicates are classified once).

    Equal verdicts are one object: most endpoints of a node share a handful (local through the
    same kind of veth, remote through the same gateway), so 100k endpoints hold a few hundred
    verdicts rather than 100k, from the moment they are made.
    """
    index = RouteIndex(snap.routes)
    pool: dict[Reachability, Reachability] = {}
    share = pool.setdefault
    out: dict[IPAddress, Reachability] = {}
    for addr in endpoints:
        if addr not in out:
            verdict = classify_one(addr, snap, index)
            out[addr] = share(verdict, verdict)
    return out


def classify(
    endpoints: Iterable[IPAddress], *, netns: str | None = None, node: NodeRoutes | None = None
) -> dict[IPAddress, Reachability]:
    """Classify endpoints as local, remote or unreachable from this node (or ``netns``).

    One dump each of links, routes and neighbours, for the address families present, from
    ``node`` (default: rtnetlink in ``netns``).

    Raises:
        ConfigError: ``netns`` cannot be entered.
        RtnlError: a dump failed.
    """
    addrs = list(dict.fromkeys(endpoints))
    if not addrs:
        return {}
    families = {socket.AF_INET if a.version == 4 else socket.AF_INET6 for a in addrs}
    return classify_snapshot(addrs, (node or RtnlNode(netns)).dump(families))


def address_order(addr: IPAddress) -> tuple[int, int]:
    """Sort key: IPv4 before IPv6, then by value."""
    return (addr.version, int(addr))


def transitions(
    old: Mapping[IPAddress, Reachability], new: Mapping[IPAddress, Reachability]
) -> list[tuple[IPAddress, Reachability | None, Reachability | None]]:
    """Endpoints whose classification changed, appeared or disappeared, sorted by address.

    A change is a different kind, reachability, device or gateway, or, while unreachable, a
    different state. Neighbour states of reachable endpoints (reachable, stale, delay) churn with
    traffic and are not transitions; ``None`` on one side means the endpoint is new or gone.
    """

    def key(r: Reachability) -> tuple[object, ...]:
        return (r.kind, r.reachable, r.device, r.gateway, None if r.reachable else r.state)

    out: list[tuple[IPAddress, Reachability | None, Reachability | None]] = []
    for addr in sorted(old.keys() | new.keys(), key=address_order):
        before, after = old.get(addr), new.get(addr)
        if before is None or after is None or key(before) != key(after):
            out.append((addr, before, after))
    return out
