"""Packet tracer: where does a new connection go through a planned ruleset?

Sits beside the planner as its check (DESIGN §3): it walks the same IR the encoder sends to the
kernel, in the kernel's hook order, and answers "is a packet from A to B:port accepted, DNAT'd to
which endpoints (every ``numgen`` choice), masqueraded, rejected or dropped?". Dynamic sets
(affinity) are read as planned, i.e. empty. Pure: no I/O, no clock, no logging, no regexes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network
from typing import Literal, assert_never

from nlproxy.cluster.model import Protocol
from nlproxy.errors import NlproxyError
from nlproxy.nft.ir import (
    Chain,
    Cmp,
    Counter,
    CtState,
    CtStatus,
    Dnat,
    DnatMap,
    Element,
    Expr,
    FibType,
    Field,
    Hook,
    InlineVMap,
    IPAddress,
    Jhash,
    L4Proto,
    Lookup,
    MarkSet,
    Masquerade,
    Numgen,
    Op,
    Policy,
    Reject,
    Rule,
    Ruleset,
    Selector,
    SetFlag,
    SetUpdate,
    Value,
    Verdict,
    VerdictKind,
    VMap,
    iifname_matches,
)
from nlproxy.nft.jhash import hash_of

TraceVerdict = Literal["ACCEPT", "DROP", "REJECT"]
_Control = Literal["next", "return", "accept", "drop", "reject"]
_MAX_DEPTH = 32
_L4 = {Protocol.TCP: L4Proto.TCP, Protocol.UDP: L4Proto.UDP, Protocol.SCTP: L4Proto.SCTP}


class TraceError(NlproxyError):
    """The ruleset cannot be interpreted (a missing chain or set, a jump loop)."""


@dataclass(frozen=True, slots=True)
class TraceResult:
    """Outcome of one new connection.

    Attributes:
        verdict: ``ACCEPT`` (delivered or forwarded), ``DROP`` or ``REJECT``; when random
            choices lead to different outcomes, DROP if any branch drops, else REJECT if any
            rejects.
        endpoints: ``ip:port`` (``[ip6]:port``) the accepted branches are DNAT'd to, over all
            random choices.
        masquerade: the source of an accepted branch is rewritten on the way out.
    """

    verdict: TraceVerdict
    endpoints: frozenset[str]
    masquerade: bool


@dataclass(frozen=True, slots=True)
class _Packet:
    src: IPAddress
    dst: IPAddress
    proto: int
    sport: int
    dport: int
    mark: int = 0
    endpoint: str | None = None
    masquerade: bool = False
    original: tuple[IPAddress, int] | None = None
    """Destination and port before DNAT (``ct original …``); None while not DNAT'd."""
    iifname: str = ""
    """The interface it came in on; empty for the node's own packets."""


def trace(
    ruleset: Ruleset,
    src: IPAddress,
    proto: Protocol | L4Proto,
    dst: IPAddress,
    dport: int,
    *,
    local_addrs: Collection[IPAddress],
    sport: int = 40000,
    iifname: str = "",
) -> TraceResult:
    """Trace a new connection ``src -> dst:dport`` through ``ruleset``.

    Args:
        local_addrs: the node's addresses (``fib … type local``; loopback is always local). A
            packet from one of them is locally generated and takes the output path.
        iifname: the interface a packet from elsewhere comes in on (``iifname`` matches: a
            pod's veth or bridge with the interface detect-local modes); empty, none.

    Raises:
        TraceError: naming the chain or set the ruleset references but lacks.
    """
    return Tracer(ruleset, local_addrs).trace(src, proto, dst, dport, sport=sport, iifname=iifname)


def _summarize(finals: list[tuple[_Packet, _Control]]) -> TraceResult:
    accepted = [p for p, o in finals if o == "accept"]
    outcomes = {o for _, o in finals}
    verdict: TraceVerdict = (
        "DROP" if "drop" in outcomes else "REJECT" if "reject" in outcomes else "ACCEPT"
    )
    return TraceResult(
        verdict=verdict,
        endpoints=frozenset(p.endpoint for p in accepted if p.endpoint is not None),
        masquerade=any(p.masquerade for p in accepted),
    )


class Tracer:
    """:func:`trace` for many connections through one ruleset: what every trace reads of the
    ruleset (the base chains of each hook in priority order, the interval sets, each element
    looked up) is found once, here, instead of per trace. The ruleset must not change while the
    tracer is used."""

    def __init__(self, rs: Ruleset, local_addrs: Collection[IPAddress]) -> None:
        self.rs = rs
        self.local = frozenset(local_addrs)
        hooks: dict[Hook, list[Chain]] = {}
        for c in rs.chains.values():
            if c.hook is not None:
                hooks.setdefault(c.hook, []).append(c)
        self._hooks = {h: sorted(cs, key=_priority) for h, cs in hooks.items()}
        self._interval = frozenset(
            name for name, st in rs.sets.items() if st.flags & SetFlag.INTERVAL
        )
        self._found: dict[tuple[str, tuple[Value, ...]], Element | None] = {}
        """Lookups made, by (set, key): the probes of one frontend look up the same keys, and
        nothing a trace does changes an element (dynamic sets are read as planned)."""

    def trace(
        self,
        src: IPAddress,
        proto: Protocol | L4Proto,
        dst: IPAddress,
        dport: int,
        *,
        sport: int = 40000,
        iifname: str = "",
    ) -> TraceResult:
        """:func:`trace` through this tracer's ruleset."""
        l4 = _L4[proto] if isinstance(proto, Protocol) else proto
        first = Hook.OUTPUT if self.is_local(src) else Hook.PREROUTING
        if first is Hook.OUTPUT:
            iifname = ""  # locally generated: no input interface
        pkt = _Packet(src=src, dst=dst, proto=int(l4), sport=sport, dport=dport, iifname=iifname)
        finals: list[tuple[_Packet, _Control]] = []
        for p, outcome in self.hook(first, pkt):
            if outcome != "accept":
                finals.append((p, outcome))
                continue
            deliver = self.is_local(p.dst)
            if first is Hook.OUTPUT:
                path = [Hook.POSTROUTING, Hook.INPUT] if deliver else [Hook.POSTROUTING]
            else:
                path = [Hook.INPUT] if deliver else [Hook.FORWARD, Hook.POSTROUTING]
            finals.extend(self.path(path, p))
        return _summarize(finals)

    def is_local(self, ip: IPAddress) -> bool:
        return ip in self.local or ip.is_loopback

    def path(self, hooks: list[Hook], pkt: _Packet) -> list[tuple[_Packet, _Control]]:
        if not hooks:
            return [(pkt, "accept")]
        out: list[tuple[_Packet, _Control]] = []
        for p, outcome in self.hook(hooks[0], pkt):
            out.extend(self.path(hooks[1:], p) if outcome == "accept" else [(p, outcome)])
        return out

    def hook(self, hook: Hook, pkt: _Packet) -> list[tuple[_Packet, _Control]]:
        """Run the base chains of one hook in priority order; every branch ends accepted or not."""
        chains = self._hooks.get(hook, [])
        branches: list[tuple[_Packet, _Control]] = [(pkt, "accept")]
        for chain in chains:
            step: list[tuple[_Packet, _Control]] = []
            for p, outcome in branches:
                if outcome != "accept":
                    step.append((p, outcome))
                    continue
                step.extend((q, _base_outcome(chain, o)) for q, o in self.chain(chain.name, p, 0))
            branches = step
        return branches

    def chain(self, name: str, pkt: _Packet, depth: int) -> list[tuple[_Packet, _Control]]:
        if name not in self.rs.rules:
            raise TraceError(f"chain {name}", "referenced but not in the ruleset")
        if depth > _MAX_DEPTH:
            raise TraceError(f"chain {name}", f"jumps nest deeper than {_MAX_DEPTH}")
        return self._rules(self.rs.rules[name], 0, pkt, depth)

    def _rules(
        self, rules: list[Rule], start: int, pkt: _Packet, depth: int
    ) -> list[tuple[_Packet, _Control]]:
        for i in range(start, len(rules)):
            branches = self._exprs(rules[i].exprs, 0, pkt, depth)
            if len(branches) == 1 and branches[0][1] == "next":
                pkt = branches[0][0]
                continue
            out: list[tuple[_Packet, _Control]] = []
            for p, control in branches:
                out.extend(
                    self._rules(rules, i + 1, p, depth) if control == "next" else [(p, control)]
                )
            return out
        return [(pkt, "return")]

    def _exprs(
        self, exprs: tuple[Expr, ...], start: int, pkt: _Packet, depth: int
    ) -> list[tuple[_Packet, _Control]]:
        """Evaluate a rule from ``exprs[start]``; "next" means go on with the next rule."""
        for j in range(start, len(exprs)):
            e = exprs[j]
            match e:
                case Cmp():
                    if not self._cmp(e, pkt):
                        return [(pkt, "next")]
                case Lookup():
                    hit = any(self._find(e.set, k) is not None for k in self._keys(e.key, pkt))
                    if hit == e.negate:
                        return [(pkt, "next")]
                case VMap() | InlineVMap():
                    return self._vmap(e, pkt, depth)
                case Counter() | SetUpdate():
                    pass
                case MarkSet():
                    pkt = dataclasses.replace(pkt, mark=_mark(pkt.mark, e))
                case Dnat():
                    return [(_dnat(pkt, e.addr, e.port), "accept")]
                case DnatMap():
                    return self._dnat_map(e, pkt)
                case Masquerade():
                    return [(dataclasses.replace(pkt, masquerade=True), "accept")]
                case Reject():
                    return [(pkt, "reject")]
                case Verdict() if e.kind is VerdictKind.CONTINUE:
                    pass  # the kernel goes on with the rule's next expression
                case Verdict():
                    return self._verdict(e, pkt, depth)
                case _:
                    assert_never(e)
        return [(pkt, "next")]

    def _vmap(
        self, e: VMap | InlineVMap, pkt: _Packet, depth: int
    ) -> list[tuple[_Packet, _Control]]:
        out: list[tuple[_Packet, _Control]] = []
        for key in self._keys(e.key, pkt):
            if isinstance(e, VMap):
                el = self._find(e.map, key)
                verdict = el.value if el is not None else None
            else:
                verdict = next((v for k, v in e.entries if k == key), None)
            if verdict is None:
                out.append((pkt, "next"))
            elif isinstance(verdict, Verdict):
                out.extend(self._verdict(verdict, pkt, depth))
            else:
                raise TraceError(f"map {getattr(e, 'map', 'inline')}", "is not a verdict map")
        return out

    def _dnat_map(self, e: DnatMap, pkt: _Packet) -> list[tuple[_Packet, _Control]]:
        out: list[tuple[_Packet, _Control]] = []
        for key in self._keys(e.key, pkt):
            el = self._find(e.map, key)
            port_el = self._find(e.port_map, key) if e.port_map is not None else el
            if el is None or port_el is None:
                out.append((pkt, "next"))  # a lookup miss ends the rule, as in the kernel
                continue
            value = el.value
            if e.port_map is not None:  # (the address and the port from a map each)
                value = (*_parts(el.value), *_parts(port_el.value))
            if not isinstance(value, tuple) or len(value) != 2:
                raise TraceError(f"map {e.map}", "data is not address . port")
            addr, port = value
            if isinstance(addr, IPv4Network | IPv6Network | int) or not isinstance(port, int):
                raise TraceError(f"map {e.map}", f"bad DNAT data {value!r}")
            out.append((_dnat(pkt, addr, port), "accept"))
        return out

    def _verdict(self, v: Verdict, pkt: _Packet, depth: int) -> list[tuple[_Packet, _Control]]:
        match v.kind:
            case VerdictKind.ACCEPT:
                return [(pkt, "accept")]
            case VerdictKind.DROP:
                return [(pkt, "drop")]
            case VerdictKind.RETURN:
                return [(pkt, "return")]
            case VerdictKind.CONTINUE:
                return [(pkt, "next")]  # from a map: the rule ends without a verdict
            case VerdictKind.JUMP | VerdictKind.GOTO:
                assert v.chain is not None, "jump/goto carry a chain"
                out: list[tuple[_Packet, _Control]] = []
                for p, o in self.chain(v.chain, pkt, depth + 1):
                    if o == "return":
                        # Back from a jump: go on with the next rule; from a goto: the
                        # calling chain is done.
                        o = "next" if v.kind is VerdictKind.JUMP else "return"
                    out.append((p, o))
                return out
            case _:
                assert_never(v.kind)

    def _keys(self, key: tuple[Selector, ...], pkt: _Packet) -> list[tuple[Value, ...]]:
        """The key's values; a ``numgen`` part yields one key per possible number."""
        keys: list[tuple[Value, ...]] = [()]
        for sel in key:
            if isinstance(sel, Numgen):
                keys = [(*k, i) for k in keys for i in range(sel.modulus)]
            elif isinstance(sel, Jhash):  # as the kernel computes it: one slot per packet
                number = hash_of(sel, [self._key_field(f, pkt) for f in sel.key])
                keys = [(*k, number) for k in keys]
            else:
                value = self._key_field(sel, pkt)
                keys = [(*k, value) for k in keys]
        return keys

    def _key_field(self, f: Field, pkt: _Packet) -> int | IPAddress:
        value = self._field(f, pkt)
        if isinstance(value, str):  # the validator keeps names out of keys
            raise TraceError(f"key {f.text}", "an interface name is not part of a key")
        return value

    def _find(self, set_name: str, key: tuple[Value, ...]) -> Element | None:
        seen = (set_name, key)
        if seen not in self._found:
            self._found[seen] = self._lookup(set_name, key)
        return self._found[seen]

    def _lookup(self, set_name: str, key: tuple[Value, ...]) -> Element | None:
        if set_name not in self.rs.elements:
            raise TraceError(f"set {set_name}", "referenced but not in the ruleset")
        elements = self.rs.elements[set_name]
        exact = elements.get(key)
        if exact is not None or set_name not in self._interval:
            return exact
        return next((el for el in elements.values() if _key_matches(el.key, key)), None)

    def _field(self, f: Field, pkt: _Packet) -> int | IPAddress | str:
        match f:
            case Field.IP_SADDR | Field.IP6_SADDR:
                return pkt.src
            case Field.IP_DADDR | Field.IP6_DADDR:
                return pkt.dst
            case Field.TH_SPORT:
                return pkt.sport
            case Field.TH_DPORT:
                return pkt.dport
            case Field.META_L4PROTO:
                return pkt.proto
            case Field.META_MARK:
                return pkt.mark
            case Field.META_NFPROTO:
                return self.rs.table.family.nfproto
            case Field.CT_STATE:
                return int(CtState.NEW)
            case Field.CT_STATUS:
                return int(CtStatus.DNAT) if pkt.endpoint is not None else 0
            case Field.FIB_DADDR_TYPE:
                return FibType.LOCAL if self.is_local(pkt.dst) else FibType.UNICAST
            case Field.FIB_SADDR_TYPE:
                return FibType.LOCAL if self.is_local(pkt.src) else FibType.UNICAST
            case Field.META_IIF:
                return 0  # traced packets come in from outside, never looped back on lo
            case Field.META_IIFNAME:
                return pkt.iifname
            case Field.CT_ORIGINAL_IP_DADDR | Field.CT_ORIGINAL_IP6_DADDR:
                return pkt.original[0] if pkt.original else pkt.dst
            case Field.CT_ORIGINAL_PROTO_DST:
                return pkt.original[1] if pkt.original else pkt.dport
            case _:
                assert_never(f)

    def _cmp(self, e: Cmp, pkt: _Packet) -> bool:
        left = self._field(e.left, pkt)
        if e.mask is not None and isinstance(left, int):
            left &= e.mask
        right = e.right
        if isinstance(right, str):
            hit = isinstance(left, str) and bool(left) and iifname_matches(right, left)
            return hit if e.op is Op.EQ else not hit if e.op is Op.NE else _bad_op(e)
        if isinstance(right, IPv4Network | IPv6Network):
            inside = (
                not isinstance(left, int | str) and left.version == right.version and left in right
            )
            return inside if e.op is Op.EQ else not inside if e.op is Op.NE else _bad_op(e)
        if e.left in (Field.CT_STATE, Field.CT_STATUS):
            assert isinstance(left, int), "bitmask fields are ints"
            assert isinstance(right, int), "bitmask fields are ints"
            return bool(left & right) if e.op is Op.EQ else not left & right
        return _compare(left, e.op, right)


def _compare(left: object, op: Op, right: object) -> bool:
    if op is Op.EQ:
        return left == right
    if op is Op.NE:
        return left != right
    if not isinstance(left, int) or not isinstance(right, int):
        return False  # ordering is only meaningful for numbers (ports, marks)
    match op:
        case Op.LT:
            return left < right
        case Op.GT:
            return left > right
        case Op.LE:
            return left <= right
        case Op.GE:
            return left >= right
        case _:
            assert_never(op)


def _bad_op(e: Cmp) -> bool:
    raise TraceError(f"expression {e!r}", "a network or a name only supports == and !=")


def _key_matches(element: tuple[Value, ...], key: tuple[Value, ...]) -> bool:
    if len(element) != len(key):
        return False
    for part, value in zip(element, key, strict=True):
        if isinstance(part, IPv4Network | IPv6Network):
            if isinstance(value, int | IPv4Network | IPv6Network) or value not in part:
                return False
        elif part != value:
            return False
    return True


def _mark(mark: int, e: MarkSet) -> int:
    if e.op == "or":
        return mark | e.value
    if e.op == "xor":
        return mark ^ e.value
    return e.value


def _dnat(pkt: _Packet, addr: IPAddress, port: int | None) -> _Packet:
    port = pkt.dport if port is None else port
    text = f"[{addr}]:{port}" if addr.version == 6 else f"{addr}:{port}"
    original = pkt.original or (pkt.dst, pkt.dport)
    return dataclasses.replace(pkt, dst=addr, dport=port, endpoint=text, original=original)


def _priority(chain: Chain) -> int:
    return chain.priority


def _base_outcome(chain: Chain, outcome: _Control) -> _Control:
    """What falling off (or returning from) a base chain means: its policy."""
    if outcome in ("return", "next"):
        return "drop" if chain.policy is Policy.DROP else "accept"
    return outcome


def _parts(value: tuple[Value, ...] | Verdict | None) -> tuple[Value, ...]:
    return value if isinstance(value, tuple) else ()
