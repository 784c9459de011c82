"""Render IR objects as nft prints them (``nft list table`` of nftables 1.0.6), and as JSON.

One of the IR's walkers: ``nlproxy rules`` prints a read-back :class:`Ruleset` with it, and tests
compare its output with what ``nft list`` prints for the same kernel objects. Pure and
deterministic: no I/O; elements are printed sorted by key. It never parses text.

nft hides a ``meta l4proto tcp`` match when a later expression depends on it (``th dport``
then prints as ``tcp dport``; ``reject with tcp reset`` needs no match); this renderer does the
same so that its text is nft's.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Mapping
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import Any, TypeAlias, assert_never

from nlproxy.netlink.protocols import NFT_NAMES, PORT_HEADERS
from nlproxy.nft.decode import UndecodedRule
from nlproxy.nft.ir import (
    PRIORITY_DSTNAT,
    PRIORITY_FILTER,
    PRIORITY_MANGLE,
    PRIORITY_RAW,
    PRIORITY_SECURITY,
    PRIORITY_SRCNAT,
    Chain,
    Cmp,
    Counter,
    DataType,
    Dnat,
    DnatMap,
    Element,
    Expr,
    Family,
    Field,
    Hook,
    InlineVMap,
    Jhash,
    Lookup,
    Map,
    MarkSet,
    Masquerade,
    Numgen,
    Op,
    Reject,
    RejectKind,
    Rule,
    Ruleset,
    Selector,
    Set,
    SetFlag,
    SetLike,
    SetUpdate,
    Table,
    Value,
    Verdict,
    VMap,
)
from nlproxy.nft.uapi import LOOPBACK_IFINDEX
from nlproxy.nft.udata import needs_typeof, typeof_text
from nlproxy.nft.values import key_order

_CT_STATE = {1: "invalid", 2: "established", 4: "related", 8: "new", 64: "untracked"}
_CT_STATUS = {1: "expected", 2: "seen-reply", 4: "assured", 8: "confirmed", 16: "snat", 32: "dnat"}
_FIB_TYPES = {
    0: "unspec",
    1: "unicast",
    2: "local",
    3: "broadcast",
    4: "anycast",
    5: "multicast",
    6: "blackhole",
    7: "unreachable",
    8: "prohibit",
}
_NFPROTO = {2: "ipv4", 10: "ipv6"}
_ICMP_CODES = {
    0: "net-unreachable",
    1: "host-unreachable",
    2: "prot-unreachable",
    3: "port-unreachable",
    9: "net-prohibited",
    10: "host-prohibited",
    13: "admin-prohibited",
}
_ICMPV6_CODES = {
    0: "no-route",
    1: "admin-prohibited",
    3: "addr-unreachable",
    4: "port-unreachable",
    5: "policy-fail",
    6: "reject-route",
}
_ICMPX_CODES = {0: "no-route", 1: "port-unreachable", 2: "host-unreachable", 3: "admin-prohibited"}
_TYPE_NAMES = {
    DataType.VERDICT: "verdict",
    DataType.IPV4_ADDR: "ipv4_addr",
    DataType.IPV6_ADDR: "ipv6_addr",
    DataType.INET_PROTO: "inet_proto",
    DataType.INET_SERVICE: "inet_service",
    DataType.MARK: "mark",
}
# nft's standard priority names, with the hooks each is printed for (all when None).
_PRIORITIES: dict[int, tuple[str, tuple[Hook, ...] | None]] = {
    PRIORITY_RAW: ("raw", None),
    PRIORITY_MANGLE: ("mangle", None),
    PRIORITY_DSTNAT: ("dstnat", (Hook.PREROUTING,)),
    PRIORITY_FILTER: ("filter", None),
    PRIORITY_SECURITY: ("security", None),
    PRIORITY_SRCNAT: ("srcnat", (Hook.POSTROUTING,)),
}
# How many elements nft lists per line, by key type (single-part keys; others one per line).
_PER_LINE = {
    DataType.IPV4_ADDR: 2,
    DataType.INET_SERVICE: 5,
    DataType.INET_PROTO: 5,
    DataType.MARK: 5,
}
# Set flags as nft lists them, in its order.
_SET_FLAGS = (
    (SetFlag.CONSTANT, "constant"),
    (SetFlag.EVAL, "dynamic"),
    (SetFlag.INTERVAL, "interval"),
    (SetFlag.TIMEOUT, "timeout"),
)


# ---------------------------------------------------------------------------------------------
# Values


def format_time(seconds: int) -> str:
    """nft's duration: ``1d2h3m4s``; ``0s`` for zero."""
    out = ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            out += f"{seconds // size}{unit}"
            seconds %= size
    return out or "0s"


def _bits(value: int, names: dict[int, str]) -> str:
    parts = [name for bit, name in names.items() if value & bit]
    rest = value & ~sum(names)
    if rest:
        parts.append(f"0x{rest:08x}")
    return ",".join(parts) or "0x0"


def format_value(field: Field | None, dt: DataType | None, value: Value | str) -> str:
    """One value as nft prints it for a field (or a set's datatype)."""
    if isinstance(value, str):
        return f'"{value}"'  # an interface name or prefix: nft prints it quoted
    if isinstance(value, IPv4Network | IPv6Network):
        # nft lists a one-address interval as the address
        full = value.prefixlen == value.max_prefixlen
        return str(value.network_address) if full else str(value)
    if not isinstance(value, int):
        return str(value)
    if field is not None:
        if field is Field.CT_STATE:
            return _bits(value, _CT_STATE)
        if field is Field.CT_STATUS:
            return _bits(value, _CT_STATUS)
        if field in (Field.FIB_DADDR_TYPE, Field.FIB_SADDR_TYPE):
            return _FIB_TYPES.get(value, str(value))
        if field is Field.META_NFPROTO:
            return _NFPROTO.get(value, str(value))
        if field is Field.META_IIF:
            # nft prints an interface's name; only lo's index is the same everywhere
            return '"lo"' if value == LOOPBACK_IFINDEX else str(value)
        dt = field.datatype
    if dt is DataType.INET_PROTO:
        return NFT_NAMES.get(value, str(value))
    if dt is DataType.MARK:
        return f"0x{value:08x}"
    return str(value)


def format_key(key: tuple[Value, ...], types: tuple[DataType | None, ...]) -> str:
    return " . ".join(format_value(None, dt, v) for dt, v in zip(types, key, strict=False))


def format_verdict(v: Verdict) -> str:
    return f"{v.kind} {v.chain}" if v.chain else str(v.kind)


# ---------------------------------------------------------------------------------------------
# Rules


class _Context:
    """nft's protocol context: a ``meta l4proto X`` that later expressions depend on."""

    def __init__(self, exprs: tuple[Expr, ...]) -> None:
        self.hidden: set[int] = set()
        self.l4: str | None = None
        for i, e in enumerate(exprs):
            if not (
                isinstance(e, Cmp)
                and e.left is Field.META_L4PROTO
                and e.op is Op.EQ
                and e.mask is None
                and isinstance(e.right, int)
            ):
                continue
            later = exprs[i + 1 :]
            if e.right in PORT_HEADERS and any(_uses_th(x) for x in later):
                self.hidden.add(i)
                self.l4 = PORT_HEADERS[e.right]
            elif e.right == 6 and later[:1] == (Reject(RejectKind.TCP_RESET),):
                self.hidden.add(i)

    def selector(self, sel: Selector) -> str:
        if isinstance(sel, Numgen):
            return f"numgen {sel.kind} mod {sel.modulus}"
        if isinstance(sel, Jhash):
            key = " . ".join(self.selector(f) for f in sel.key)
            return f"jhash {key} mod {sel.modulus} seed 0x{sel.seed:x}"
        if self.l4 and sel in (Field.TH_SPORT, Field.TH_DPORT):
            return self.l4 + sel.text[2:]
        return sel.text

    def key(self, key: tuple[Selector, ...]) -> str:
        return " . ".join(self.selector(s) for s in key)


def _uses_th(e: Expr) -> bool:
    th = (Field.TH_SPORT, Field.TH_DPORT)
    if isinstance(e, Cmp):
        return e.left in th
    if isinstance(e, Lookup | VMap | InlineVMap | DnatMap | SetUpdate):
        return any(s in th or (isinstance(s, Jhash) and any(f in th for f in s.key)) for s in e.key)
    return False


def _datatypes(key: tuple[Selector, ...]) -> tuple[DataType | None, ...]:
    return tuple(None if isinstance(s, Numgen | Jhash) else s.datatype for s in key)


def _cmp(ctx: _Context, e: Cmp) -> str:
    left = ctx.selector(e.left)
    right = format_value(e.left, None, e.right)
    if e.mask is not None:
        mask = format_value(e.left, None, e.mask)
        return f"{left} & {mask} {e.op} {right}"
    if e.left in (Field.CT_STATE, Field.CT_STATUS) and e.op is Op.NE:
        # "none of these bits": nft lowers and prints ``ct state ! invalid`` this way, while its
        # ``ct state != invalid`` compares the whole value (same meaning for one ct state bit).
        return f"{left} ! {right}"
    if e.op is Op.EQ:
        return f"{left} {right}"
    return f"{left} {e.op} {right}"


def _reject(e: Reject, family: Family) -> str:
    if e.kind is RejectKind.TCP_RESET:
        return "reject with tcp reset"
    if e.kind is RejectKind.ICMPX:
        if e.code is None and family is Family.INET:
            return "reject"
        code = 1 if e.code is None else e.code
        return f"reject with icmpx {_ICMPX_CODES.get(code, str(code))}"
    if e.code is None:
        return "reject"
    if family is Family.IP6:
        return f"reject with icmpv6 {_ICMPV6_CODES.get(e.code, str(e.code))}"
    return f"reject with icmp {_ICMP_CODES.get(e.code, str(e.code))}"


def _dnat(e: Dnat, family: Family) -> str:
    prefix = "dnat to"
    if family is Family.INET:
        prefix = f"dnat {'ip6' if isinstance(e.addr, IPv6Address) else 'ip'} to"
    if e.port is None:
        return f"{prefix} {e.addr}"
    if isinstance(e.addr, IPv6Address):
        return f"{prefix} [{e.addr}]:{e.port}"
    return f"{prefix} {e.addr}:{e.port}"


def _dnat_map(ctx: _Context, e: DnatMap, family: Family) -> str:
    fam = "ip6" if family is Family.IP6 or e.key[0] in (Field.IP6_DADDR, Field.IP6_SADDR) else "ip"
    if e.port_map is not None:  # (as nft lists it)
        return f"dnat {fam} to {ctx.key(e.key)} map @{e.map}:{ctx.key(e.key)} map @{e.port_map}"
    return f"dnat {fam} to {ctx.key(e.key)} map @{e.map}"


def render_expr(ctx: _Context, e: Expr, family: Family) -> str:
    """One expression's text within a rule (``ctx``: the rule's protocol context)."""
    match e:
        case Cmp():
            return _cmp(ctx, e)
        case Lookup():
            return f"{ctx.key(e.key)} {'!= ' if e.negate else ''}@{e.set}"
        case VMap():
            return f"{ctx.key(e.key)} vmap @{e.map}"
        case InlineVMap():
            types = _datatypes(e.key)
            items = ", ".join(f"{format_key(k, types)} : {format_verdict(v)}" for k, v in e.entries)
            return f"{ctx.key(e.key)} vmap {{ {items} }}"
        case Counter():
            return "counter"
        case MarkSet():
            if e.op == "set":
                return f"meta mark set 0x{e.value:08x}"
            sym = {"or": "|", "xor": "^"}[e.op]
            return f"meta mark set meta mark {sym} 0x{e.value:08x}"
        case Dnat():
            return _dnat(e, family)
        case DnatMap():
            return _dnat_map(ctx, e, family)
        case Masquerade():
            return "masquerade fully-random" if e.fully_random else "masquerade"
        case Reject():
            return _reject(e, family)
        case SetUpdate():
            timeout = f" timeout {format_time(e.timeout)}" if e.timeout else ""
            data = f" : {ctx.key(e.data)}" if e.data else ""
            return f"update @{e.set} {{ {ctx.key(e.key)}{timeout}{data} }}"
        case Verdict():
            return format_verdict(e)
        case _:
            assert_never(e)


def render_rule(rule: Rule, *, family: Family = Family.IP) -> str:
    """A rule as nft prints it inside its chain (without indentation or handle)."""
    comment = f' comment "{rule.comment}"' if rule.comment else ""
    if isinstance(rule, UndecodedRule):
        return f"# undecodable ({rule.reason}): {' '.join(rule.raw)}{comment}"
    ctx = _Context(rule.exprs)
    parts = [render_expr(ctx, e, family) for i, e in enumerate(rule.exprs) if i not in ctx.hidden]
    return " ".join(parts) + comment


# ---------------------------------------------------------------------------------------------
# Sets, elements, chains, tables


def set_type(s: SetLike) -> str:
    """``type a . b`` or ``type a . b : c`` as nft declares the set; ``typeof …`` when a part
    has no type name (a ``numgen`` index), as nft lists such a set."""
    if needs_typeof(s):
        data = f" : {typeof_text(s.data)}" if isinstance(s, Map) else ""
        return f"typeof {typeof_text(s.key)}{data}"
    key = " . ".join(_TYPE_NAMES[t] for t in s.key)
    if isinstance(s, Map):
        return f"type {key} : {' . '.join(_TYPE_NAMES[t] for t in s.data)}"
    return f"type {key}"


Counts: TypeAlias = Mapping[tuple[Value, ...], tuple[int, int]]
"""Element key -> (packets, bytes) of one set declared with ``counter``."""


def render_element(el: Element, s: SetLike, counts: Counts | None = None) -> str:
    """One element as nft lists it: ``key [counter …] [timeout T] [comment "c"] [: value]``.

    In a set declared with ``counter`` the element's counter follows the key: with its values
    when ``counts`` has them (``nft list``), a bare ``counter`` otherwise (the IR has none).
    """
    return _Elements(s, counts).text(el)


class _Elements:
    """:func:`render_element` for the elements of one set, with the formatting of each key and
    data part chosen once per set instead of once per value (``nlproxy rules`` writes 200k+
    elements). ``seen``: the text of the address objects met so far, shared across sets (the
    read-back shares one object per address), by identity."""

    def __init__(
        self,
        s: SetLike,
        counts: Counts | None,
        seen: dict[int, tuple[Value, str]] | None = None,
    ) -> None:
        self.s = s
        self.counts = counts
        self.counter = isinstance(s, Set) and s.counter
        self.seen: dict[int, tuple[Value, str]] = {} if seen is None else seen
        self.key = self._key_text(s.key)
        self.data = self._key_text(s.data if isinstance(s, Map) else ())

    def text(self, el: Element) -> str:
        text = self.key(el.key)
        if self.counter:
            values = None if self.counts is None else self.counts.get(el.key)
            text += (
                " counter" if values is None else f" counter packets {values[0]} bytes {values[1]}"
            )
        if el.timeout is not None:
            text += f" timeout {format_time(el.timeout)}"
        if el.comment:
            text += f' comment "{el.comment}"'
        if isinstance(el.value, Verdict):
            text += f" : {format_verdict(el.value)}"
        elif el.value is not None:
            text += f" : {self.data(el.value)}"
        return text

    def _key_text(self, types: tuple[DataType | None, ...]) -> Callable[[tuple[Value, ...]], str]:
        """:func:`format_key` for keys of ``types``."""
        parts = [self._part_text(dt) for dt in types]
        if len(parts) == 1:
            (only,) = parts
            return lambda key: only(key[0]) if key else ""

        def text(key: tuple[Value, ...]) -> str:
            return " . ".join(map(operator.call, parts, key))  # as zip: the shorter decides

        return text

    def _part_text(self, dt: DataType | None) -> Callable[[Value], str]:
        """``format_value(None, dt, v)``: numbers by their datatype, anything else (addresses,
        networks) once per object."""
        if dt not in (DataType.INET_PROTO, DataType.MARK, DataType.IPV4_ADDR, DataType.IPV6_ADDR):
            # a number or a name, which format_value writes as str does (a network, which it
            # writes otherwise, only ever sits in an address part)
            return str
        seen = self.seen
        number: Callable[[int], str] = str
        if dt is DataType.INET_PROTO:
            number = lambda v: NFT_NAMES.get(v, str(v))  # noqa: E731
        elif dt is DataType.MARK:
            number = "0x{:08x}".format

        def text(v: Value) -> str:
            if type(v) is int:
                return number(v)
            hit = seen.get(id(v))
            if hit is not None and hit[0] is v:
                return hit[1]
            out = format_value(None, dt, v)
            if not isinstance(v, int):  # a bool's text depends on the datatype
                seen[id(v)] = (v, out)
            return out

        return text


def render_set(
    s: SetLike,
    elements: Mapping[tuple[Value, ...], Element],
    counts: Counts | None = None,
    seen: dict[int, tuple[Value, str]] | None = None,
) -> list[str]:
    """A set or map with its elements; ``counts``: see :func:`render_element`; ``seen``: see
    :class:`_Elements`."""
    kind = "map" if isinstance(s, Map) else "set"
    lines = [f"\t{kind} {s.name} {{", f"\t\t{set_type(s)}"]
    # nft 1.0.6 leaves the flags line out when the only flag is "timeout" and the set has a
    # default timeout (the timeout line implies it).
    flags = [name for flag, name in _SET_FLAGS if s.flags & flag]
    if flags and (flags != ["timeout"] or not s.timeout):
        lines.append(f"\t\tflags {','.join(flags)}")
    if isinstance(s, Set) and s.counter:
        lines.append("\t\tcounter")
    if s.timeout:
        lines.append(f"\t\ttimeout {format_time(s.timeout)}")
    if s.comment:
        lines.append(f'\t\tcomment "{s.comment}"')
    if elements:
        text = _Elements(s, counts, seen).text
        items = list(map(text, _sorted_elements(elements)))
        per_line = _PER_LINE.get(s.key[0], 1) if len(s.key) == 1 else 1
        rows = [", ".join(items[i : i + per_line]) for i in range(0, len(items), per_line)]
        lines.append("\t\telements = { " + ",\n\t\t\t     ".join(rows) + " }")
    lines.append("\t}")
    return lines


def _sorted_elements(elements: Mapping[tuple[Value, ...], Element]) -> list[Element]:
    """The elements in the order of ``sorted(elements, key=key_order)``, faster, with each
    element's index last in its sort key (no ties, no key looked up again).

    Where every key has the same types part by part, all numbers or addresses (the read-back
    of a set that is not an interval set), ``key_order`` compares each part by its number
    alone (its version and prefix length are the same throughout), so the key is the parts'
    numbers; otherwise it is ``key_order`` flattened (its parts all have three numbers).
    """
    values = list(elements.values())
    kinds = set(map(_part_types, elements))
    if len(kinds) == 1 and _NUMBERED.issuperset(next(iter(kinds))):
        keys = [(*map(int, k), i) for i, k in enumerate(elements)]  # type: ignore[arg-type]
    else:
        flat = itertools.chain.from_iterable
        keys = [(*flat(key_order(k)), i) for i, k in enumerate(elements)]
    return [values[k[-1]] for k in sorted(keys)]


def _part_types(key: tuple[Value, ...]) -> tuple[type, ...]:
    return tuple(map(type, key))


_NUMBERED = frozenset({int, IPv4Address, IPv6Address})
"""Value types whose ``key_order`` part is (a constant, ``int(v)``, 0)."""


def priority_text(chain: Chain) -> str:
    """nft's spelling: a standard name valid for the hook, ``name + N`` / ``name - N`` within
    10 of one (``dstnat - 10``), else the number."""
    for value, (name, hooks) in _PRIORITIES.items():
        offset = chain.priority - value
        if abs(offset) > 10 or (hooks is not None and chain.hook not in hooks):
            continue
        if offset == 0:
            return name
        return f"{name} {'+' if offset > 0 else '-'} {abs(offset)}"
    return str(chain.priority)


def render_chain(chain: Chain, rules: list[Rule], family: Family) -> list[str]:
    lines = [f"\tchain {chain.name} {{"]
    if chain.comment:
        lines.append(f'\t\tcomment "{chain.comment}"')
    if chain.hook is not None:
        policy = f" policy {chain.policy};" if chain.policy else ""
        lines.append(
            f"\t\ttype {chain.type} hook {chain.hook} priority {priority_text(chain)};{policy}"
        )
    lines.extend(f"\t\t{render_rule(r, family=family)}" for r in rules)
    lines.append("\t}")
    return lines


def _table_header(t: Table) -> list[str]:
    lines = [f"table {t.family} {t.name} {{"]
    flags = [name for on, name in ((t.owner, "owner"), (t.persist, "persist")) if on]
    if flags:
        lines.append(f"\tflags {','.join(flags)}")
    if t.comment:
        lines.append(f'\tcomment "{t.comment}"')
    return lines


def render_ruleset(rs: Ruleset, counters: Mapping[str, Counts] | None = None) -> str:
    """The whole table as ``nft list table`` prints it: sets and maps, then chains.

    Args:
        counters: per set declared with ``counter``, its elements' values (``counters.py``
            reads them); without them such elements print a bare ``counter``.
    """
    counters = counters or {}
    seen: dict[int, tuple[Value, str]] = {}
    blocks = [
        render_set(s, rs.elements.get(s.name, {}), counters.get(s.name), seen)
        for s in rs.sets.values()
    ]
    family = rs.table.family
    blocks += [render_chain(c, rs.rules.get(c.name, []), family) for c in rs.chains.values()]
    body = "\n\n".join("\n".join(b) for b in blocks)
    if body and (rs.table.owner or rs.table.persist):
        body = "\n" + body  # nft 1.0.6 separates a "flags" line from the first object
    lines = _table_header(rs.table)
    return "\n".join(lines) + "\n" + (body + "\n" if body else "") + "}\n"


def ruleset_to_json(rs: Ruleset) -> dict[str, Any]:
    """A JSON-ready summary: the table, its chains with rules as text, its sets with elements."""
    t = rs.table
    return {
        "table": {
            "family": str(t.family),
            "name": t.name,
            "owner": t.owner,
            "persist": t.persist,
            "comment": t.comment,
        },
        "chains": [_chain_json(rs, c) for c in rs.chains.values()],
        "sets": [_set_json(rs, s) for s in rs.sets.values()],
    }


def _chain_json(rs: Ruleset, c: Chain) -> dict[str, Any]:
    family = rs.table.family
    rules = [
        {
            "handle": r.handle,
            "rule": render_rule(r, family=family),
            "comment": r.comment,
            "decoded": not isinstance(r, UndecodedRule),
        }
        for r in rs.rules.get(c.name, [])
    ]
    return {
        "name": c.name,
        "type": None if c.type is None else str(c.type),
        "hook": None if c.hook is None else str(c.hook),
        "priority": c.priority if c.hook is not None else None,
        "policy": None if c.policy is None else str(c.policy),
        "comment": c.comment,
        "rules": rules,
    }


def _set_json(rs: Ruleset, s: SetLike) -> dict[str, Any]:
    els = rs.elements.get(s.name, {})
    return {
        "name": s.name,
        "kind": "map" if isinstance(s, Map) else "set",
        "type": set_type(s).removeprefix("type "),
        "flags": [name for flag, name in _SET_FLAGS if s.flags & flag],
        "timeout": s.timeout,
        "counter": isinstance(s, Set) and s.counter,
        "comment": s.comment,
        "elements": list(map(_Elements(s, None).text, _sorted_elements(els))),
    }
