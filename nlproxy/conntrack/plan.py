"""The pure half of conntrack cleanup: which flows are stale, and how to find them in few passes.

Sits between the sync (which knows the frontends → backends programmed before and after a
commit) and :class:`nlproxy.conntrack.kernel.Conntrack` (which talks to the kernel). Pure: no I/O,
no
clock, no logging. Three parts:

- :func:`stale_flow_filters`: old and new frontends → filters for the flows left pointing nowhere;
- :func:`plan_passes`: those filters → few kernel dump passes (each costs a walk of the table);
- :func:`programmed_frontends`: frontends and backends as nlproxy programmed them, from read-back
  :class:`~nlproxy.nft.ir.Ruleset` values. It reads only the elements of the global maps the
  planner fills, never rules:

  - ``service-ips``: ``daddr . l4proto . dport`` → verdict, element comment ``ns/name:port/PROTO``;
  - ``backends``: ``daddr . l4proto . dport . index`` → ``endpoint addr . port``;
  - ``service-nodeports``: ``l4proto . dport`` → verdict, same comments;
  - ``nodeport-backends``: ``l4proto . dport . index`` → ``endpoint addr . port``;
  - a round-robin or consistent-hash port's own ``lb-cluster-…``/``lb-local-…`` maps: index →
    ``endpoint addr . port``, the map's comment naming the port (its frontends' comment).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from ipaddress import IPv4Address, IPv6Address

from nlproxy.conntrack.messages import PROTO_NAMES, Flow, FlowFilter, IPAddress
from nlproxy.errors import NlproxyError
from nlproxy.nft.ir import Dnat, Element, Ruleset, Value

MAX_PASSES = 32
"""More kernel-filtered passes than this, and one looser pass per family is cheaper: a pass costs
~30 ms at 100k flows, decoding a flow here ~15 µs."""
PREFILTER_MAX_MEMBERS = 16
"""Up to this many filters in a pass, raw messages are screened for their addresses first."""


@dataclass(frozen=True, slots=True)
class Frontend:
    """Where clients send: ``proto`` (tcp/udp/sctp), a service address (None: a NodePort, on
    every node address) and a port."""

    proto: str
    addr: IPAddress | None
    port: int

    def __str__(self) -> str:
        where = "nodeport" if self.addr is None else str(self.addr)
        return f"{self.proto}/{where}:{self.port}"


@dataclass(frozen=True, slots=True)
class Backend:
    """An endpoint that answers for a frontend: its address and (target) port."""

    addr: IPAddress
    port: int


def stale_flow_filters(
    old: Mapping[Frontend, frozenset[Backend]],
    new: Mapping[Frontend, frozenset[Backend]],
    *,
    node_addrs: Sequence[IPAddress],
    flush_tcp: bool = False,
) -> list[FlowFilter]:
    """Filters for the flows a change from ``old`` to ``new`` leaves pointing nowhere.

    - A backend that served a frontend in ``old`` and does not in ``new``: flows whose original
      destination is the frontend (each node address for a NodePort) and whose reply comes from
      that backend. UDP and SCTP only, TCP too with ``flush_tcp`` (a TCP client sees a reset).
    - A UDP frontend with no backends in ``old`` (or absent) and some in ``new``: its flows that
      were not DNAT'd. They were confirmed while nothing answered (blackholed or rejected) and
      would keep bypassing the new DNAT rules until they time out.

    Pure. The result is sorted, so the same input gives the same filters.
    """
    out: set[FlowFilter] = set()
    for fe, backends in old.items():
        if fe.proto == "tcp" and not flush_tcp:
            continue
        for be in backends - new.get(fe, frozenset()):
            for dst in _destinations(fe, node_addrs, be.addr.version):
                out.add(
                    FlowFilter(
                        proto=fe.proto,
                        orig_dst=dst,
                        orig_dport=fe.port,
                        reply_src=be.addr,
                        reply_sport=be.port,
                    )
                )
    for fe, backends in new.items():
        if fe.proto == "udp" and backends and not old.get(fe):
            for dst in _destinations(fe, node_addrs, None):
                out.add(FlowFilter(proto="udp", orig_dst=dst, orig_dport=fe.port, dnat=False))
    return sorted(out, key=_filter_sort_key)


def _destinations(
    fe: Frontend, node_addrs: Sequence[IPAddress], version: int | None
) -> list[IPAddress]:
    if fe.addr is not None:
        return [fe.addr] if version in (None, fe.addr.version) else []
    return [a for a in node_addrs if version in (None, a.version)]


def _filter_sort_key(f: FlowFilter) -> tuple[str, ...]:
    return tuple(str(getattr(f, fl.name)) for fl in fields(f))


# ---------------------------------------------------------------------------------------------
# Planning kernel passes


@dataclass(frozen=True, slots=True)
class Pass:
    """One kernel dump: ``kernel`` pre-selects, a flow is kept if any of ``members`` matches."""

    kernel: FlowFilter
    members: tuple[FlowFilter, ...]

    def matcher(self) -> Callable[[Flow], bool]:
        if len(self.members) == 1:
            return self.members[0].matches
        by_dst: dict[tuple[IPAddress, int], list[FlowFilter]] = defaultdict(list)
        rest: list[FlowFilter] = []
        for m in self.members:
            if m.orig_dst is not None and m.orig_dport is not None:
                by_dst[(m.orig_dst, m.orig_dport)].append(m)
            else:
                rest.append(m)

        def match(flow: Flow) -> bool:
            near = by_dst.get((flow.orig.dst, flow.orig.dport), ())
            return any(m.matches(flow) for m in near) or any(m.matches(flow) for m in rest)

        return match

    def prefilter(self) -> Callable[[bytes], bool] | None:
        """A cheap check on a raw dump message that every flow :meth:`matcher` keeps passes.

        Each member needs its addresses somewhere in the message's bytes. Where the kernel cannot
        pre-select by address (IPv6, loose passes) this skips decoding nearly every other flow.
        None when a member names no address or there are too many members for it to pay.
        """
        needles = []
        for m in self.members:
            need = tuple(a.packed for a in (m.orig_dst, m.reply_src) if a is not None)
            if not need:
                return None
            needles.append(need)
        if len(needles) > PREFILTER_MAX_MEMBERS:
            return None
        if len(needles) == 1:
            (only,) = needles

            def check_one(payload: bytes) -> bool:
                return all(n in payload for n in only)

            return check_one

        def check(payload: bytes) -> bool:
            return any(all(n in payload for n in need) for need in needles)

        return check


def _common(members: Sequence[FlowFilter]) -> FlowFilter:
    """The filter made of the fields every member agrees on."""
    first = members[0]
    agreed = {
        fl.name: getattr(first, fl.name)
        for fl in fields(first)
        if all(getattr(m, fl.name) == getattr(first, fl.name) for m in members)
    }
    return FlowFilter(**agreed)


def _group(filters: Iterable[FlowFilter], key: Callable[[FlowFilter], object]) -> list[Pass]:
    groups: dict[object, list[FlowFilter]] = defaultdict(list)
    for f in filters:
        groups[key(f)].append(f)
    return [Pass(_common(ms), tuple(ms)) for ms in groups.values()]


def plan_passes(filters: Sequence[FlowFilter], *, max_passes: int = MAX_PASSES) -> list[Pass]:
    """Group filters into few kernel passes.

    Filters are grouped by their original destination (one pass per frontend) or by their reply
    source (one pass per removed backend, covering its ClusterIP and every NodePort address),
    whichever needs fewer passes; past ``max_passes``, one pass per family and protocol.
    """
    unique = list(dict.fromkeys(filters))
    if not unique:
        return []
    by_orig = _group(unique, lambda f: (f.family, f.proto, f.orig_dst, f.orig_dport, f.dnat))

    def reply_key(f: FlowFilter) -> object:
        if f.reply_src is None:
            return ("orig", f.family, f.proto, f.orig_dst, f.orig_dport, f.dnat)
        return ("reply", f.family, f.proto, f.reply_src, f.reply_sport)

    by_reply = _group(unique, reply_key)
    best = min(by_orig, by_reply, key=len)
    if len(best) <= max_passes:
        return best
    return _group(unique, lambda f: (f.family, f.proto))


# ---------------------------------------------------------------------------------------------
# Read-back


SERVICE_IPS = "service-ips"
BACKENDS = "backends"
SERVICE_NODEPORTS = "service-nodeports"
NODEPORT_BACKENDS = "nodeport-backends"
BALANCED_MAP_PREFIXES = ("lb-cluster-", "lb-local-")
"""How a round-robin or consistent-hash port's own maps are named (``naming.balanced_map``)."""


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


def _balanced(rs: Ruleset) -> dict[str, set[Backend]]:
    """The endpoints in round-robin and consistent-hash ports' own maps, by service port."""
    out: dict[str, set[Backend]] = defaultdict(set)
    for name, s in rs.sets.items():
        if name.startswith(BALANCED_MAP_PREFIXES) and s.comment:
            out[s.comment].update(_backend(el) for el in rs.elements.get(name, {}).values())
    return out


AFFINITY_ENDPOINT_PREFIX = "endpoint-"
"""How a ClientIP-affinity port's per-endpoint chains are named
(``naming.affinity_endpoint_chain``): the chain's comment names the service port and its rule
DNATs to the endpoint."""


def _affinity(rs: Ruleset) -> dict[str, set[Backend]]:
    """The endpoints of ClientIP-affinity ports (in chains of their own, not in the maps), by
    service port."""
    out: dict[str, set[Backend]] = defaultdict(set)
    for name, chain in rs.chains.items():
        if not name.startswith(AFFINITY_ENDPOINT_PREFIX) or not chain.comment:
            continue
        for rule in rs.rules.get(name, ()):
            for e in rule.exprs:
                if isinstance(e, Dnat) and e.port is not None:
                    out[chain.comment].add(Backend(e.addr, e.port))
    return out


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
        own: dict[Frontend, str] = {}
        for name, nodeport in ((SERVICE_IPS, False), (SERVICE_NODEPORTS, True)):
            for el in rs.elements.get(name, {}).values():
                fe = _frontend(el, nodeport)
                backends.setdefault(fe, set())  # programmed even with no backends
                if el.comment:
                    services[fe] = own[fe] = el.comment
        for name, nodeport in ((BACKENDS, False), (NODEPORT_BACKENDS, True)):
            for el in rs.elements.get(name, {}).values():
                backends[_frontend(el, nodeport)].add(_backend(el))
        by_port = _balanced(rs)
        for ref, bes in _affinity(rs).items():
            by_port.setdefault(ref, set()).update(bes)
        for fe, ref in own.items():
            backends[fe].update(by_port.get(ref, ()))
    return Programmed({fe: frozenset(bes) for fe, bes in backends.items()}, services)
