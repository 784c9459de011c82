"""The ruleset's shape read backwards: programmed maps → frontends → backends.

The planner writes the shape (docs/ruleset.md); this is the one module that reads it back, from
:class:`~nlproxy.nft.ir.Ruleset` values (a kernel read-back, or a plan as it would be read back).
Conntrack cleanup (which backends did a commit take away, also from a delta's touched
frontends only), ``nlproxy inspect`` (which endpoints are DNAT'd to) and ``nlproxy explain``
(what one Service has programmed) all read through it. Pure: no I/O, no clock, no logging.

Where a frontend and its endpoints are:

- ``service-ips``: ``daddr . l4proto . dport`` → verdict, element comment ``ns/name:port/PROTO``;
  ``service-nodeports`` the same keyed ``l4proto . dport``;
- ``no-endpoint-services`` / ``no-endpoint-nodeports``: frontends rejected or dropped;
- ``backends`` / ``backends-local``: the frontend's key ``. index`` → ``endpoint addr . port``,
  indexes 0..N-1; ``nodeport-backends`` / ``nodeport-backends-local`` likewise;
- a round-robin or consistent-hash port's own ``lb-cluster-…``/``lb-local-…`` maps: index or
  slot → ``endpoint addr . port``, the map's comment naming the port;
- ``endpoint-…`` chains (comment: the port) of tables an earlier nlproxy wrote for ClientIP
  affinity, each ``dnat to`` one endpoint (now a clients map per port, ``affinity.py``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Set
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

from nlproxy.errors import NlproxyError
from nlproxy.nft.ir import (
    DataType,
    Dnat,
    DnatMap,
    Element,
    Family,
    IPAddress,
    L4Proto,
    Ruleset,
    Value,
    names,
)
from nlproxy.nft.packed import PackedElements, index_bytes
from nlproxy.nft.reconcile import Delta, ElementId, PackedChanges
from nlproxy.nft.values import key_order
from nlproxy.proxy import naming as n

Target = tuple[IPAddress, int]
FrontKey = tuple[int, IPAddress | None, int]
"""(l4proto, address or None for a node port, port): a frontend as the maps key it."""


@dataclass(frozen=True, slots=True)
class Shape:
    """The maps of one kind of frontend; their keys start with ``width`` values."""

    dispatch: str
    no_endpoint: str
    backends: str
    local: str
    width: int


ADDRESS = Shape(n.SERVICE_IPS, n.NO_ENDPOINT_SERVICES, n.BACKENDS, n.BACKENDS_LOCAL, 3)
NODEPORT = Shape(
    n.SERVICE_NODEPORTS, n.NO_ENDPOINT_NODEPORTS, n.NODEPORT_BACKENDS, n.NODEPORT_BACKENDS_LOCAL, 2
)
SHAPES = (ADDRESS, NODEPORT)
GLOBAL_BACKENDS = frozenset({ADDRESS.backends, ADDRESS.local, NODEPORT.backends, NODEPORT.local})
ADDRESS_KEYED = (
    n.SERVICE_IPS,
    n.NO_ENDPOINT_SERVICES,
    n.FIREWALL_IPS,
    n.FIREWALL_ALLOW,
    n.EXTERNAL_SHORTCUTS,
    n.BACKENDS,
    *(n.BACKENDS_LOCAL, n.AFFINITY_ADDRESSES),
)
"""Maps whose keys start ``addr . l4proto . port``."""
NODEPORT_KEYED = (
    n.SERVICE_NODEPORTS,
    n.NO_ENDPOINT_NODEPORTS,
    n.NODEPORT_SHORTCUTS,
    n.NODEPORT_BACKENDS,
    n.NODEPORT_BACKENDS_LOCAL,
    *(n.AFFINITY_NODEPORTS, n.AFFINITY_ENDPOINTS),
)
"""Maps whose keys start ``l4proto . port``."""
_UDP = int(L4Proto.UDP)
_TCP = int(L4Proto.TCP)
_BALANCED = tuple(f"{role}-" for role in n.BALANCED_MAPS)
_AFFINITY_ENDPOINT = f"{n.AFFINITY_ENDPOINT}-"
_NAMES = {int(p): p.name for p in L4Proto}
_NUMBERS = {name: number for number, name in _NAMES.items()}
_PORT_NAMES = {int(p): p.name.lower() for p in (L4Proto.TCP, L4Proto.UDP, L4Proto.SCTP)}
"""The protocols with ports, as a read-back :class:`Frontend` names them."""


def proto_name(proto: int) -> str:
    """A Service protocol's name (``TCP``, ``UDP``, ``SCTP``), or the number."""
    return _NAMES.get(proto) or str(proto)


def proto_number(name: str) -> int:
    """The l4proto of a protocol :func:`proto_name` names, in any case, or a number."""
    number = _NUMBERS.get(name.upper())
    return int(name) if number is None else number


class UnexpectedElement(NlproxyError):
    """A map element whose key or data does not have the shape the planner writes.

    Attributes:
        element: the element.
    """

    def __init__(self, element: Element, reason: str) -> None:
        self.element = element
        super().__init__(f"element {element.key} of map {element.set}", reason)


# ---------------------------------------------------------------------------------------------
# Elements


def _addr(v: Value) -> IPAddress | None:
    if isinstance(v, IPv4Address | IPv6Address):
        return v
    if isinstance(v, IPv4Network | IPv6Network) and v.num_addresses == 1:
        return v.network_address
    return None


def front_key(key: tuple[Value, ...], width: int) -> FrontKey | None:
    """The frontend of a key starting ``addr . l4proto . port`` (``width`` 3) or ``l4proto .
    port`` (2); None for another shape."""
    if len(key) < width:
        return None
    addr = None
    if width == 3:
        addr = _addr(key[0])
        if addr is None:
            return None
    proto, port = key[width - 2], key[width - 1]
    if isinstance(proto, int) and isinstance(port, int):
        return (proto, addr, port)
    return None


def element_front(set_name: str, key: tuple[Value, ...]) -> FrontKey | None:
    """The frontend an element of a per-frontend map belongs to, None for other sets/shapes."""
    if set_name in NODEPORT_KEYED:
        return front_key(key, 2)
    if set_name in ADDRESS_KEYED:
        return front_key(key, 3)
    return None


def target(value: object) -> Target | None:
    """A backends map's data, ``addr . port``; None for another shape."""
    if isinstance(value, tuple) and len(value) == 2:
        addr, port = value
        if isinstance(addr, IPv4Address | IPv6Address) and isinstance(port, int):
            return (addr, port)
    return None


def _head(fk: FrontKey) -> tuple[Value, ...]:
    """The first values of the keys of a frontend's elements."""
    proto, addr, port = fk
    return (proto, port) if addr is None else (addr, proto, port)


def _strict_target(el: Element) -> Target:
    found = target(el.value)
    if found is None:
        raise UnexpectedElement(el, "data is not addr . port")
    return found


def keyed(
    rs: Ruleset, name: str, width: int, *, strict: bool = False
) -> Iterator[tuple[FrontKey, Element]]:
    """The elements of the per-frontend map ``name``, each with its frontend.

    Raises:
        UnexpectedElement: with ``strict``, for a key of another shape (else it is skipped).
    """
    for key, el in rs.elements.get(name, {}).items():
        fk = front_key(key, width)
        if fk is None:
            if strict:
                head = "daddr . l4proto . dport" if width == 3 else "l4proto . dport"
                raise UnexpectedElement(el, f"key is not {head}")
            continue
        yield fk, el


def targets(
    rs: Ruleset,
    name: str,
    width: int,
    wanted: Set[FrontKey] | None = None,
    *,
    strict: bool = False,
) -> dict[FrontKey, tuple[Target, ...]]:
    """A backends map grouped by frontend (only the ``wanted`` ones, None: all), each
    frontend's targets in index order without repeats, in one pass over the map.

    Raises:
        UnexpectedElement: with ``strict``, for an element of another shape (else skipped).
    """
    groups: dict[FrontKey, list[Element]] = {}
    if wanted is None:
        for fk, el in keyed(rs, name, width, strict=strict):
            groups.setdefault(fk, []).append(el)
    else:  # a few frontends of a large map: compare key prefixes before decoding them
        heads = {_head(fk): fk for fk in wanted if (fk[1] is None) == (width == 2)}
        els = rs.elements.get(name, {})
        if isinstance(els, PackedElements) and _indexed(els, width):  # as bytes
            packed = {els.pack_key((*h, 0))[:-4]: fk for h, fk in heads.items()}
            for k, d in els.raw.items():
                if (front := packed.get(k[:-4])) is not None:
                    groups.setdefault(front, []).append(els.element(k, d))
        else:
            for key, el in els.items():
                if (front := heads.get(key[:width])) is not None:
                    groups.setdefault(front, []).append(el)
    out: dict[FrontKey, tuple[Target, ...]] = {}
    for fk, group in groups.items():
        found: list[Target] = []
        for el in sorted(group, key=lambda el: key_order(el.key)):
            t = _strict_target(el) if strict else target(el.value)
            if t is not None:
                found.append(t)
        out[fk] = tuple(dict.fromkeys(found))
    return out


# ---------------------------------------------------------------------------------------------
# Frontends → backends, as conntrack cleanup sees them


@dataclass(frozen=True, slots=True)
class Frontend:
    """Where clients send, read back: ``proto`` (tcp/udp/sctp), a service address (None: a
    NodePort, on every node address) and a port. (The planner's own, richer
    :class:`nlproxy.proxy.planner.Frontend` is what it writes; this is what a read finds.)"""

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


def frontend(fk: FrontKey) -> Frontend:
    """The frontend a map key names (``proto`` the protocol's name in lower case, or its
    number)."""
    proto, addr, port = fk
    return Frontend(_PORT_NAMES.get(proto) or proto_name(proto).lower(), addr, port)


def port_backends(rs: Ruleset) -> dict[str, set[Backend]]:
    """The endpoints that are not in the global backends maps, by service port (``ns/name:
    port/PROTO``): round-robin and consistent-hash ports' own maps, ClientIP-affinity ports'
    endpoint chains."""
    out: dict[str, set[Backend]] = defaultdict(set)
    for name, s in rs.sets.items():
        if name.startswith(_BALANCED) and s.comment:
            for el in rs.elements.get(name, {}).values():
                out[s.comment].add(Backend(*_strict_target(el)))
    for name, chain in rs.chains.items():
        if not name.startswith(_AFFINITY_ENDPOINT) or not chain.comment:
            continue
        for rule in rs.rules.get(name, ()):
            for e in rule.exprs:
                if isinstance(e, Dnat) and e.port is not None:
                    out[chain.comment].add(Backend(e.addr, e.port))
    return out


def _indexed(els: PackedElements, width: int) -> bool:
    """Whether a packed map's keys are a frontend (``width`` parts) and a 4-byte index."""
    key = els.set.key
    return len(key) == width + 1 and key[-1] is DataType.INTEGER


def _packed_backends(
    els: PackedElements,
    width: int,
    backends: dict[Frontend, set[Backend]],
    front: Callable[[Element, FrontKey], Frontend],
) -> None:
    """The backends of a packed map by frontend: each frontend's key prefix and each target's
    bytes are decoded once, not each element.

    Raises:
        UnexpectedElement: an element of another shape.
    """
    fronts: dict[bytes, set[Backend]] = {}
    found: dict[bytes, Backend] = {}
    for k, d in els.raw.items():
        bucket = fronts.get(k[:-4])  # the index is the last 4 bytes
        if bucket is None:
            fk = front_key(els.decode_key(k), width)
            if fk is None:
                raise UnexpectedElement(els.element(k, d), "key is not a frontend . index")
            bucket = fronts[k[:-4]] = backends[front(els.element(k, d), fk)]
        b = found.get(d)
        if b is None:
            t = target(els.decode_data(d))
            if t is None:
                raise UnexpectedElement(els.element(k, d), "data is not addr . port")
            b = found[d] = Backend(*t)
        bucket.add(b)


def programmed_frontends(rulesets: Iterable[Ruleset]) -> Programmed:
    """Every frontend programmed in ``rulesets`` (``ip nlproxy``, ``ip6 nlproxy``) with every
    backend it DNATs to, its Local policy's too (which need not be among the Cluster ones: a
    terminating local fallback, a local endpoint hinted to another zone).

    A frontend in the dispatch maps with no backend elements has no endpoints (its traffic is
    rejected). NodePort frontends of both families merge into one (``addr`` None).

    Raises:
        UnexpectedElement: an element of the dispatch or backends maps has another shape.
    """
    backends: dict[Frontend, set[Backend]] = defaultdict(set)
    services: dict[Frontend, str] = {}
    fronts: dict[FrontKey, Frontend] = {}

    def front(el: Element, fk: FrontKey) -> Frontend:  # made and checked once per frontend
        fe = fronts.get(fk)
        if fe is None:
            if fk[0] not in _PORT_NAMES:
                raise UnexpectedElement(el, f"l4proto {fk[0]}")
            fe = fronts[fk] = frontend(fk)
        return fe

    for rs in rulesets:
        own: dict[Frontend, str] = {}
        for shape in SHAPES:
            for fk, el in keyed(rs, shape.dispatch, shape.width, strict=True):
                fe = front(el, fk)
                backends.setdefault(fe, set())  # programmed even with no backends
                if el.comment:
                    services[fe] = own[fe] = el.comment
        for shape in SHAPES:
            for name in (shape.backends, shape.local):
                els = rs.elements.get(name, {})
                if isinstance(els, PackedElements) and _indexed(els, shape.width):
                    _packed_backends(els, shape.width, backends, front)
                    continue
                for fk, el in keyed(rs, name, shape.width, strict=True):
                    backends[front(el, fk)].add(Backend(*_strict_target(el)))
        by_port = port_backends(rs)
        for fe, ref in own.items():
            backends[fe].update(by_port.get(ref, ()))
    return Programmed({fe: frozenset(bes) for fe, bes in backends.items()}, services)


# ---------------------------------------------------------------------------------------------
# The part of a ruleset that holds some frontends' backends


def udp_only(rs: Ruleset) -> Ruleset:
    """The dispatch and backends elements of ``rs``'s UDP frontends, and the maps and endpoint
    chains of its round-robin, consistent-hash and ClientIP-affinity UDP ports."""
    out = Ruleset(table=rs.table)
    for shape in SHAPES:
        proto = shape.width - 2  # the l4proto's place in the key
        for name in (shape.dispatch, shape.backends, shape.local):
            els = rs.elements.get(name, {})
            if isinstance(els, PackedElements):  # a backends map: compared as bytes
                out.elements[name] = els.select(proto, _UDP)
            else:
                out.elements[name] = {k: el for k, el in els.items() if k[proto] == _UDP}
    for name, s in rs.sets.items():
        if name.startswith(_BALANCED) and s.comment.endswith("/UDP"):
            out.sets[name], out.elements[name] = s, dict(rs.elements.get(name, {}))
    for name, chain in rs.chains.items():
        if name.startswith(_AFFINITY_ENDPOINT) and chain.comment.endswith("/UDP"):
            out.chains[name], out.rules[name] = chain, list(rs.rules.get(name, ()))
    return out


def delta_frontends(
    deltas: Mapping[Family, Delta], rulesets: Mapping[Family, Ruleset]
) -> tuple[list[Ruleset], list[Ruleset]]:
    """The dispatch and backends elements of every frontend a delta touches, before and after.

    Per family, a ruleset holding only those frontends' elements (every endpoint index, not just
    the touched ones), as the last plan had them and as ``rulesets`` (the new plan) has them.
    :func:`programmed_frontends` of these equals that of the whole tables on those frontends,
    and the other frontends did not change, so stale flows found from them are all the stale
    flows. A NodePort frontend spans both families, so it is gathered from both.
    """
    fronts: set[tuple[Value, ...]] = set()
    balanced: dict[Family, set[str]] = {}
    for family, delta in deltas.items():
        for name, key in delta.elements:
            for shape in SHAPES:
                if name in (shape.dispatch, shape.backends, shape.local):
                    fronts.add(key[: shape.width])
        names = {name for name, _ in delta.elements} | set(delta.sets)
        balanced[family] = {x for x in names if x.startswith(_BALANCED)}
    refs = {_balanced_ref(deltas[f], rulesets[f], x) for f, xs in balanced.items() for x in xs}
    # A ClientIP-affinity port's endpoints are chains of its own: one came or went.
    refs |= {
        (pair[1] or pair[0])[0].comment  # type: ignore[index]
        for delta in deltas.values()
        for name, pair in delta.chains.items()
        if name.startswith(_AFFINITY_ENDPOINT) and (pair[1] or pair[0]) is not None
    }
    refs.discard("")
    if refs:  # a round-robin or consistent-hash port changed: its frontends and all its maps
        for family, rs in rulesets.items():
            for shape in SHAPES:
                els = rs.elements.get(shape.dispatch, {})
                fronts.update(k[: shape.width] for k, el in els.items() if el.comment in refs)
            balanced.setdefault(family, set()).update(
                x for x, s in rs.sets.items() if x.startswith(_BALANCED) and s.comment in refs
            )
    if not fronts:
        return [], []
    before, after = [], []
    for family, rs in rulesets.items():
        changes = deltas[family].elements
        b, a = Ruleset(table=rs.table), Ruleset(table=rs.table)
        for shape in SHAPES:
            mine = [f for f in fronts if len(f) == shape.width]
            for out, side in ((b, 0), (a, 1)):
                _gather(out, rs, changes, side, shape, mine)
        for out, side in ((b, 0), (a, 1)):
            _gather_balanced(out, rs, deltas[family], side, balanced.get(family, set()))
            if refs:
                _gather_affinity(out, rs, deltas[family], side, refs)
        before.append(b)
        after.append(a)
    return before, after


def flow_frontends(
    deltas: Mapping[Family, Delta], rulesets: Mapping[Family, Ruleset], *, flush_tcp: bool
) -> tuple[list[Ruleset], list[Ruleset]]:
    """:func:`delta_frontends` of the frontends whose flows a change can leave stale.

    Those of TCP frontends are only deleted with ``flush_tcp`` (``stale_flow_filters``), so
    without it their elements are left out before anything is decoded; the packed backends
    changes of the others are decoded into the elements ``delta_frontends`` reads. The
    filters found from the result are those found from the whole deltas.
    """
    return delta_frontends(
        {f: _for_flows(d, rulesets[f], flush_tcp) for f, d in deltas.items()}, rulesets
    )


def _for_flows(delta: Delta, rs: Ruleset, flush_tcp: bool) -> Delta:
    out = Delta(chains=dict(delta.chains), sets=dict(delta.sets))
    widths = {shape.dispatch: shape.width for shape in SHAPES}
    widths.update((m, shape.width) for shape in SHAPES for m in (shape.backends, shape.local))
    dispatch = {shape.dispatch for shape in SHAPES}
    refs: set[str] = set()
    for ident, pair in delta.elements.items():
        width = widths.get(ident[0])
        if width is None or flush_tcp or ident[1][width - 2] != _TCP:
            out.elements[ident] = pair
            if ident[0] in dispatch:
                refs.update(el.comment for el in pair if el is not None and el.comment)
    if refs:
        _own_backends(out, rs, refs)
    for name, changes in delta.packed.items():
        width = widths.get(name)
        store = rs.elements.get(name)
        if width is not None and isinstance(store, PackedElements):
            out.elements.update(_decoded(name, store, changes, width, flush_tcp))
    return out


def _own_backends(out: Delta, rs: Ruleset, refs: set[str]) -> None:
    """List in ``out``, unchanged, the endpoint chains (ClientIP affinity) and maps (round
    robin, consistent hashing) of the service ports ``refs``, which hold their frontends'
    backends: a frontend that comes or goes with them unchanged (a Service's addresses
    changed, not its endpoints) still had or has those backends."""
    for name, chain in rs.chains.items():
        if chain.comment in refs and name.startswith(_AFFINITY_ENDPOINT) and name not in out.chains:
            state = (chain, tuple(rs.rules.get(name, ())))
            out.chains[name] = (state, state)
    for name, s in rs.sets.items():
        if s.comment in refs and name.startswith(_BALANCED) and name not in out.sets:
            out.sets[name] = (s, s)


def _decoded(
    name: str, store: PackedElements, changes: PackedChanges, width: int, flush_tcp: bool
) -> Iterable[tuple[ElementId, tuple[Element | None, Element | None]]]:
    """The changes of a frontend-keyed packed map as elements, less TCP frontends' unless
    ``flush_tcp`` (each frontend's key decoded once when the key ends in its index)."""
    keep: dict[bytes, bool] = {}
    indexed = len(store.set.key) == width + 1
    for k, (b, a) in changes.items():
        head = k[:-4] if indexed else k
        wanted = keep.get(head)
        key: tuple[Value, ...] | None = None
        if wanted is None:
            key = store.decode_key(k)
            wanted = keep[head] = flush_tcp or key[width - 2] != _TCP
        if wanted:
            key = key or store.decode_key(k)
            yield (
                (name, key),
                (
                    None if b is None else store.element(k, b),
                    None if a is None else store.element(k, a),
                ),
            )


def _balanced_ref(delta: Delta, rs: Ruleset, name: str) -> str:
    """The service port a round-robin or consistent-hash map belongs to (its comment)."""
    pair = delta.sets.get(name)
    s = rs.sets.get(name) or (pair and (pair[1] or pair[0]))
    return s.comment if s else ""


def _gather_affinity(out: Ruleset, rs: Ruleset, delta: Delta, side: int, refs: set[str]) -> None:
    """Copy the endpoint chains of the affinity ports ``refs`` names, as they were or are."""
    names = {x for x in rs.chains if x.startswith(_AFFINITY_ENDPOINT)}
    names |= {x for x in delta.chains if x.startswith(_AFFINITY_ENDPOINT)}
    for name in names:
        pair = delta.chains.get(name)
        if pair is not None:
            state = pair[side]
            if state is None:
                continue
            chain, rules = state
        elif name in rs.chains:
            chain, rules = rs.chains[name], tuple(rs.rules.get(name, ()))
        else:
            continue
        if chain.comment in refs:
            out.chains[name], out.rules[name] = chain, list(rules)


def _gather_balanced(out: Ruleset, rs: Ruleset, delta: Delta, side: int, names: set[str]) -> None:
    """Copy the port's own maps (``lb-cluster-…``/``lb-local-…``) as they were or are."""
    for name in names:
        pair = delta.sets.get(name)
        s = pair[side] if pair is not None else rs.sets.get(name)
        if s is None:
            continue
        out.sets[name] = s
        keys = set(rs.elements.get(name, {})) | {k for x, k in delta.elements if x == name}
        els: dict[tuple[Value, ...], Element] = {}
        for key in keys:
            change = delta.elements.get((name, key))
            el = change[side] if change is not None else rs.elements.get(name, {}).get(key)
            if el is not None:
                els[key] = el
        out.elements[name] = els


def _gather(
    out: Ruleset,
    rs: Ruleset,
    changes: Mapping[tuple[str, tuple[Value, ...]], tuple[Element | None, Element | None]],
    side: int,
    shape: Shape,
    fronts: list[tuple[Value, ...]],
) -> None:
    """Copy the elements of ``fronts`` into ``out`` as they were (side 0) or are (side 1)."""

    def get(name: str, key: tuple[Value, ...]) -> Element | None:
        pair = changes.get((name, key))
        return pair[side] if pair is not None else rs.elements.get(name, {}).get(key)

    out.elements[shape.dispatch] = {}
    for front in fronts:
        el = get(shape.dispatch, front)
        if el is not None:
            out.elements[shape.dispatch][front] = el
    for name in (shape.backends, shape.local):  # the Local policy's endpoints too
        held = rs.elements.get(name)
        if isinstance(held, PackedElements):
            out.elements[name] = _gather_packed(held, changes, side, name, fronts)
            continue
        out.elements[name] = {}
        for front in fronts:
            index = 0  # the planner numbers a frontend's endpoints 0..N-1
            while (el := get(name, (*front, index))) is not None:
                out.elements[name][el.key] = el
                index += 1


def _gather_packed(
    held: PackedElements,
    changes: Mapping[tuple[str, tuple[Value, ...]], tuple[Element | None, Element | None]],
    side: int,
    name: str,
    fronts: list[tuple[Value, ...]],
) -> PackedElements:
    """:func:`_gather` of a packed backends map, as bytes: a frontend of 1,000 endpoints is
    1,000 dictionary lookups, not 1,000 keys packed and elements decoded."""
    changed = {
        held.key_of(key): pair for (map_name, key), pair in changes.items() if map_name == name
    }
    raw, gathered = held.raw, dict[bytes, bytes]()
    for front in fronts:
        first = held.key_of((*front, 0))
        if first is None:  # a frontend of the other family
            continue
        head = first[:-4]  # the index is the key's last 4 bytes
        index = 0
        while True:
            key = head + index_bytes(index)
            pair = changed.get(key)
            if pair is None:
                data = raw.get(key)
            else:
                el = pair[side]
                data = None if el is None else held.pack_data(el)
            if data is None:
                break
            gathered[key] = data
            index += 1
    return PackedElements(held.set, gathered)


# ---------------------------------------------------------------------------------------------
# Chains below a dispatch


def _referenced(rs: Ruleset, chain: str) -> list[str]:
    """The chains ``chain``'s rules jump or go to (the IR's one answer, ``names``)."""
    return [c for rule in rs.rules.get(chain, []) for e in rule.exprs for c in names(e).chains]


def closure(rs: Ruleset, start: Iterable[str]) -> list[str]:
    """The chains named in ``start`` and everything they jump/goto into, breadth first."""
    order: list[str] = []
    queue = list(dict.fromkeys(start))
    while queue:
        name = queue.pop(0)
        if name in order or name not in rs.chains:
            continue
        order.append(name)
        queue.extend(_referenced(rs, name))
    return order


def dnat_targets(rs: Ruleset, chain: str) -> tuple[Target, ...]:
    """The targets below ``chain`` that are not in the global backends maps, in the order its
    chains choose them: fixed ``dnat to addr:port`` (ClientIP affinity's endpoint chains), or
    the values of a service port's own map (round-robin and consistent hashing), sorted."""
    out: list[Target] = []
    for name in closure(rs, [chain]):
        for rule in rs.rules.get(name, []):
            for e in rule.exprs:
                if isinstance(e, Dnat) and e.port is not None:
                    out.append((e.addr, e.port))
                elif isinstance(e, DnatMap) and e.map not in GLOBAL_BACKENDS:
                    values = (target(el.value) for el in rs.elements.get(e.map, {}).values())
                    out += sorted({t for t in values if t is not None})
    return tuple(dict.fromkeys(out))
