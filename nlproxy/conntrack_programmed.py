"""Frontends and backends as nlproxy programmed them, recovered from read-back rulesets.

Feeds ``nlproxy conntrack --service/--all-stale`` (and the daemon at start-up) from the kernel,
with no API access. Pure: it walks :class:`~nlproxy.nft.ir.Ruleset` values that
``nlproxy.nft.readback`` produced; it does no I/O and never interprets rules, only the elements
of the global maps the planner fills:

- ``service-ips``: ``daddr . l4proto . dport`` → verdict, element comment ``ns/name:port/PROTO``;
- ``backends``: ``daddr . l4proto . dport . index`` → ``endpoint addr . port``;
- ``service-nodeports``: ``l4proto . dport`` → verdict, same comments;
- ``nodeport-backends``: ``l4proto . dport . index`` → ``endpoint addr . port``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address

from nlproxy.conntrack import Backend, Frontend
from nlproxy.conntrack_msg import PROTO_NAMES
from nlproxy.errors import NlproxyError
from nlproxy.nft.ir import Element, Ruleset, Value

SERVICE_IPS = "service-ips"
BACKENDS = "backends"
SERVICE_NODEPORTS = "service-nodeports"
NODEPORT_BACKENDS = "nodeport-backends"


class UnexpectedElement(NlproxyError):
    """A map element whose key or data does not have the shape the planner writes."""


@dataclass(frozen=True, slots=True)
class Programmed(Mapping[Frontend, frozenset[Backend]]):
    """Frontend → backends, plus the service port (``ns/name:port/PROTO``) behind each frontend."""

    backends: Mapping[Frontend, frozenset[Backend]]
    services: Mapping[Frontend, str]

    def __getitem__(self, key: Frontend) -> frozenset[Backend]:
        return self.backends[key]

    def __iter__(self) -> Iterator[Frontend]:
        return iter(self.backends)

    def __len__(self) -> int:
        return len(self.backends)

    def frontends_of(self, service: str) -> list[Frontend]:
        """Frontends of ``ns/name`` (every port) or of one ``ns/name:port/PROTO``."""
        return [
            fe
            for fe, ref in self.services.items()
            if ref == service or ref.split(":", 1)[0] == service
        ]


def _proto(el: Element, num: Value) -> str:
    if not isinstance(num, int) or num not in PROTO_NAMES:
        raise UnexpectedElement(f"element {el.key} of map {el.set}", f"l4proto {num}")
    return PROTO_NAMES[num]


def _addr(el: Element, v: Value) -> IPv4Address | IPv6Address:
    if not isinstance(v, IPv4Address | IPv6Address):
        raise UnexpectedElement(f"element {el.key} of map {el.set}", f"{v} is not an address")
    return v


def _port(el: Element, v: Value) -> int:
    if not isinstance(v, int):
        raise UnexpectedElement(f"element {el.key} of map {el.set}", f"{v} is not a port")
    return v


def _frontend(el: Element, nodeport: bool) -> Frontend:
    """The frontend an element of one of the four maps belongs to (its key's first parts)."""
    if nodeport:
        return Frontend(_proto(el, el.key[0]), None, _port(el, el.key[1]))
    return Frontend(_proto(el, el.key[1]), _addr(el, el.key[0]), _port(el, el.key[2]))


def _backend(el: Element) -> Backend:
    if not isinstance(el.value, tuple) or len(el.value) != 2:
        raise UnexpectedElement(f"element {el.key} of map {el.set}", "data is not addr . port")
    return Backend(_addr(el, el.value[0]), _port(el, el.value[1]))


def programmed_frontends(rulesets: Iterable[Ruleset]) -> Programmed:
    """Every frontend nlproxy programmed in ``rulesets`` (``ip nlproxy``, ``ip6 nlproxy``).

    A frontend in the dispatch maps with no backend elements has no endpoints (its traffic is
    rejected). NodePort frontends of both families merge into one (``addr`` None).

    Raises:
        UnexpectedElement: an element of those maps has another shape.
    """
    backends: dict[Frontend, set[Backend]] = defaultdict(set)
    services: dict[Frontend, str] = {}
    for rs in rulesets:
        for name, nodeport in ((SERVICE_IPS, False), (SERVICE_NODEPORTS, True)):
            for el in rs.elements.get(name, {}).values():
                fe = _frontend(el, nodeport)
                backends.setdefault(fe, set())  # programmed even with no backends
                if el.comment:
                    services[fe] = el.comment
        for name, nodeport in ((BACKENDS, False), (NODEPORT_BACKENDS, True)):
            for el in rs.elements.get(name, {}).values():
                backends[_frontend(el, nodeport)].add(_backend(el))
    return Programmed({fe: frozenset(bes) for fe, bes in backends.items()}, services)
