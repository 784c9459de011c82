"""Decode netlink expressions, set types and element bytes back into the nft IR.

Sits under the read-back (``readback.py``): that module dumps the kernel's objects with libnftnl
and hands each rule over as a list of :class:`RawExpr`; this module recognises the register
patterns nft 1.0.6 generates for each IR expression and rebuilds the expression tree. Pure: no
I/O, no libnftnl, no kernel. It must never guess: a rule with a pattern it does not recognise is
reported as undecodable (:class:`UndecodedRule`), never approximated.
"""

from __future__ import annotations

import functools
import struct
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, summarize_address_range

from nlproxy.errors import NlproxyError
from nlproxy.nft.ir import (
    Cmp,
    Counter,
    DataType,
    Dnat,
    DnatMap,
    Expr,
    Family,
    Field,
    InlineVMap,
    Lookup,
    MarkSet,
    Masquerade,
    Numgen,
    Op,
    Reject,
    RejectKind,
    Rule,
    Selector,
    SetUpdate,
    Value,
    Verdict,
    VerdictKind,
    VMap,
)

# linux/netfilter/nf_tables.h
NFT_PAYLOAD_NETWORK_HEADER = 1
NFT_PAYLOAD_TRANSPORT_HEADER = 2
NFT_META_MARK = 3
NFT_META_NFPROTO = 15
NFT_META_L4PROTO = 16
NFT_CT_STATE = 0
NFT_CT_STATUS = 2
NFT_LOOKUP_F_INV = 0x1
NFT_NAT_DNAT = 1
NFT_REJECT_ICMP_UNREACH = 0
NFT_REJECT_TCP_RST = 1
NFT_REJECT_ICMPX_UNREACH = 2
NFT_DYNSET_OP_UPDATE = 1
NFT_NG_RANDOM = 1
NFT_FIB_RESULT_ADDRTYPE = 3
NFTA_FIB_F_SADDR = 1 << 0
NFTA_FIB_F_DADDR = 1 << 1
NFT_DATA_VERDICT = 0xFFFFFF00
# linux/netfilter/nf_nat.h
NF_NAT_RANGE_MAP_IPS = 0x1
NF_NAT_RANGE_PROTO_SPECIFIED = 0x2
NF_NAT_RANGE_PROTO_RANDOM_FULLY = 0x10
# linux/netfilter.h verdicts, and nft's negative ones (nf_tables.h enum nft_verdicts)
NF_DROP = 0
NF_ACCEPT = 1
NFT_CONTINUE = -1
NFT_JUMP = -3
NFT_GOTO = -4
NFT_RETURN = -5

_CMP_OPS = {0: Op.EQ, 1: Op.NE, 2: Op.LT, 3: Op.LE, 4: Op.GT, 5: Op.GE}
_VERDICTS = {
    NF_DROP: VerdictKind.DROP,
    NF_ACCEPT: VerdictKind.ACCEPT,
    NFT_CONTINUE: VerdictKind.CONTINUE,
    NFT_JUMP: VerdictKind.JUMP,
    NFT_GOTO: VerdictKind.GOTO,
    NFT_RETURN: VerdictKind.RETURN,
}
DEFAULT_REJECT_CODE = {Family.IP: 3, Family.IP6: 4}
"""ICMP port-unreachable (ip) and ICMPv6 port-unreachable (ip6): what a bare ``reject`` sends."""
ICMPX_PORT_UNREACH = 1

# nft's type ids (enum datatypes) that may appear in a set's key or data, by (id, length).
# nft gives ``typeof ... numgen ...`` keys its 32-bit "integer" type (id 4); the IR spells a
# 32-bit number MARK, so both read back as MARK.
_TYPE_IDS: dict[int, DataType] = {dt.type_id: dt for dt in DataType if dt is not DataType.VERDICT}
_TYPE_IDS[4] = DataType.MARK
TYPE_BITS = 6

_HOST_U32 = struct.Struct("=I")
_FLAG_FIELDS = (Field.CT_STATE, Field.CT_STATUS)


class UndecodableError(NlproxyError):
    """Something read back from the kernel that the IR cannot express (a foreign pattern)."""


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


# ---------------------------------------------------------------------------------------------
# Set types and values


def pad4(n: int) -> int:
    return (n + 3) & ~3


def split_type(type_id: int, length: int, *, what: str) -> tuple[DataType, ...]:
    """Split nft's concatenated type id (6 bits per part, first part highest) into datatypes.

    Raises:
        UndecodableError: an unknown type id, or lengths that do not add up to ``length``.
    """
    if type_id == NFT_DATA_VERDICT:
        return (DataType.VERDICT,)
    ids: list[int] = []
    t = type_id
    while t:
        ids.append(t & ((1 << TYPE_BITS) - 1))
        t >>= TYPE_BITS
    ids.reverse()
    try:
        parts = tuple(_TYPE_IDS[i] for i in ids)
    except KeyError as exc:
        raise UndecodableError(what, f"unknown nft datatype id {exc.args[0]}") from None
    total = sum(pad4(p.length) for p in parts) if len(parts) > 1 else sum(p.length for p in parts)
    if not parts or total != length:
        raise UndecodableError(what, f"type 0x{type_id:x} does not match length {length}")
    return parts


def decode_value(dt: DataType | None, data: bytes) -> Value:
    """One key/data part in kernel byte order: addresses and ports in network order, marks (and
    the other 32-bit meta/ct values) in host order."""
    if dt is DataType.IPV4_ADDR:
        return IPv4Address(data[:4])
    if dt is DataType.IPV6_ADDR:
        return IPv6Address(data[:16])
    if dt is DataType.INET_SERVICE:
        return int.from_bytes(data[:2], "big")
    if dt is DataType.INET_PROTO or len(data) == 1:
        return data[0]
    if len(data) == 4:
        return int(_HOST_U32.unpack(data)[0])
    raise UndecodableError(f"value {data.hex()}", f"cannot decode as {dt}")


def decode_key(parts: tuple[DataType, ...], data: bytes) -> tuple[Value, ...]:
    """Split a (possibly concatenated) key or data blob into one value per part."""
    return key_decoder(parts)(data)


_CONVERTERS: dict[DataType, Callable[[bytes], Value]] = {
    DataType.IPV4_ADDR: IPv4Address,
    DataType.IPV6_ADDR: IPv6Address,
    DataType.INET_SERVICE: lambda b: int.from_bytes(b, "big"),
    DataType.INET_PROTO: lambda b: b[0],
    DataType.MARK: lambda b: int.from_bytes(b, sys.byteorder),
}


@functools.cache
def key_decoder(parts: tuple[DataType, ...]) -> Callable[[bytes], tuple[Value, ...]]:
    """A fast decoder for keys of one set type (read-back decodes 100k elements at a time)."""
    slices: list[tuple[int, int, Callable[[bytes], Value]]] = []
    off = 0
    for p in parts:
        if p not in _CONVERTERS:
            raise UndecodableError(f"datatype {p.name}", "has no key values")
        slices.append((off, off + p.length, _CONVERTERS[p]))
        off += p.length if len(parts) == 1 else pad4(p.length)

    def decode(data: bytes) -> tuple[Value, ...]:
        return tuple(conv(data[a:b]) for a, b, conv in slices)

    return decode


MAX_EXPANDED_RANGE = 1 << 16
"""Ranges of ports or protocols (at most 65536 values) read back as one element per value."""


def interval_value(dt: DataType, lo: bytes, hi: bytes) -> list[Value]:
    """The values covering the inclusive range [lo, hi] of one key part of an interval set:
    the networks that exactly cover an address range (a /32 or /128 for one address), or each
    value of a port or protocol range; the same members, never an approximation."""
    if lo > hi:
        raise UndecodableError(f"interval {lo.hex()}-{hi.hex()}", "ends before it starts")
    if dt is DataType.IPV4_ADDR:
        return list(summarize_address_range(IPv4Address(lo), IPv4Address(hi)))
    if dt is DataType.IPV6_ADDR:
        return list(summarize_address_range(IPv6Address(lo), IPv6Address(hi)))
    first, last = int.from_bytes(lo, "big"), int.from_bytes(hi, "big")
    if dt in (DataType.INET_SERVICE, DataType.INET_PROTO) and last - first < MAX_EXPANDED_RANGE:
        return [decode_value(dt, v.to_bytes(len(lo), "big")) for v in range(first, last + 1)]
    raise UndecodableError(
        f"interval {lo.hex()}-{hi.hex()}", f"a range of {dt.name} this large has no IR value"
    )


def key_order(key: tuple[Value, ...]) -> tuple[tuple[int, int, int], ...]:
    """Sort key for element keys: numbers part by part (addresses and networks by address,
    then prefix length), so element order is deterministic and reads naturally."""
    out = []
    for v in key:
        if isinstance(v, int):
            out.append((0, v, 0))
        elif isinstance(v, IPv4Network | IPv6Network):
            out.append((v.version, int(v.network_address), v.prefixlen))
        else:
            out.append((v.version, int(v), 0))
    return tuple(out)


def verdict_of(code: int, chain: str | None) -> Verdict:
    """A kernel verdict code (signed) and chain into a :class:`Verdict`."""
    if code >= 1 << 31:
        code -= 1 << 32
    kind = _VERDICTS.get(code)
    if kind is None:
        raise UndecodableError(f"verdict {code}", "not a verdict the IR knows")
    if kind in (VerdictKind.JUMP, VerdictKind.GOTO):
        return Verdict(kind, chain)
    return Verdict(kind)


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


_PAYLOAD_FIELDS: dict[tuple[Family, int, int], tuple[Field, int]] = {
    (Family.IP, NFT_PAYLOAD_NETWORK_HEADER, 12): (Field.IP_SADDR, 4),
    (Family.IP, NFT_PAYLOAD_NETWORK_HEADER, 16): (Field.IP_DADDR, 4),
    (Family.IP6, NFT_PAYLOAD_NETWORK_HEADER, 8): (Field.IP6_SADDR, 16),
    (Family.IP6, NFT_PAYLOAD_NETWORK_HEADER, 24): (Field.IP6_DADDR, 16),
}
_META_FIELDS = {
    NFT_META_MARK: (Field.META_MARK, 4),
    NFT_META_NFPROTO: (Field.META_NFPROTO, 1),
    NFT_META_L4PROTO: (Field.META_L4PROTO, 1),
}
_CT_FIELDS = {NFT_CT_STATE: Field.CT_STATE, NFT_CT_STATUS: Field.CT_STATUS}
_FIB_FIELDS = {NFTA_FIB_F_DADDR: Field.FIB_DADDR_TYPE, NFTA_FIB_F_SADDR: Field.FIB_SADDR_TYPE}


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
        return MarkSet(int(_HOST_U32.unpack(reg.data)[0]), "set")
    if isinstance(reg, _Sel) and reg.sel is Field.META_MARK and reg.mask and reg.xor:
        mask, xor = (int(_HOST_U32.unpack(b)[0]) for b in (reg.mask, reg.xor))
        if mask == 0xFFFFFFFF:
            return MarkSet(xor, "xor")
        if mask == ~xor & 0xFFFFFFFF:
            return MarkSet(xor, "or")
    raise UndecodableError("meta mark set", "value is not an IR mark operation")


def _ct(st: _State, e: RawExpr) -> None:
    fld = _CT_FIELDS.get(e.int("key"))
    if fld is None or "dir" in e.attrs or "sreg" in e.attrs:
        raise UndecodableError("ct", f"key {e.int('key')} is not an IR field")
    st.load(e.int("dreg"), _Sel(fld, 4))


def _fib(st: _State, e: RawExpr) -> None:
    fld = _FIB_FIELDS.get(e.int("flags"))
    if fld is None or e.int("result") != NFT_FIB_RESULT_ADDRTYPE:
        raise UndecodableError("fib", "only 'fib saddr|daddr type' is in the IR")
    st.load(e.int("dreg"), _Sel(fld, 4))


def _numgen(st: _State, e: RawExpr) -> None:
    if e.int("type") != NFT_NG_RANDOM or e.int("offset", 0) != 0:
        raise UndecodableError("numgen", "only 'numgen random mod N' is in the IR")
    st.load(e.int("dreg"), _Sel(Numgen(e.int("modulus")), 4))


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
    if fld in _FLAG_FIELDS:
        return _flag_cmp(fld, op, data, mask)
    if fld is Field.META_MARK:
        value = int(_HOST_U32.unpack(data)[0])
        return Cmp(fld, value, op, None if mask is None else int(_HOST_U32.unpack(mask)[0]))
    if fld.datatype in (DataType.IPV4_ADDR, DataType.IPV6_ADDR):
        return _addr_cmp(fld, length, op, data, mask)
    if mask is not None:
        raise UndecodableError(f"cmp {fld.text}", "masked compare is not in the IR")
    return Cmp(fld, decode_value(fld.datatype, data), op)


def _flag_cmp(fld: Field, op: Op, data: bytes, mask: bytes | None) -> Cmp:
    """ct state/status: ``& bits != 0`` is EQ ("any set"), ``& bits == 0`` is NE ("none set").

    nft writes ``ct state != invalid`` as a plain ``cmp neq``; a ct state holds exactly one bit,
    so for a single bit that is the same as "none set" and reads back as NE too.
    """
    value = int(_HOST_U32.unpack(data)[0])
    if mask is not None:
        bits = int(_HOST_U32.unpack(mask)[0])
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
    if e.int("op") != NFT_DYNSET_OP_UPDATE or "sreg_data" in e.attrs or "expr" in e.attrs:
        raise UndecodableError(f"set {name}", "only 'update @set { key [timeout] }' is in the IR")
    key = st.take_key(e.int("sreg_key"), st.set_info(name).key_len)
    ms = e.int("timeout", 0)
    if ms % 1000:
        raise UndecodableError(f"set {name}", f"timeout {ms}ms is not whole seconds")
    st.out.append(SetUpdate(name, key, ms // 1000 or None))


_HANDLERS: dict[str, Callable[[_State, RawExpr], None]] = {
    "payload": _payload,
    "meta": _meta,
    "ct": _ct,
    "fib": _fib,
    "numgen": _numgen,
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
