"""Decode netlink expressions back into the nft IR: the inverse of ``lower.py``.

Sits under the read-back (``readback.py``): that module dumps the kernel's objects with libnftnl
and hands each rule over as a list of :class:`RawExpr`; this module recognises the register
patterns nft 1.0.6 generates for each IR expression and rebuilds the expression tree. Set types
and element bytes are ``values.py``'s (shared with the encoder); the names callers import from
here are re-exported. Pure: no I/O, no libnftnl, no kernel. It must never guess: a rule with a
pattern it does not recognise is reported as undecodable (:class:`UndecodedRule`), never
approximated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

from nlproxy.nft.ir import (
    IFNAMSIZ,
    Cmp,
    Counter,
    DataType,
    Dnat,
    DnatMap,
    Expr,
    Family,
    Field,
    InlineVMap,
    Jhash,
    Lookup,
    MarkSet,
    Masquerade,
    Numgen,
    NumgenKind,
    Op,
    Reject,
    RejectKind,
    Rule,
    Selector,
    SetUpdate,
    Value,
    Verdict,
    VMap,
)
from nlproxy.nft.uapi import (
    BITMASK_FIELDS,
    CMP_OPS,
    DEFAULT_REJECT_CODE,
    FIELD_LOADS,
    ICMPX_PORT_UNREACH,
    IP_CT_DIR_ORIGINAL,
    NF_NAT_RANGE_MAP_IPS,
    NF_NAT_RANGE_PROTO_RANDOM_FULLY,
    NF_NAT_RANGE_PROTO_SPECIFIED,
    NFT_DYNSET_OP_UPDATE,
    NFT_FIB_RESULT_ADDRTYPE,
    NFT_HASH_JENKINS,
    NFT_LOOKUP_F_INV,
    NFT_META_MARK,
    NFT_NAT_DNAT,
    NFT_PAYLOAD_TRANSPORT_HEADER,
    NFT_REJECT_ICMP_UNREACH,
    NFT_REJECT_ICMPX_UNREACH,
    NFT_REJECT_TCP_RST,
    field_family,
)
from nlproxy.nft.values import (
    UndecodableError,
    decode_key,
    decode_value,
    host_u32,
    interval_value,
    key_order,
    pad4,
    split_type,
    verdict_of,
)

__all__ = [
    "RawExpr",
    "SetInfo",
    "UndecodableError",
    "UndecodedRule",
    "cmp_of",
    "decode_key",
    "decode_rule",
    "interval_value",
    "key_order",
    "pad4",
    "reg_offset",
    "split_type",
    "verdict_of",
]
"""Set types and values live in ``values.py``; they stay importable from here."""

_CMP_OPS = {code: op for op, code in CMP_OPS.items()}
# The decoder's view of FIELD_LOADS: which field an expression loaded, and how many bytes.
_PAYLOAD_FIELDS: dict[tuple[Family, int, int], tuple[Field, int]] = {
    (fam, base, off): (f, n)
    for f, (kind, base, off, n) in FIELD_LOADS.items()
    if kind == "payload" and (fam := field_family(f)) is not None
}
_META_FIELDS = {key: (f, n) for f, (kind, key, _, n) in FIELD_LOADS.items() if kind == "meta"}
_CT_FIELDS = {key: f for f, (kind, key, _, _) in FIELD_LOADS.items() if kind == "ct"}
_CT_ORIGINAL = {
    key: (f, n) for f, (kind, key, _, n) in FIELD_LOADS.items() if kind == "ct original"
}
_FIB_FIELDS = {flags: f for f, (kind, flags, _, _) in FIELD_LOADS.items() if kind == "fib"}


@dataclass(frozen=True, slots=True, kw_only=True)
class UndecodedRule(Rule):
    """A rule read back with something the IR cannot express.

    ``exprs`` is empty; ``raw`` holds libnftnl's text of each netlink expression and ``reason``
    says what could not be decoded. It never equals a :class:`Rule` (dataclass equality compares
    classes), so a reconciler sees it as stale.
    """

    raw: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True, slots=True)
class RawExpr:
    """One netlink expression as libnftnl parsed it: its name and the attributes the decoder
    reads (ints for registers/keys/flags, bytes for data, str for names)."""

    name: str
    attrs: dict[str, int | bytes | str]

    def int(self, key: str, default: int | None = None) -> int:
        v = self.attrs.get(key, default)
        if not isinstance(v, int):
            raise UndecodableError(f"expression {self.name}", f"attribute {key} missing")
        return v

    def bytes(self, key: str) -> bytes:
        v = self.attrs.get(key)
        if not isinstance(v, bytes):
            raise UndecodableError(f"expression {self.name}", f"attribute {key} missing")
        return v


@dataclass(frozen=True, slots=True)
class SetInfo:
    """What the rule decoder needs to know about a set a rule refers to."""

    key: tuple[DataType, ...]
    key_len: int
    anonymous: bool = False
    entries: tuple[tuple[tuple[Value, ...], Verdict], ...] = ()
    """For an anonymous verdict map: its elements, sorted by key."""
    data_len: int = 0
    """A map's data length (the kernel's, each part of a concatenation padded to 4 bytes)."""


# ---------------------------------------------------------------------------------------------
# Rule expressions


@dataclass(slots=True)
class _Sel:
    """A register holding a packet field (or numgen), maybe masked by a bitwise."""

    sel: Selector
    length: int
    mask: bytes | None = None
    xor: bytes | None = None


@dataclass(frozen=True, slots=True)
class _Imm:
    data: bytes


@dataclass(frozen=True, slots=True)
class _MapOut:
    """Part ``part`` of the data a map lookup wrote (for ``dnat to key map @m``)."""

    key: tuple[Selector, ...]
    map: str
    part: int


_Reg = _Sel | _Imm | _MapOut


def _is_prefix_load(r: _Sel) -> bool:
    """An address loaded only in part: nft's byte-aligned prefix match (``ip saddr 10.0.0.0/8``
    loads one byte), which cannot be part of a set key."""
    dt = r.sel.datatype if isinstance(r.sel, Field) else None
    return dt in (DataType.IPV4_ADDR, DataType.IPV6_ADDR) and r.length != dt.length


def reg_offset(reg: int) -> int:
    """Byte offset of a register: NFT_REG_1..4 are 16 bytes wide, NFT_REG32_00.. (8..) 4 bytes."""
    if 1 <= reg <= 4:
        return (reg - 1) * 16
    if 8 <= reg <= 23:
        return (reg - 8) * 4
    raise UndecodableError(f"register {reg}", "not a data register")


@dataclass(slots=True)
class _State:
    family: Family
    sets: dict[str, SetInfo]
    regs: dict[int, _Reg] = field(default_factory=dict)
    pending: set[int] = field(default_factory=set)
    out: list[Expr] = field(default_factory=list)

    def load(self, reg: int, value: _Reg) -> None:
        off = reg_offset(reg)
        self.regs[off] = value
        self.pending.add(off)

    def take(self, reg: int) -> _Reg:
        off = reg_offset(reg)
        if off not in self.regs:
            raise UndecodableError(f"register {reg}", "read before it was written")
        self.pending.discard(off)
        return self.regs[off]

    def take_key(self, reg: int, key_len: int) -> tuple[Selector, ...]:
        """The selectors a concatenation loaded into consecutive registers from ``reg``."""
        start = reg_offset(reg)
        off, key = start, []
        while off < start + key_len:
            r = self.regs.get(off)
            if not isinstance(r, _Sel) or r.mask is not None or _is_prefix_load(r):
                raise UndecodableError(f"register {reg}", "key is not a plain concatenation")
            self.pending.discard(off)
            key.append(r.sel)
            off += pad4(r.length) if key_len > r.length else r.length
        if off != start + key_len:
            raise UndecodableError(f"register {reg}", "key does not match the set's length")
        return tuple(key)

    def set_info(self, name: str) -> SetInfo:
        info = self.sets.get(name)
        if info is None:
            raise UndecodableError(f"set {name}", "referenced by a rule but not found")
        return info


def decode_rule(raw: Sequence[RawExpr], family: Family, sets: dict[str, SetInfo]) -> list[Expr]:
    """Rebuild the IR expressions of one rule from its netlink expressions.

    Raises:
        UndecodableError: the rule uses something the IR cannot express, or a register pattern
            nft does not generate for an IR expression.
    """
    st = _State(family, sets)
    for e in raw:
        handler = _HANDLERS.get(e.name)
        if handler is None:
            raise UndecodableError(f"expression {e.name}", "not part of the IR")
        handler(st, e)
    if st.pending:
        raise UndecodableError("rule", "a loaded value is never used")
    return st.out


def _payload(st: _State, e: RawExpr) -> None:
    base, off, length = e.int("base"), e.int("offset"), e.int("len")
    if base == NFT_PAYLOAD_TRANSPORT_HEADER and length == 2 and off in (0, 2):
        st.load(e.int("dreg"), _Sel(Field.TH_SPORT if off == 0 else Field.TH_DPORT, 2))
        return
    hit = _PAYLOAD_FIELDS.get((st.family, base, off))
    if hit is None or not 0 < length <= hit[1]:
        raise UndecodableError("payload", f"base {base} offset {off} is not an IR field")
    st.load(e.int("dreg"), _Sel(hit[0], length))


def _meta(st: _State, e: RawExpr) -> None:
    key = e.int("key")
    if "sreg" in e.attrs:
        if key != NFT_META_MARK:
            raise UndecodableError("meta set", f"key {key} is not the mark")
        st.out.append(_mark_set(st.take(e.int("sreg"))))
        return
    hit = _META_FIELDS.get(key)
    if hit is None:
        raise UndecodableError("meta", f"key {key} is not an IR field")
    st.load(e.int("dreg"), _Sel(hit[0], hit[1]))


def _mark_set(reg: _Reg) -> MarkSet:
    if isinstance(reg, _Imm) and len(reg.data) == 4:
        return MarkSet(host_u32(reg.data), "set")
    if isinstance(reg, _Sel) and reg.sel is Field.META_MARK and reg.mask and reg.xor:
        mask, xor = (host_u32(b) for b in (reg.mask, reg.xor))
        if mask == 0xFFFFFFFF:
            return MarkSet(xor, "xor")
        if mask == ~xor & 0xFFFFFFFF:
            return MarkSet(xor, "or")
    raise UndecodableError("meta mark set", "value is not an IR mark operation")


def _ct(st: _State, e: RawExpr) -> None:
    key = e.int("key")
    if "sreg" in e.attrs:
        raise UndecodableError("ct set", f"key {key} is not in the IR")
    if "dir" in e.attrs:
        hit = _CT_ORIGINAL.get(key) if e.int("dir") == IP_CT_DIR_ORIGINAL else None
        if hit is None:
            raise UndecodableError("ct", f"key {key} dir {e.int('dir')} is not an IR field")
        st.load(e.int("dreg"), _Sel(*hit))
        return
    fld = _CT_FIELDS.get(key)
    if fld is None:
        raise UndecodableError("ct", f"key {key} is not an IR field")
    st.load(e.int("dreg"), _Sel(fld, 4))


def _fib(st: _State, e: RawExpr) -> None:
    fld = _FIB_FIELDS.get(e.int("flags"))
    if fld is None or e.int("result") != NFT_FIB_RESULT_ADDRTYPE:
        raise UndecodableError("fib", "only 'fib saddr|daddr type' is in the IR")
    st.load(e.int("dreg"), _Sel(fld, 4))


def _numgen(st: _State, e: RawExpr) -> None:
    kinds = {k.number: k for k in NumgenKind}
    kind = kinds.get(e.int("type"))
    if kind is None or e.int("offset", 0) != 0:
        raise UndecodableError("numgen", "only 'numgen random|inc mod N' is in the IR")
    st.load(e.int("dreg"), _Sel(Numgen(e.int("modulus"), kind), 4))


def _hash(st: _State, e: RawExpr) -> None:
    if e.int("type", 0) != NFT_HASH_JENKINS or e.int("offset", 0) != 0 or "seed" not in e.attrs:
        raise UndecodableError("hash", "only 'jhash <fields> mod M seed S' is in the IR")
    key = st.take_key(e.int("sreg"), e.int("len"))
    fields = tuple(sel for sel in key if isinstance(sel, Field))
    if len(fields) != len(key):
        raise UndecodableError("hash", "hashes something other than packet fields")
    st.load(e.int("dreg"), _Sel(Jhash(fields, e.int("modulus"), e.int("seed")), 4))


def _bitwise(st: _State, e: RawExpr) -> None:
    if e.int("op", 0) != 0:
        raise UndecodableError("bitwise", "shifts are not in the IR")
    reg = st.take(e.int("sreg"))
    if not isinstance(reg, _Sel) or reg.mask is not None:
        raise UndecodableError("bitwise", "applied to something other than a field")
    st.load(e.int("dreg"), _Sel(reg.sel, reg.length, e.bytes("mask"), e.bytes("xor")))


def _immediate(st: _State, e: RawExpr) -> None:
    dreg = e.int("dreg")
    if dreg == 0:
        chain = e.attrs.get("chain")
        st.out.append(verdict_of(e.int("verdict"), chain if isinstance(chain, str) else None))
    else:
        st.load(dreg, _Imm(e.bytes("data")))


def _counter(st: _State, e: RawExpr) -> None:
    st.out.append(Counter())


def _cmp(st: _State, e: RawExpr) -> None:
    reg = st.take(e.int("sreg"))
    op = _CMP_OPS.get(e.int("op"))
    if not isinstance(reg, _Sel) or not isinstance(reg.sel, Field) or op is None:
        raise UndecodableError("cmp", "compares something other than a field")
    st.out.append(cmp_of(reg.sel, reg.length, op, e.bytes("data"), reg.mask, reg.xor))


def cmp_of(
    fld: Field, length: int, op: Op, data: bytes, mask: bytes | None, xor: bytes | None
) -> Cmp:
    """The :class:`Cmp` nft means by ``[payload|meta|ct] [bitwise] cmp``."""
    if xor is not None and any(xor):
        raise UndecodableError(f"cmp {fld.text}", "a bitwise with xor is not a match")
    if fld in BITMASK_FIELDS:
        return _flag_cmp(fld, op, data, mask)
    if fld is Field.META_IIFNAME:
        return _iifname_cmp(op, data, mask)
    if fld is Field.META_MARK:
        value = host_u32(data)
        return Cmp(fld, value, op, None if mask is None else host_u32(mask))
    if fld.datatype in (DataType.IPV4_ADDR, DataType.IPV6_ADDR):
        return _addr_cmp(fld, length, op, data, mask)
    if mask is not None:
        raise UndecodableError(f"cmp {fld.text}", "masked compare is not in the IR")
    return Cmp(fld, decode_value(fld.datatype, data), op)


def _iifname_cmp(op: Op, data: bytes, mask: bytes | None) -> Cmp:
    """``iifname``: ``IFNAMSIZ`` bytes are a name padded with NULs, fewer a prefix (``"veth*"``),
    as nft compares them."""
    if mask is None and op in (Op.EQ, Op.NE) and 0 < len(data) <= IFNAMSIZ:
        name, nul, rest = data.partition(b"\0")
        try:
            text = name.decode()
        except UnicodeDecodeError:
            text = ""
        if text and len(data) == IFNAMSIZ and nul and not any(rest):
            return Cmp(Field.META_IIFNAME, text, op)
        if text and len(data) < IFNAMSIZ and not nul:
            return Cmp(Field.META_IIFNAME, text + "*", op)
    raise UndecodableError("cmp iifname", "not a name or a name prefix")


def _flag_cmp(fld: Field, op: Op, data: bytes, mask: bytes | None) -> Cmp:
    """ct state/status: ``& bits != 0`` is EQ ("any set"), ``& bits == 0`` is NE ("none set").

    nft writes ``ct state != invalid`` as a plain ``cmp neq``; a ct state holds exactly one bit,
    so for a single bit that is the same as "none set" and reads back as NE too.
    """
    value = host_u32(data)
    if mask is not None:
        bits = host_u32(mask)
        if value == 0 and op in (Op.EQ, Op.NE):
            return Cmp(fld, bits, Op.NE if op is Op.EQ else Op.EQ)
    elif fld is Field.CT_STATE and op is Op.NE and value and value & (value - 1) == 0:
        return Cmp(fld, value, Op.NE)
    raise UndecodableError(f"cmp {fld.text}", "not an IR bit test")


def _addr_cmp(fld: Field, length: int, op: Op, data: bytes, mask: bytes | None) -> Cmp:
    full = 4 if fld.datatype is DataType.IPV4_ADDR else 16
    padded = data[:length] + bytes(full - length)
    addr: IPv4Address | IPv6Address = IPv4Address(padded) if full == 4 else IPv6Address(padded)
    prefix = length * 8
    if mask is not None:
        m = int.from_bytes(mask[:length], "big")
        ones = bin(m).count("1")
        if m != ((1 << ones) - 1) << (length * 8 - ones):
            raise UndecodableError(f"cmp {fld.text}", "mask is not a prefix")
        prefix = ones
    if prefix == full * 8:
        return Cmp(fld, addr, op)
    net = IPv4Network((addr, prefix)) if full == 4 else IPv6Network((addr, prefix))
    return Cmp(fld, net, op)


def _lookup(st: _State, e: RawExpr) -> None:
    name = str(e.attrs.get("set", ""))
    info = st.set_info(name)
    key = st.take_key(e.int("sreg"), info.key_len)
    negate = bool(e.int("flags", 0) & NFT_LOOKUP_F_INV)
    if "dreg" not in e.attrs:
        if info.anonymous:
            raise UndecodableError(f"set {name}", "anonymous sets are not in the IR")
        st.out.append(Lookup(key, name, negate))
        return
    if negate:
        raise UndecodableError(f"map {name}", "negated map lookup")
    dreg = e.int("dreg")
    if dreg == 0:
        st.out.append(InlineVMap(key, info.entries) if info.anonymous else VMap(key, name))
        return
    if info.anonymous:
        raise UndecodableError(f"map {name}", "anonymous data maps are not in the IR")
    st.load(dreg, _MapOut(key, name, 0))
    addr_len = 16 if st.family is Family.IP6 else 4
    if info.data_len > addr_len:  # (``addr . port``: the port's part follows the address)
        st.regs[reg_offset(dreg) + addr_len] = _MapOut(key, name, 1)


def _nat(st: _State, e: RawExpr) -> None:
    flags = e.int("flags", 0)
    if e.int("type") != NFT_NAT_DNAT or not flags & NF_NAT_RANGE_MAP_IPS:
        raise UndecodableError("nat", "only dnat to an address is in the IR")
    if flags & ~(NF_NAT_RANGE_MAP_IPS | NF_NAT_RANGE_PROTO_SPECIFIED):
        raise UndecodableError("nat", f"flags 0x{flags:x} are not in the IR")
    amin, amax = e.int("addr_min"), e.int("addr_max", e.int("addr_min"))
    has_port = bool(flags & NF_NAT_RANGE_PROTO_SPECIFIED)
    pmin = e.int("proto_min") if has_port else 0
    if amax != amin or (has_port and e.int("proto_max", pmin) != pmin):
        raise UndecodableError("nat", "address or port ranges are not in the IR")
    addr = st.take(amin)
    port = st.take(pmin) if has_port else None
    if isinstance(addr, _MapOut) and isinstance(port, _MapOut) and addr.part == 0:
        if port.part == 0 and port.map != addr.map and port.key == addr.key:
            st.out.append(DnatMap(addr.key, addr.map, port.map))  # (a map each)
            return
        if port.part != 1 or port.map != addr.map:
            raise UndecodableError("nat", "address and port from different lookups")
        st.out.append(DnatMap(addr.key, addr.map))
        return
    if not isinstance(addr, _Imm) or not (port is None or isinstance(port, _Imm)):
        raise UndecodableError("nat", "address is neither a constant nor a map lookup")
    ip: IPv4Address | IPv6Address = (
        IPv6Address(addr.data[:16]) if st.family is Family.IP6 else IPv4Address(addr.data[:4])
    )
    st.out.append(Dnat(ip, None if port is None else int.from_bytes(port.data[:2], "big")))


def _masq(st: _State, e: RawExpr) -> None:
    flags = e.int("flags", 0)
    if flags & ~NF_NAT_RANGE_PROTO_RANDOM_FULLY or "proto_min" in e.attrs:
        raise UndecodableError("masquerade", f"flags 0x{flags:x} are not in the IR")
    st.out.append(Masquerade(fully_random=bool(flags)))


def _reject(st: _State, e: RawExpr) -> None:
    rtype, code = e.int("type"), e.int("code", 0)
    if rtype == NFT_REJECT_TCP_RST:
        st.out.append(Reject(RejectKind.TCP_RESET))
    elif rtype == NFT_REJECT_ICMPX_UNREACH:
        st.out.append(Reject(RejectKind.ICMPX, None if code == ICMPX_PORT_UNREACH else code))
    elif rtype == NFT_REJECT_ICMP_UNREACH:
        default = DEFAULT_REJECT_CODE.get(st.family)
        st.out.append(Reject(RejectKind.ICMP, None if code == default else code))
    else:
        raise UndecodableError("reject", f"type {rtype} is not in the IR")


def _dynset(st: _State, e: RawExpr) -> None:
    name = str(e.attrs.get("set", ""))
    if e.int("op") != NFT_DYNSET_OP_UPDATE or "expr" in e.attrs:
        raise UndecodableError(
            f"set {name}", "only 'update @set { key [timeout] [: data] }' is in the IR"
        )
    info = st.set_info(name)
    key = st.take_key(e.int("sreg_key"), info.key_len)
    data: tuple[Selector, ...] = ()
    if "sreg_data" in e.attrs:
        data = st.take_key(e.int("sreg_data"), info.data_len)
    ms = e.int("timeout", 0)
    if ms % 1000:
        raise UndecodableError(f"set {name}", f"timeout {ms}ms is not whole seconds")
    st.out.append(SetUpdate(name, key, ms // 1000 or None, data))


_HANDLERS: dict[str, Callable[[_State, RawExpr], None]] = {
    "payload": _payload,
    "meta": _meta,
    "ct": _ct,
    "fib": _fib,
    "numgen": _numgen,
    "hash": _hash,
    "bitwise": _bitwise,
    "immediate": _immediate,
    "counter": _counter,
    "cmp": _cmp,
    "lookup": _lookup,
    "nat": _nat,
    "masq": _masq,
    "reject": _reject,
    "dynset": _dynset,
}
