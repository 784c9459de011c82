"""Check a transaction before anything is sent: names, comments, value types and references.

Sits between the reconciler's operations and the encoder (``NftBackend.apply`` calls
:func:`validate` first). Each problem the kernel would reject, and some it would accept but
misprogram, becomes an :class:`~nlproxy.errors.InvalidNftObject` naming the object, so a bad
service can be left out without a round trip to the kernel. Pure: no I/O, no kernel, no encoding;
it never changes the operations it checks.

The value rules here are also the contract of ``values.py``'s packers: what passes
:func:`check_value` packs without error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

from nlproxy.errors import InvalidNftObject
from nlproxy.netlink.protocols import NFT_NAMES
from nlproxy.nft.bulkcheck import elements_ok, run_end
from nlproxy.nft.ir import (
    IFNAMSIZ,
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
    InlineVMap,
    Jhash,
    Lookup,
    Map,
    MarkSet,
    Masquerade,
    NftObject,
    Numgen,
    Op,
    Operation,
    PackedRun,
    Reject,
    Rule,
    Ruleset,
    Selector,
    Set,
    SetFlag,
    SetLike,
    SetUpdate,
    Table,
    Value,
    Verb,
    Verdict,
    VerdictKind,
    VMap,
)
from nlproxy.nft.packed import packable, unpack_run
from nlproxy.nft.uapi import BITMASK_FIELDS
from nlproxy.nft.values import Packer
from nlproxy.nft.view import step

NFT_NAME_MAXLEN = 256
"""Kernel limit on table, chain and set names, including the terminating NUL."""
NFT_USERDATA_MAXLEN = 256
"""Kernel limit on userdata (NFT_USERDATA_MAXLEN); a comment uses 2 bytes of TLV header + NUL."""
COMMENT_MAXLEN = NFT_USERDATA_MAXLEN - 3
ELEMENT_COMMENT_MAXLEN = 252
"""An element's userdata TLV length is one byte and includes the NUL: at most 253 - 1."""
_RANGES: dict[DataType, int] = {
    DataType.INET_PROTO: 0xFF,
    DataType.INET_SERVICE: 0xFFFF,
    DataType.MARK: 0xFFFFFFFF,
    DataType.INTEGER: 0xFFFFFFFF,
}
_FIELD_MAX = {Field.META_NFPROTO: 0xFF}
MARK_OPS = ("or", "xor", "set")

_VERBS: dict[type, frozenset[Verb]] = {
    Table: frozenset({Verb.ADD, Verb.CREATE, Verb.FLUSH, Verb.DELETE, Verb.DESTROY}),
    Chain: frozenset({Verb.ADD, Verb.CREATE, Verb.FLUSH, Verb.DELETE, Verb.DESTROY}),
    Set: frozenset({Verb.ADD, Verb.CREATE, Verb.FLUSH, Verb.DELETE, Verb.DESTROY}),
    Map: frozenset({Verb.ADD, Verb.CREATE, Verb.FLUSH, Verb.DELETE, Verb.DESTROY}),
    Rule: frozenset({Verb.ADD, Verb.CREATE, Verb.INSERT, Verb.REPLACE, Verb.DELETE, Verb.DESTROY}),
    Element: frozenset({Verb.ADD, Verb.CREATE, Verb.DELETE, Verb.DESTROY}),
    PackedRun: frozenset({Verb.ADD, Verb.CREATE, Verb.DELETE, Verb.DESTROY}),
}


def describe(obj: NftObject, sets: Mapping[str, SetLike] | None = None) -> str:
    """How errors name an object: ``chain services``, ``element 10.0.0.1 . tcp . 80 in map m``.

    Args:
        sets: declarations to name an element's set as ``set`` or ``map`` and print its values.
    """
    match obj:
        case Table():
            return f"table {obj.family} {obj.name}"
        case Chain():
            return f"chain {obj.name}"
        case Set():
            return f"set {obj.name}"
        case Map():
            return f"map {obj.name}"
        case Rule():
            where = f" handle {obj.handle}" if obj.handle is not None else ""
            label = f" ({obj.comment})" if obj.comment else ""
            return f"rule in chain {obj.chain}{where}{label}"
        case Element():
            s = (sets or {}).get(obj.set)
            types: Sequence[DataType | None] = s.key if s else [None] * len(obj.key)
            key = " . ".join(format_value(v, dt) for v, dt in zip(obj.key, types, strict=False))
            kind = "map" if isinstance(s, Map) else "set"
            return f"element {key} in {kind} {obj.set}"
        case PackedRun():
            s = (sets or {}).get(obj.set)
            kind = "map" if isinstance(s, Map) else "set"
            return f"{len(obj.keys)} elements of {kind} {obj.set}"


def format_value(v: Value, dt: DataType | None = None) -> str:
    """A key or data value as nft prints it: protocols by name, marks in hex."""
    if dt is DataType.INET_PROTO and isinstance(v, int):
        return NFT_NAMES.get(v, str(v))
    if dt is DataType.MARK and isinstance(v, int):
        return f"{v:#010x}"
    return str(v)


def check_value(dt: DataType, v: Value, *, interval: bool = False) -> str | None:
    """Why ``v`` is not a valid value of type ``dt`` (None when it is).

    Args:
        interval: networks are allowed (an interval set's key, a prefix match).
    """
    if dt in (DataType.IPV4_ADDR, DataType.IPV6_ADDR):
        v4 = dt is DataType.IPV4_ADDR
        addr_t: type = IPv4Address if v4 else IPv6Address
        net_t: type = IPv4Network if v4 else IPv6Network
        if isinstance(v, addr_t):
            return None
        if isinstance(v, net_t):
            return None if interval else f"{v} is a network, but {dt.name} wants an address"
        return f"{v!r} is not an {'IPv4' if v4 else 'IPv6'} address"
    if dt is DataType.VERDICT:
        return "a verdict cannot be a key or data part"
    top = _RANGES[dt]
    if isinstance(v, bool) or not isinstance(v, int):
        return f"{v!r} is not an integer ({dt.name})"
    if not 0 <= v <= top:
        return f"{v} is not in 0..{top} ({dt.name})"
    return None


def _fail(
    obj: NftObject, reason: str, field: str = "", sets: Mapping[str, SetLike] | None = None
) -> InvalidNftObject:
    return InvalidNftObject(describe(obj, sets), reason, field=field)


def _check_name(obj: NftObject, kind: str, name: str) -> None:
    if not name:
        raise _fail(obj, f"empty {kind} name")
    if len(name.encode()) + 1 > NFT_NAME_MAXLEN:
        raise _fail(obj, f"{kind} name is {len(name.encode())} bytes, over the kernel's 255")
    if "\0" in name:
        raise _fail(obj, f"{kind} name contains NUL")


def _check_comment(
    obj: NftObject,
    comment: str,
    limit: int = COMMENT_MAXLEN,
    sets: Mapping[str, SetLike] | None = None,
) -> None:
    n = len(comment.encode())
    if n > limit:
        raise _fail(obj, f"comment is {n} bytes, over the userdata limit of {limit}", sets=sets)
    if "\0" in comment:
        raise _fail(obj, "comment contains NUL", sets=sets)


class _Scope:
    """Chains and sets visible to the transaction: ``known`` plus what it adds, minus deletes
    (a view of declarations, brought forward by ``view.step``)."""

    def __init__(self, known: Ruleset | None, table: Table | None = None) -> None:
        t = known.table if known else table or Table(family=Family.IP, name="")
        self.view = Ruleset(table=t)
        if known:
            self.view.chains.update(known.chains)
            self.view.sets.update(known.sets)
        self.chains = self.view.chains
        self.sets: dict[str, SetLike] = self.view.sets

    def apply(self, op: Operation) -> None:
        step(self.view, op, declarations=True)


def validate(table: Table, ops: Sequence[Operation], known: Ruleset | None = None) -> None:
    """Raise on the first operation the kernel would reject, naming its object.

    Args:
        table: the table the transaction is for.
        ops: the transaction, in order.
        known: what the kernel already has in ``table`` (chains and sets are enough).

    Raises:
        InvalidNftObject: names the object, e.g. ``chain services: jump to chain nowhere,
            which neither the transaction nor the table has``.
    """
    _check_name(table, "table", table.name)
    _check_comment(table, table.comment)
    scope = _Scope(known)
    fast: dict[str, Callable[[Element], bool]] = {}
    i, bulk_tried = 0, 0  # runs from bulk_tried on have not been tried in bulk
    while i < len(ops):
        op = ops[i]
        obj = op.obj
        if obj.__class__ is Element and op.verb in _ELEMENT_VERBS and i >= bulk_tried:
            bulk_tried = run_end(ops, i)
            if bulk_tried - i >= _BULK_MIN and _bulk_ok(ops[i:bulk_tried], scope):
                i = bulk_tried
                continue
        i += 1
        if obj.__class__ is Element and op.verb in _ELEMENT_VERBS:
            ok = fast.get(obj.set)
            if ok is None and obj.set in scope.sets:
                ok = fast[obj.set] = _quick_check(scope.sets[obj.set], scope)
            if ok is not None and ok(obj):
                continue
        elif obj.__class__ in (Set, Map, Table):
            fast.clear()
        allowed = _VERBS[type(op.obj)]
        if op.verb not in allowed:
            raise _fail(op.obj, f"cannot {op.verb} this kind of object")
        scope.apply(op)
        _check_op(table, op, scope)


_ELEMENT_VERBS = frozenset({Verb.ADD, Verb.CREATE})
_BULK_MIN = 64
"""Shorter runs of element additions are checked one by one."""


def _bulk_ok(run: Sequence[Operation], scope: _Scope) -> bool:
    """Whether a run of element additions to one set is certainly valid (checked in bulk)."""
    s = scope.sets.get(run[0].obj.set)  # type: ignore[union-attr]
    if s is None:
        return False
    els: list[Element] = [op.obj for op in run]  # type: ignore[misc]
    return elements_ok(
        s, els, ranges=_RANGES, chains=scope.chains.keys(), comment_max=ELEMENT_COMMENT_MAXLEN
    )


def _quick_check(s: SetLike, scope: _Scope) -> Callable[[Element], bool]:
    """A fast test that passes the common valid element of ``s`` (a bulk add of 100k elements
    must not cost a second); whatever it does not pass gets the full check and its message."""
    interval = bool(s.flags & SetFlag.INTERVAL)
    keyp = [_quick_part(dt, interval) for dt in s.key]
    n = len(keyp)
    datap = [_quick_part(dt, False) for dt in s.data] if isinstance(s, Map) else []
    vmap = isinstance(s, Map) and s.is_vmap
    chains = scope.chains

    def ok(el: Element) -> bool:
        key = el.key
        if len(key) != n or el.timeout is not None or len(el.comment) * 4 > ELEMENT_COMMENT_MAXLEN:
            return False
        if not all(p(v) for p, v in zip(keyp, key, strict=True)):
            return False
        v = el.value
        if vmap:
            return v.__class__ is Verdict and (v.chain is None or v.chain in chains)
        if not datap:
            return v is None
        return (
            isinstance(v, tuple)  # or a tuple type: the planner's (address, port) Backend
            and len(v) == len(datap)
            and all(p(x) for p, x in zip(datap, v, strict=True))
        )

    return ok


def _quick_part(dt: DataType, interval: bool) -> Callable[[object], bool]:
    if dt is DataType.IPV4_ADDR:
        return (
            (lambda v: v.__class__ in (IPv4Address, IPv4Network))
            if interval
            else (lambda v: v.__class__ is IPv4Address)
        )
    if dt is DataType.IPV6_ADDR:
        return (
            (lambda v: v.__class__ in (IPv6Address, IPv6Network))
            if interval
            else (lambda v: v.__class__ is IPv6Address)
        )
    if dt is DataType.VERDICT:
        return lambda v: False
    top = _RANGES[dt]
    return lambda v: isinstance(v, int) and v.__class__ is not bool and 0 <= v <= top


def _check_op(table: Table, op: Operation, scope: _Scope) -> None:
    obj = op.obj
    match obj:
        case Table():
            if (obj.family, obj.name) != (table.family, table.name):
                raise _fail(obj, f"the backend is bound to table {table.family} {table.name}")
            _check_comment(obj, obj.comment)
            if obj.persist and not obj.owner:
                raise _fail(obj, "persist needs owner")
        case Chain():
            _check_chain(obj)
        case Set() | Map():
            _check_set(obj)
        case Rule():
            _check_rule(table, op, obj, scope)
        case Element():
            _check_element(obj, scope, removing=op.verb in (Verb.DELETE, Verb.DESTROY))
        case PackedRun():
            _check_packed(obj, scope, adding=op.verb in _ELEMENT_VERBS)


def _check_packed(run: PackedRun, scope: _Scope, *, adding: bool) -> None:
    """A packed run is checked for its shape only: every key (and datum) is as long as its
    set's, so the kernel reads each as the set's types. The values inside are valid by
    construction, as every byte pattern of a fixed-size address, port, protocol or integer
    is one; :func:`check_packed_elements` unpacks a run and checks each element in full (tests
    cross-check the planner's runs with it)."""
    s = scope.sets.get(run.set)
    if s is None:
        raise _fail(run, f"set {run.set} is neither in the transaction nor in the table")
    if not packable(s):
        raise _fail(run, "its elements cannot be sent packed (intervals, timeouts or verdicts)")
    if run.keys and set(map(len, run.keys)) != {pad4_len(s.key)}:
        raise _fail(run, f"every key is {pad4_len(s.key)} bytes long", "keys", sets=scope.sets)
    if not adding or not isinstance(s, Map):
        return
    if run.data is None or len(run.data) != len(run.keys):
        raise _fail(run, "every key has its data", "data", sets=scope.sets)
    if run.data and set(map(len, run.data)) != {pad4_len(s.data)}:
        raise _fail(run, f"every datum is {pad4_len(s.data)} bytes long", "data", sets=scope.sets)


def check_packed_elements(table: Table, run: PackedRun, verb: Verb, known: Ruleset) -> None:
    """Check every element of ``run`` in full, as :func:`validate` checks an
    :class:`Element` (decodes each: a test-time cross-check, not for the hot path)."""
    s = known.sets[run.set]
    ops = [Operation(verb, el) for el in unpack_run(run, s, verb)]
    scope = _Scope(known)
    for op in ops:
        _check_op(table, op, scope)


def pad4_len(types: Sequence[DataType]) -> int:
    """Bytes of a packed key or datum of ``types`` (parts of a concatenation padded to 4)."""
    return Packer(types).size


def _check_chain(chain: Chain) -> None:
    _check_name(chain, "chain", chain.name)
    _check_comment(chain, chain.comment)
    if (chain.type is None) != (chain.hook is None):
        raise _fail(chain, "a base chain needs both type and hook")
    if chain.policy is not None and chain.hook is None:
        raise _fail(chain, "only a base chain has a policy")


def _check_set(s: SetLike) -> None:
    _check_name(s, "set", s.name)
    _check_comment(s, s.comment)
    if not s.key or DataType.VERDICT in s.key:
        raise _fail(s, "the key needs at least one part and no verdict", "key")
    if isinstance(s, Map) and (not s.data or (DataType.VERDICT in s.data and not s.is_vmap)):
        raise _fail(s, "the data is a verdict alone or a concatenation of values", "data")
    if s.timeout is not None and s.timeout <= 0:
        raise _fail(s, f"timeout {s.timeout} is not positive", "timeout")
    if sum(-(-dt.length // 4) for dt in s.key) > 16:
        raise _fail(s, "the key is longer than the kernel's 64 bytes", "key")


def _check_element(el: Element, scope: _Scope, *, removing: bool) -> None:
    s = scope.sets.get(el.set)
    if s is None:
        raise _fail(
            el, f"set {el.set} is neither in the transaction nor in the table", sets=scope.sets
        )
    _check_comment(el, el.comment, ELEMENT_COMMENT_MAXLEN, scope.sets)
    if len(el.key) != len(s.key):
        raise _fail(
            el, f"key has {len(el.key)} parts, {s.name} wants {len(s.key)}", "key", sets=scope.sets
        )
    interval = bool(s.flags & SetFlag.INTERVAL)
    for i, (dt, v) in enumerate(zip(s.key, el.key, strict=True)):
        if (why := check_value(dt, v, interval=interval)) is not None:
            raise _fail(el, why, f"key[{i}]", sets=scope.sets)
    has_timeouts = s.timeout is not None or bool(s.flags & SetFlag.TIMEOUT)
    if el.timeout is not None and (el.timeout <= 0 or not has_timeouts):
        raise _fail(
            el,
            f"timeout {el.timeout}: positive, in a set with timeouts",
            "timeout",
            sets=scope.sets,
        )
    if not removing:
        _check_element_value(el, s, scope)


def _check_element_value(el: Element, s: SetLike, scope: _Scope) -> None:
    if not isinstance(s, Map):
        if el.value is not None:
            raise _fail(el, f"{s.name} is a set: an element has no value", "value", sets=scope.sets)
        return
    if s.is_vmap:
        if not isinstance(el.value, Verdict):
            raise _fail(el, f"map {s.name} wants a verdict", "value", sets=scope.sets)
        _check_verdict(el, el.value, scope)
        return
    if not isinstance(el.value, tuple) or len(el.value) != len(s.data):
        raise _fail(el, f"map {s.name} wants {len(s.data)} data parts", "value", sets=scope.sets)
    for i, (dt, v) in enumerate(zip(s.data, el.value, strict=True)):
        if (why := check_value(dt, v)) is not None:
            raise _fail(el, why, f"value[{i}]", sets=scope.sets)


def _check_verdict(obj: NftObject, v: Verdict, scope: _Scope) -> None:
    needs_chain = v.kind in (VerdictKind.JUMP, VerdictKind.GOTO)
    if needs_chain != (v.chain is not None):
        raise _fail(
            obj, f"{v.kind} {'needs' if needs_chain else 'takes no'} chain", sets=scope.sets
        )
    if v.chain is not None and v.chain not in scope.chains:
        reason = f"{v.kind} to chain {v.chain}, which neither the transaction nor the table has"
        raise _fail(obj, reason, sets=scope.sets)


def _check_rule(table: Table, op: Operation, rule: Rule, scope: _Scope) -> None:
    if op.verb in (Verb.REPLACE, Verb.DELETE, Verb.DESTROY) and rule.handle is None:
        raise _fail(rule, f"{op.verb} needs the rule's handle")
    if rule.chain not in scope.chains and op.verb not in (Verb.DELETE, Verb.DESTROY):
        raise _fail(rule, f"chain {rule.chain} is neither in the transaction nor in the table")
    _check_comment(rule, rule.comment)
    if op.verb in (Verb.DELETE, Verb.DESTROY):
        return
    for i, expr in enumerate(rule.exprs):
        try:
            _check_expr(table, expr, scope)
        except InvalidNftObject as exc:
            raise _fail(rule, exc.reason, f"exprs[{i}]") from None


def _check_keys(key: tuple[Selector, ...], s: SetLike | None, name: str) -> None:
    if s is None:
        raise InvalidNftObject("", f"set {name} is neither in the transaction nor in the table")
    if not key:
        raise InvalidNftObject("", "empty key")
    for sel in key:
        if isinstance(sel, Field) and sel.datatype is None:
            raise InvalidNftObject("", f"{sel.text} cannot be part of a key")
    if len(key) != len(s.key):
        raise InvalidNftObject("", f"key has {len(key)} parts, {name} wants {len(s.key)}")


def check_ifname(pattern: str) -> str | None:
    """Why ``pattern`` is neither an interface name nor a name prefix ending in ``*`` (None
    when it is one): the kernel's rules for a name (1 to 15 bytes, not ``.`` or ``..``, no
    ``/``, ``:``, NUL or whitespace)."""
    name = pattern.removesuffix("*")
    if not name:
        return f"{pattern!r} names no interface"
    if len(name.encode()) >= IFNAMSIZ:
        return f"{pattern!r} is longer than {IFNAMSIZ - 1} bytes"
    if name in (".", "..") or any(c in "/:*\0" or c.isspace() for c in name):
        return f"{pattern!r} is not an interface name"
    return None


def _check_cmp(table: Table, e: Cmp) -> None:
    if e.left is Field.META_IIFNAME or isinstance(e.right, str):
        if e.left is not Field.META_IIFNAME or not isinstance(e.right, str):
            raise InvalidNftObject("", f"{e.left.text}: {e.right!r} is not in its type")
        if (why := check_ifname(e.right)) is not None:
            raise InvalidNftObject("", f"iifname: {why}")
        if e.op not in (Op.EQ, Op.NE) or e.mask is not None:
            raise InvalidNftObject("", f"iifname takes == or != and no mask, not {e.op}")
        return
    dt = e.left.datatype
    if dt is not None:
        net_ok = dt in (DataType.IPV4_ADDR, DataType.IPV6_ADDR) and e.mask is None
        if (why := check_value(dt, e.right, interval=net_ok)) is not None:
            raise InvalidNftObject("", f"{e.left.text}: {why}")
        if isinstance(e.right, IPv4Network | IPv6Network) and e.op not in (Op.EQ, Op.NE):
            raise InvalidNftObject("", f"a prefix match takes == or !=, not {e.op}")
    else:
        top = _FIELD_MAX.get(e.left, 0xFFFFFFFF)
        if isinstance(e.right, bool) or not isinstance(e.right, int) or not 0 <= e.right <= top:
            raise InvalidNftObject("", f"{e.left.text}: {e.right!r} is not in 0..{top}")
        if e.left in BITMASK_FIELDS and e.mask is None and e.op not in (Op.EQ, Op.NE):
            raise InvalidNftObject("", f"{e.left.text} is a bitmask: == or !=, not {e.op}")
    if e.mask is not None and not 0 <= e.mask <= 0xFFFFFFFF:
        raise InvalidNftObject("", f"mask {e.mask:#x} is not a 32-bit value")
    _check_family(table, e.left)


def _check_family(table: Table, f: Field) -> None:
    """An address field of the other family (``ct original ip6 daddr`` in an ip table)."""
    other = {Family.IP: "ip6 ", Family.IP6: "ip "}.get(table.family)
    if other is not None and f.text.removeprefix("ct original ").startswith(other):
        raise InvalidNftObject("", f"{f.text} in an {table.family} table")


def _check_expr(table: Table, e: Expr, scope: _Scope) -> None:
    match e:
        case Cmp():
            _check_cmp(table, e)
        case Lookup():
            _check_keys(e.key, scope.sets.get(e.set), e.set)
            for sel in e.key:
                if isinstance(sel, Field):
                    _check_family(table, sel)
            if isinstance(scope.sets[e.set], Map):
                raise InvalidNftObject("", f"lookup in map {e.set}: use a set")
        case VMap():
            _check_keys(e.key, scope.sets.get(e.map), e.map)
            s = scope.sets[e.map]
            if not isinstance(s, Map) or not s.is_vmap:
                raise InvalidNftObject("", f"{e.map} is not a verdict map")
        case InlineVMap():
            _check_inline(e, scope)
        case DnatMap(port_map=None):
            _check_keys(e.key, scope.sets.get(e.map), e.map)
            m = scope.sets[e.map]
            if not isinstance(m, Map) or len(m.data) != 2 or m.data[1] != DataType.INET_SERVICE:
                raise InvalidNftObject("", f"dnat map {e.map} needs data addr . inet_service")
        case DnatMap(port_map=str(port_map)):
            _check_keys(e.key, scope.sets.get(e.map), e.map)
            _check_keys(e.key, scope.sets.get(port_map), port_map)
            m, p = scope.sets[e.map], scope.sets[port_map]
            addr = (DataType.IPV4_ADDR,), (DataType.IPV6_ADDR,)
            if not isinstance(m, Map) or m.data not in addr:
                raise InvalidNftObject("", f"dnat map {e.map} needs data an address")
            if not isinstance(p, Map) or p.data != (DataType.INET_SERVICE,):
                raise InvalidNftObject("", f"dnat port map {port_map} needs data inet_service")
        case SetUpdate():
            _check_keys(e.key, scope.sets.get(e.set), e.set)
            s = scope.sets[e.set]
            if isinstance(s, Map) != bool(e.data) or (isinstance(s, Map) and s.is_vmap):
                raise InvalidNftObject("", f"update @{e.set}: data exactly for a (non-verdict) map")
            if isinstance(s, Map) and len(e.data) != len(s.data):
                raise InvalidNftObject("", f"update @{e.set}: data has {len(e.data)} parts")
        case Verdict():
            _check_verdict(Chain(name="?"), e, scope)
        case MarkSet():
            if e.op not in MARK_OPS or not 0 <= e.value <= 0xFFFFFFFF:
                raise InvalidNftObject("", f"meta mark set: op {e.op!r} value {e.value}")
        case Dnat():
            if e.port is not None and not 0 <= e.port <= 0xFFFF:
                raise InvalidNftObject("", f"dnat port {e.port} is not in 0..65535")
        case Counter() | Masquerade() | Reject():
            pass


def _check_inline(e: InlineVMap, scope: _Scope) -> None:
    if not e.entries:
        raise InvalidNftObject("", "an inline verdict map needs entries")
    types = [selector_type(sel) for sel in e.key]
    for key, verdict in e.entries:
        if len(key) != len(types):
            raise InvalidNftObject("", f"inline vmap key {key} has the wrong number of parts")
        for dt, v in zip(types, key, strict=True):
            if (why := check_value(dt, v)) is not None:
                raise InvalidNftObject("", f"inline vmap key: {why}")
        try:
            _check_verdict(Chain(name="?"), verdict, scope)
        except InvalidNftObject as exc:
            raise InvalidNftObject("", exc.reason) from None


def selector_type(sel: Selector) -> DataType:
    """The datatype a selector contributes to a key: its field's, or INTEGER for numgen."""
    if isinstance(sel, Numgen):
        return DataType.INTEGER
    if isinstance(sel, Jhash):
        if not sel.key or any(f.datatype is None for f in sel.key):
            raise InvalidNftObject("", "jhash hashes fields with a datatype, at least one")
        if not 0 < sel.modulus <= 0xFFFFFFFF or not 0 <= sel.seed <= 0xFFFFFFFF:
            raise InvalidNftObject("", "jhash modulus is not in 1..2^32-1 or seed not 32 bits")
        return DataType.INTEGER
    if sel.datatype is None:
        raise InvalidNftObject("", f"{sel.text} cannot be part of a key")
    return sel.datatype
