"""Which Service owns a frontend when several claim it, and which addresses no Service may take.

Sits inside the cluster state (``state.py``), between the parsed objects and the planner: it
decides, per Service, what the planner sees. Pure: no I/O, clock or logging.

The API server keeps ClusterIPs and NodePorts unique, but manifests (and a hand-edited object) do
not, and ``externalIPs`` are any user's to write (CVE-2020-8554). A frontend written twice into the
kernel's maps goes to whichever Service was written last, silently. So:

* a ClusterIP that is unspecified, loopback, link-local, multicast or the broadcast address
  leaves its Service out whole, named (the API server allocates ClusterIPs only from the service
  ranges; a manifest's ``127.0.0.1`` would take the node's own listeners);
* so does a ClusterIP that is one of this node's own addresses (its interfaces', its Node's), or
  inside the cluster's pod ranges (``--cluster-cidr``, the Node's ``podCIDRs``), known or not
  the service ranges: ``172.18.0.2`` port 22 would send every client's SSH to a pod. An address
  inside a known service range is not taken for the node's own: a ClusterIP bound on purpose
  (``kube-ipvs0``, NodeLocal DNSCache) is a Service's;
* so does a ClusterIP outside every service range known for its family (``--service-cidr`` and
  the ServiceCIDR objects): a manifest's ``8.8.8.8`` would take that address from every pod. With
  no range of its family known, any other ClusterIP is taken as written: the service ranges are
  what guard the rest;
* a ``healthCheckNodePort`` outside the NodePort range is refused (the Service stays, without
  its health check): ``22`` would bind the node's SSH port;
* two Services with one ClusterIP, or one NodePort (and protocol): the older keeps it, the
  younger is left out whole, named;
* an external IP (``spec.externalIPs``, a load-balancer ingress IP) that is another Service's
  ClusterIP is refused: a ClusterIP belongs to its Service;
* an external IP and port claimed by two Services: the older keeps it, the younger loses that
  address;
* an external IP that is unspecified, loopback, link-local, multicast or the broadcast address
  is refused (the API server refuses most of these for ``externalIPs``; taking ``127.0.0.1:80``
  breaks the node's own listener, ``169.254.169.254`` would take the cloud's metadata service);
* with ``--external-ip-cidrs``, an ``externalIPs`` entry outside those ranges is refused.

Older means an earlier ``metadata.creationTimestamp``, compared as instants (``...T01:00:00+01:00``
and ``...T00:00:00Z`` are equal); without one (manifests), or with one that is not an RFC 3339
timestamp (``"0"``), after those that have one; equal ages by namespace, then name. The state is
kept incrementally: a change re-decides only the Services that share a claim with the changed
ones.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from ipaddress import IPv4Address
from typing import cast

import msgspec

from nlproxy.cluster.model import IPAddress, IPNetwork, Service, ServiceKey
from nlproxy.errors import shorten

_Key = tuple[object, ...]
"""("cluster", ip), ("nodeport", protocol, port), ("external", ip, protocol, port), and
("extip", ip): any external claim of the address (to find them when its ClusterIP changes).
``ip`` is :func:`_ip_key`'s: an IPv4 address as its number (hashed in C; an ``IPv4Address``
hashes in Python, on every lookup of every key holding it)."""

_Held = _Key | frozenset[_Key]
"""A Service's claims as ``Claims`` keeps them: its one claim itself (a Service with only a
ClusterIP: nearly every one), or a frozenset of them. A one-element frozenset costs 216 bytes,
10,000 of them 2 MB at 10k Services."""

_Holders = ServiceKey | set[ServiceKey]
"""The Services holding one claim as ``Claims`` keeps them: the one holder itself (nearly every
claim), or a set of two or more."""


def _each(held: _Held) -> frozenset[_Key] | tuple[_Key]:
    """The claims of ``held`` (one claim or a frozenset of them), to iterate."""
    return (held,) if type(held) is tuple else held  # type: ignore[return-value]


def _as_set(held: _Held) -> frozenset[_Key]:
    return frozenset((held,)) if type(held) is tuple else held  # type: ignore[return-value]


def _keys(holders: _Holders | None) -> set[ServiceKey] | frozenset[ServiceKey]:
    """The holders of one claim (``_Holders``, or None: nobody) as a set."""
    if holders is None:
        return _NONE
    if type(holders) is set:
        return holders
    return frozenset((cast(ServiceKey, holders),))


BROADCAST = IPv4Address("255.255.255.255")

_NONE: frozenset[ServiceKey] = frozenset()
_NO_CLAIMS: frozenset[_Key] = frozenset()


NODE_PORT_RANGE = (30000, 32767)
"""The API server's default ``--service-node-port-range``: health-check node ports come from it."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """What a Service is refused: the whole Service (``whole``), some external addresses, or
    its health-check node port (``health``)."""

    whole: str | None
    addresses: tuple[tuple[IPAddress, str], ...]
    """(address, why) of each external IP left out."""
    health: str | None = None

    def messages(self, key: ServiceKey) -> tuple[str, ...]:
        if self.whole is not None:
            return (shorten(f"Service {key}: {self.whole}; left out"),)
        out = [shorten(f"Service {key}: {why}; {ip} left out") for ip, why in self.addresses]
        if self.health is not None:
            out.append(shorten(f"Service {key}: {self.health}; no health check served"))
        return tuple(out)


def _number_reader() -> Callable[[IPv4Address], int]:
    """How to read an IPv4 address's number: its ``_ip`` slot when it holds ``int()``'s value
    (CPython's ``ipaddress``; a C-level read, not ``__int__``'s Python frame), else ``int``."""
    read = operator.attrgetter("_ip")
    try:
        works = read(IPv4Address("10.1.2.3")) == int(IPv4Address("10.1.2.3"))
    except AttributeError:
        works = False
    return read if works else int


_number = _number_reader()


def _ip_key(ip: IPAddress) -> object:
    """``ip`` as claim keys hold it: IPv4 as its number, IPv6 as itself (equal to no number)."""
    return _number(ip) if type(ip) is IPv4Address else ip


def special(ip: IPAddress) -> str | None:
    """Why no Service may take ``ip`` as an external address, or None."""
    if type(ip) is IPv4Address and _plain_v4(_number(ip)):
        return None
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if ip == BROADCAST:
        return "the broadcast address"
    return None


def _plain_v4(n: int) -> bool:
    """Whether the IPv4 address numbered ``n`` is none of ``special``'s (the common case,
    without ipaddress's network lookups)."""
    top = n >> 24
    return (
        bool(n) and top != 127 and n >> 16 != 0xA9FE and not 224 <= top <= 239 and n != 0xFFFFFFFF
    )


_Order = tuple[int, int, str, str]
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _order(key: ServiceKey, created: str) -> _Order:
    """Age first (the instant, whatever offset it is written with), then namespace and name;
    a missing or unreadable timestamp (``"0"``) sorts after every real one."""
    when = _instant(created)
    return (0 if when is not None else 1, when or 0, key.namespace, key.name)


def _instant(created: str) -> int | None:
    """An RFC 3339 timestamp as microseconds since the epoch (no offset: UTC); None if it is
    not one."""
    if "T" not in created.upper():
        return None
    try:
        when = datetime.fromisoformat(created)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - _EPOCH) // _MICROSECOND


def _claims(svc: Service) -> _Held:
    """``svc``'s claims: the one claim itself when it has only one (``_Held``)."""
    if not svc.external_ips and not svc.load_balancer_ips:  # the common case
        cluster: list[_Key] = [("cluster", _ip_key(ip)) for ip in svc.cluster_ips]
        cluster += [("nodeport", p.ref.protocol, p.node_port) for p in svc.ports if p.node_port]
        return cluster[0] if len(cluster) == 1 else frozenset(cluster)
    out: set[_Key] = {("cluster", _ip_key(ip)) for ip in svc.cluster_ips}
    external = [_ip_key(ip) for ip in (*svc.external_ips, *svc.load_balancer_ips)]
    for p in svc.ports:
        proto = p.ref.protocol
        if p.node_port:
            out.add(("nodeport", proto, p.node_port))
        for ip in external:
            out.add(("external", ip, proto, p.port))
    out.update(("extip", ip) for ip in external)
    return frozenset(out)


class Claims:
    """The frontends each Service claims, and what each is refused (kept incrementally)."""

    def __init__(
        self,
        external_ip_cidrs: Iterable[IPNetwork] = (),
        service_cidrs: Iterable[IPNetwork] = (),
        *,
        cluster_cidrs: Iterable[IPNetwork] = (),
        node_port_range: tuple[int, int] = NODE_PORT_RANGE,
    ) -> None:
        self.external_ip_cidrs = tuple(external_ip_cidrs)
        self._configured_ranges = tuple(service_cidrs)
        self.configured_pods = tuple(cluster_cidrs)
        self.node_port_range = node_port_range
        # The node's own addresses and the pod ranges, which no ClusterIP may be (``set_node``).
        self._own: frozenset[object] = frozenset()  # as _ip_key has them
        self._own_v4 = False
        self._guard_v4 = False
        self._pods: tuple[IPNetwork, ...] = ()
        self._v4_pods: tuple[tuple[int, int], ...] = ()
        self._pods_text = {4: "", 6: ""}
        self._ranges: tuple[IPNetwork, ...] = ()
        self._v4_ranges: tuple[tuple[int, int], ...] = ()  # (network, netmask) as numbers
        self._v6_ranges: tuple[IPNetwork, ...] = ()
        self._ranges_text = {4: "", 6: ""}
        self.set_service_ranges(())
        self.set_node((), ())
        self._claims: dict[ServiceKey, _Held] = {}
        self._by: dict[_Key, _Holders] = {}
        self._created: dict[ServiceKey, str] = {}
        """Each Service's ``created`` (the Service's own string), whence its age order
        (``_order_of``): kept as orders, they were 1 MB at 10k Services, for the few that
        share a claim."""
        self._oldest: dict[_Key, ServiceKey] = {}
        """The oldest holder of each shared claim, once asked; dropped when its holders or
        their ages change. Without it, H Services sharing one address cost H x H comparisons
        per change (4,000 Services with one ClusterIP took 15 s to apply)."""
        self.refused: dict[ServiceKey, Refusal] = {}
        self._extips = 0
        """How many ("extip", ip) claims ``_by`` holds (none: no ClusterIP needs a look)."""

    def update(
        self, keys: Iterable[ServiceKey], services: Mapping[ServiceKey, Service]
    ) -> set[ServiceKey]:
        """Take the current version of ``keys`` (absent: deleted).

        Returns:
            The other Services whose refusal changed because of it (the caller re-plans them).
        """
        touched: set[_Key] = set()
        settled: set[ServiceKey] = set()
        by = self._by
        claims_of, created_of, refused = self._claims, self._created, self.refused
        for key in keys:
            svc = services.get(key)
            new = _claims(svc) if svc is not None else _NO_CLAIMS
            old = claims_of.get(key, _NO_CLAIMS)
            if not old and svc is not None:  # a new Service (every one, on a cold start)
                alone = True
                for claim in _each(new):
                    holders = by.get(claim)
                    if holders is None:
                        by[claim] = key
                        if claim[0] == "extip":
                            self._extips += 1
                    else:
                        self._hold(claim, holders, key)
                        alone = False
                claims_of[key] = new
                created_of[key] = svc.created
                mine = alone and key not in refused and self._plain_alone(svc)
                if mine and not self._watched(new):
                    # Its claims are its alone and it is refused nothing: decided, and no
                    # other Service's refusal depends on them (a later one taking one of
                    # them puts both in ``touched``).
                    settled.add(key)
                else:
                    touched.update(_each(new))
                continue
            touched |= self._replace(key, svc, _as_set(old), _as_set(new))
        given = set(keys)
        affected = given - settled
        oldest = self._oldest
        extips = self._extips
        for claim in touched:
            if oldest:
                oldest.pop(claim, None)
            sharing = by.get(claim)
            if type(sharing) is set:
                affected |= sharing  # others hold it: their refusal may change
            elif sharing is not None:
                affected.add(sharing)  # type: ignore[arg-type]
            if extips and claim[0] == "cluster":  # external claims of that address depend on it
                affected |= _keys(by.get(("extip", claim[1])))
        return self._redecide(affected, services) - given

    def _hold(self, claim: _Key, holders: _Holders, key: ServiceKey) -> None:
        """Add ``key`` to the ``holders`` of ``claim`` (there is at least one already)."""
        if type(holders) is set:
            holders.add(key)
        elif holders != key:
            self._by[claim] = {holders, key}  # type: ignore[arg-type]

    def _release(self, claim: _Key, key: ServiceKey) -> None:
        """Take ``key`` out of the holders of ``claim``; a claim nobody holds goes."""
        by = self._by
        holders = by[claim]
        if type(holders) is set:
            holders.discard(key)
            if len(holders) > 1:
                return
            if holders:  # one left: kept as itself
                by[claim] = next(iter(holders))
                return
        elif holders != key:
            return
        del by[claim]
        if claim[0] == "extip":
            self._extips -= 1

    def _replace(
        self, key: ServiceKey, svc: Service | None, old: frozenset[_Key], new: frozenset[_Key]
    ) -> set[_Key] | frozenset[_Key]:
        """Take ``svc`` (None: deleted), which held ``old`` and now claims ``new``; the claims
        whose holders or holders' ages changed."""
        touched: set[_Key] | frozenset[_Key] = _NO_CLAIMS
        if svc is not None:
            before = self._created.get(key)
            if before is not None and before != svc.created:  # its age decides every claim
                touched = old | new
            self._created[key] = svc.created
        if new == old:
            if svc is None:  # deleted holding nothing (headless, no nodePort): forgotten too
                self._claims.pop(key, None)
                self._created.pop(key, None)
            return touched
        for claim in old - new:
            self._release(claim, key)
        for claim in new - old:
            holding = self._by.get(claim)
            if holding is None:
                self._by[claim] = key
                if claim[0] == "extip":
                    self._extips += 1
            else:
                self._hold(claim, holding, key)
        if svc is None:
            self._claims.pop(key, None)
            self._created.pop(key, None)
        else:
            self._claims[key] = next(iter(new)) if len(new) == 1 else new
        return touched | (old ^ new)

    def _redecide(
        self, keys: set[ServiceKey], services: Mapping[ServiceKey, Service]
    ) -> set[ServiceKey]:
        """Decide the refusal of each of ``keys`` anew; those whose refusal changed."""
        refused = self.refused
        changed: set[ServiceKey] = set()
        plain = self._plain
        for key in keys:
            svc = services.get(key)
            refusal = None if svc is None or plain(svc) else self._decide(svc)
            if refusal != refused.get(key):
                if refusal is None:
                    refused.pop(key, None)
                else:
                    refused[key] = refusal
                changed.add(key)
        return changed

    def set_service_ranges(self, objects: Iterable[IPNetwork]) -> bool:
        """Take the ranges of the ServiceCIDR objects (the configured ones are kept beside them).

        Returns:
            Whether the ranges changed: then every Service must be decided anew (``update``).
        """
        ranges = tuple(
            sorted(
                {*self._configured_ranges, *objects},
                key=lambda n: (n.version, int(n.network_address), n.prefixlen),
            )
        )
        if ranges == self._ranges:
            return False
        self._ranges = ranges
        self._v4_ranges = tuple(
            (int(n.network_address), int(n.netmask)) for n in ranges if n.version == 4
        )
        self._v6_ranges = tuple(n for n in ranges if n.version == 6)
        for version in (4, 6):
            self._ranges_text[version] = ", ".join(str(n) for n in ranges if n.version == version)
        return True

    def set_node(self, addresses: Iterable[IPAddress], pod_cidrs: Iterable[IPNetwork]) -> bool:
        """Take this node's own addresses (its interfaces' and its Node's) and its Node's pod
        ranges (the configured cluster ranges are kept beside them).

        Returns:
            Whether they changed: then every Service must be decided anew (``update``).
        """
        pods = tuple(
            sorted(
                {*self.configured_pods, *pod_cidrs},
                key=lambda n: (n.version, int(n.network_address), n.prefixlen),
            )
        )
        own = frozenset(_ip_key(ip) for ip in addresses if special(ip) is None)
        if pods == self._pods and own == self._own:
            return False
        self._own, self._pods = own, pods
        self._own_v4 = any(type(k) is int for k in own)
        self._v4_pods = tuple(
            (int(n.network_address), int(n.netmask)) for n in pods if n.version == 4
        )
        self._guard_v4 = self._own_v4 or bool(self._v4_pods)  # anything to look up
        for version in (4, 6):
            self._pods_text[version] = ", ".join(str(n) for n in pods if n.version == version)
        return True

    def _forbidden_v4(self, n: int) -> bool:
        """Whether the IPv4 address numbered ``n`` is this node's own or a pod's (cheap)."""
        if self._own_v4 and n in self._own and not self._in_service_ranges_v4(n):
            return True
        return any(n & mask == net for net, mask in self._v4_pods)

    def _in_service_ranges_v4(self, n: int) -> bool:
        return any(n & mask == net for net, mask in self._v4_ranges)

    def _forbidden(self, ip: IPAddress) -> str | None:
        """Why no ClusterIP may be ``ip`` (the node's own, or a pod's), or None."""
        if type(ip) is IPv4Address:
            n = _number(ip)
            if self._own_v4 and n in self._own and not self._in_service_ranges_v4(n):
                return "one of this node's own addresses"
        elif ip in self._own and not any(ip in net for net in self._v6_ranges):
            return "one of this node's own addresses"
        if any(ip in net for net in self._pods if net.version == ip.version):
            return f"inside the cluster's pod ranges ({self._pods_text[ip.version]})"
        return None

    def _outside_service_ranges(self, ip: IPAddress) -> bool:
        """Whether ``ip`` lies outside every known service range of its family (none known: no)."""
        if type(ip) is IPv4Address:
            n = _number(ip)
            return bool(self._v4_ranges) and all(n & mask != net for net, mask in self._v4_ranges)
        return bool(self._v6_ranges) and all(ip not in net for net in self._v6_ranges)

    def effective(self, svc: Service) -> Service | None:
        """``svc`` as the planner should see it: None when left out whole."""
        refusal = self.refused.get(svc.key)
        if refusal is None:
            return svc
        if refusal.whole is not None:
            return None
        gone = {ip for ip, _ in refusal.addresses}
        return msgspec.structs.replace(
            svc,
            external_ips=tuple(ip for ip in svc.external_ips if ip not in gone),
            load_balancer_ips=tuple(ip for ip in svc.load_balancer_ips if ip not in gone),
            health_check_node_port=(
                None if refusal.health is not None else svc.health_check_node_port
            ),
        )

    def _oldest_holder(
        self, claim: _Key, holders: set[ServiceKey] | frozenset[ServiceKey]
    ) -> ServiceKey:
        oldest = self._oldest.get(claim)
        if oldest is None:
            oldest = self._oldest[claim] = min(holders, key=self._order_of)
        return oldest

    def _order_of(self, key: ServiceKey) -> _Order:
        return _order(key, self._created[key])

    def _older(self, key: ServiceKey, claim: _Key) -> ServiceKey | None:
        """The oldest other Service holding ``claim``, if it is older than ``key``.

        Ages are distinct (names break ties), so that is the oldest holder unless it is ``key``.
        """
        holders = self._by.get(claim)
        if type(holders) is not set:  # the common case: the claim is its alone
            return None
        oldest = self._oldest_holder(claim, holders)
        return None if oldest == key else oldest

    def _watched(self, claims: _Held) -> bool:
        """Whether another Service's external address depends on one of ``claims`` (a
        ClusterIP that is also someone's external IP)."""
        if not self._extips:
            return False
        by = self._by
        return any(c[0] == "cluster" and ("extip", c[1]) in by for c in _each(claims))

    def _plain_alone(self, svc: Service) -> bool:
        """``_plain`` of a Service that holds each of its claims alone (its ClusterIP and
        NodePorts are then its own whatever their number): one ordinary IPv4 ClusterIP in
        the service ranges (neither the node's own nor a pod's), no external address, no
        stray health-check port."""
        if svc.external_ips or svc.load_balancer_ips:
            return False
        ips = svc.cluster_ips
        if len(ips) != 1 or type(ips[0]) is not IPv4Address:
            return False
        n = _number(ips[0])
        if not _plain_v4(n) or (self._guard_v4 and self._forbidden_v4(n)):
            return False
        if svc.health_check_node_port is not None and self._odd_health(svc):
            return False
        ranges = self._v4_ranges
        return not ranges or any(n & mask == net for net, mask in ranges)

    def _plain(self, svc: Service) -> bool:
        """Whether ``_decide`` would refuse ``svc`` nothing, known cheaply: the common Service
        (one IPv4 ClusterIP, an ordinary address in the service ranges, neither the node's own
        nor a pod's, held by it alone; no NodePort, no external address, no stray health-check
        port). False: ask ``_decide``."""
        if svc.external_ips or svc.load_balancer_ips or len(svc.cluster_ips) != 1:
            return False
        ip = svc.cluster_ips[0]
        if type(ip) is not IPv4Address:
            return False
        n = _number(ip)
        if not _plain_v4(n) or (self._guard_v4 and self._forbidden_v4(n)):
            return False
        if svc.health_check_node_port is not None and self._odd_health(svc):
            return False
        ranges = self._v4_ranges
        if ranges and all(n & mask != net for net, mask in ranges):
            return False
        if type(self._by.get(("cluster", n))) is set:  # shared
            return False
        return not any(p.node_port for p in svc.ports)

    def _odd_health(self, svc: Service) -> bool:
        """Whether ``svc``'s health-check node port is outside the NodePort range."""
        port = svc.health_check_node_port
        low, high = self.node_port_range
        return port is not None and port != 0 and not low <= port <= high

    def _decide(self, svc: Service) -> Refusal | None:
        key = svc.key
        for i, ip in enumerate(svc.cluster_ips):
            what = special(ip) or self._forbidden(ip)
            if what is None and self._outside_service_ranges(ip):
                what = f"outside the service ranges ({self._ranges_text[ip.version]})"
            if what is not None:
                field = "spec.clusterIP" if len(svc.cluster_ips) == 1 else f"spec.clusterIPs[{i}]"
                return Refusal(whole=f"{field}: {ip} is {what}", addresses=())
        for ip in svc.cluster_ips:
            winner = self._older(key, ("cluster", _ip_key(ip)))
            if winner is not None:
                return Refusal(
                    whole=f"ClusterIP {ip} is also Service {winner}'s (older)", addresses=()
                )
        for p in svc.ports:
            if p.node_port:
                claim: _Key = ("nodeport", p.ref.protocol, p.node_port)
                winner = self._older(key, claim)
                if winner is not None:
                    what = f"nodePort {p.node_port}/{p.ref.protocol.value}"
                    return Refusal(whole=f"{what} is also Service {winner}'s (older)", addresses=())
        health = None
        if self._odd_health(svc):
            low, high = self.node_port_range
            health = (
                f"spec.healthCheckNodePort: {svc.health_check_node_port} is outside the "
                f"NodePort range ({low}-{high}, --service-node-port-range)"
            )
        if not svc.external_ips and not svc.load_balancer_ips:
            return None if health is None else Refusal(whole=None, addresses=(), health=health)
        refused: dict[IPAddress, str] = {}
        for field, ips in (
            ("spec.externalIPs", svc.external_ips),
            ("status.loadBalancer.ingress", svc.load_balancer_ips),
        ):
            for ip in ips:
                if ip in refused:
                    continue
                why = self._refuse_address(svc, ip, field)
                if why is not None:
                    refused[ip] = why
        if not refused and health is None:
            return None
        return Refusal(
            whole=None,
            addresses=tuple(sorted(refused.items(), key=lambda i: (i[0].version, int(i[0])))),
            health=health,
        )

    def _refuse_address(self, svc: Service, ip: IPAddress, field: str) -> str | None:
        # ``field`` comes from the caller: finding it here by ``ip in svc.external_ips`` was a
        # scan per address, seconds for one Service of 10,000 externalIPs.
        what = special(ip)
        if what is not None:
            return f"{field}: {ip} is {what}"
        if (
            self.external_ip_cidrs
            and field == "spec.externalIPs"
            and not any(ip in net for net in self.external_ip_cidrs if net.version == ip.version)
        ):
            return f"{field}: {ip} is outside --external-ip-cidrs"
        ip_key = _ip_key(ip)
        owners = _keys(self._by.get(("cluster", ip_key)))
        if owners and (len(owners) > 1 or svc.key not in owners):
            owner = self._oldest_holder(("cluster", ip_key), owners)
            if owner == svc.key:  # it holds that ClusterIP too (and is refused for it)
                owner = min(owners - {svc.key}, key=self._order_of)
            return f"{field}: {ip} is the ClusterIP of Service {owner}"
        for p in svc.ports:
            winner = self._older(svc.key, ("external", ip_key, p.ref.protocol, p.port))
            if winner is not None:
                port = f"{p.port}/{p.ref.protocol.value}"
                return f"{field}: {ip} port {port} is also Service {winner}'s (older)"
        return None
