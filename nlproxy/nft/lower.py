"""Lower rule bodies: each IR expression into the netlink expressions nft 1.0.6 emits for it.

Sits under the encoder: ``encode.py``'s :class:`~nlproxy.nft.encode.Batch` hands each rule's
expression tree to :class:`RuleLowering` and adds the libnftnl expression objects it gets back to
the rule's NEWRULE message. The register patterns match ``nft --debug=netlink`` for the same rule
text, so ``nft list`` and the read-back (``decode.py``, its inverse) understand what we program.
It builds libnftnl objects only: it never sends anything, never builds messages (an anonymous map
goes back to the batch through the ``anon`` callback) and never decides what to program.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network
from typing import Any, assert_never

from nlproxy._nftshim import lib
from nlproxy.nft.ir import (
    IFNAMSIZ,
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
    Numgen,
    Op,
    Reject,
    RejectKind,
    Selector,
    SetFlag,
    SetLike,
    SetUpdate,
    Table,
    Value,
    Verdict,
    VMap,
)
from nlproxy.nft.jhash import key_length
from nlproxy.nft.uapi import (
    BITMASK_FIELDS,
    CMP_OPS,
    DEFAULT_REJECT_CODE,
    FIELD_LOADS,
    ICMPX_PORT_UNREACH,
    IP_CT_DIR_ORIGINAL,
    NF_NAT_RANGE_PROTO_RANDOM_FULLY,
    NF_NAT_RANGE_PROTO_SPECIFIED,
    NFT_DYNSET_OP_UPDATE,
    NFT_FIB_RESULT_ADDRTYPE,
    NFT_HASH_JENKINS,
    NFT_LOOKUP_F_INV,
    NFT_META_MARK,
    NFT_NAT_DNAT,
    NFT_REG32_00,
    NFT_REG_1,
    NFT_REG_VERDICT,
    REJECT_TYPES,
    field_family,
)
from nlproxy.nft.validate import selector_type
from nlproxy.nft.values import VERDICT_CODES, Packer, concat_ids


def register(slot: int) -> int:
    """nft's register number for 32-bit slot ``slot``: a 128-bit NFT_REG_n when aligned."""
    return NFT_REG_1 + slot // 4 if slot % 4 == 0 else NFT_REG32_00 + slot


_FIELD_PACKERS: dict[DataType, Packer] = {}


def field_bytes(f: Field, v: Value | str) -> bytes:
    """A comparison operand as the kernel holds the field: network order, or host order.

    An interface name is compared as nft does: a name padded with NULs to ``IFNAMSIZ`` (so
    ``"eth0"`` does not match ``eth01``), a prefix ``"veth*"`` on its own bytes only.
    """
    if isinstance(v, str):
        if f is not Field.META_IIFNAME:
            raise ValueError(f"{f.text} is not compared with a name")
        raw = v.encode()
        return raw[:-1] if v.endswith("*") else raw.ljust(IFNAMSIZ, b"\0")
    dt = f.datatype
    if dt is not None:
        packer = _FIELD_PACKERS.get(dt)
        if packer is None:
            packer = _FIELD_PACKERS[dt] = Packer((dt,))
        return packer.pack((v,))
    assert isinstance(v, int)
    return struct.pack("=B" if f is Field.META_NFPROTO else "=I", v)


def _nfproto_of(f: Field) -> int | None:
    family = field_family(f)
    return None if family is None else family.nfproto


def _fields(e: Expr) -> list[Field]:
    match e:
        case Cmp():
            return [e.left]
        case Lookup() | VMap() | InlineVMap() | DnatMap() | SetUpdate():
            return [
                f
                for sel in e.key
                for f in (sel.key if isinstance(sel, Jhash) else (sel,))
                if isinstance(f, Field)
            ]
        case _:
            return []


class RuleLowering:
    """Lowers one rule's expressions into libnftnl expression objects, in order.

    Args:
        table: the rule's table (its family decides ``meta nfproto`` guards and reject codes).
        sets: sets and maps by name (a ``dnat ... map`` needs its map's data type).
        anon: creates an anonymous map with its elements and key type, returning its set id.

    After :meth:`lower`, ``owner[n]`` is the index of the IR expression behind netlink
    expression ``n`` (the batch maps an extended-ack offset back to it).
    """

    def __init__(
        self,
        table: Table,
        sets: Mapping[str, SetLike],
        anon: Callable[[Map, Sequence[Element], int], int],
    ) -> None:
        self.table = table
        self.sets = sets
        self.anon = anon
        self.out: list[Any] = []
        self.owner: list[int] = []  # for each netlink expression, its IR expression's index
        self.deps: set[int] = set()

    def lower(self, exprs: Sequence[Expr]) -> list[Any]:
        """The libnftnl expressions for ``exprs``; the caller owns (and must add or free) them."""
        try:
            for i, e in enumerate(exprs):
                self._dependencies(e)
                self._expr(e)
                self.owner += [i] * (len(self.out) - len(self.owner))
        except BaseException:
            for x in self.out:
                lib.nftnl_expr_free(x)
            raise
        return self.out

    def _emit(self, name: str, **attrs: int | bytes | str | _Wide) -> Any:
        """Append expression ``name`` with attributes ``NFTNL_EXPR_<key>``: an int is a u32,
        bytes are data, a str is a string, :class:`_Wide` a u8 or u64."""
        x = lib.nftnl_expr_alloc(name.encode())
        self.out.append(x)
        for key, val in attrs.items():
            attr = _attr(key)
            if isinstance(val, _Wide):
                setter = lib.nftnl_expr_set_u64 if val.bits == 64 else lib.nftnl_expr_set_u8
                setter(x, attr, val.value)
            elif isinstance(val, int):
                lib.nftnl_expr_set_u32(x, attr, val & 0xFFFFFFFF)
            elif isinstance(val, bytes):
                lib.nftnl_expr_set(x, attr, val, len(val))
            else:
                lib.nftnl_expr_set_str(x, attr, val.encode())
        return x

    def _dependencies(self, e: Expr) -> None:
        """In an inet table nft guards ip/ip6 header loads with ``meta nfproto``."""
        if self.table.family is not Family.INET:
            return
        for f in _fields(e):
            proto = _nfproto_of(f)
            if proto is not None and proto not in self.deps:
                self.deps.add(proto)
                self._load(Field.META_NFPROTO, 0)
                self._cmp_reg(Op.EQ, 0, bytes((proto,)))

    def _load(self, sel: Selector, slot: int, length: int | None = None) -> int:
        """Load ``sel`` into ``slot``; returns the number of 32-bit slots it fills."""
        reg = register(slot)
        if isinstance(sel, Numgen):
            self._emit("numgen", NG_DREG=reg, NG_MODULUS=sel.modulus, NG_TYPE=sel.kind.number)
            return 1
        if isinstance(sel, Jhash):
            # nft loads the hashed fields from the next 128-bit register on, then hashes them
            # into this slot.
            src = (slot // 4 + 1) * 4
            used = src
            for part in sel.key:
                used += self._load(part, used)
            self._emit("hash", HASH_SREG=register(src), HASH_DREG=reg, HASH_LEN=key_length(sel),
                       HASH_MODULUS=sel.modulus, HASH_SEED=sel.seed,
                       HASH_TYPE=NFT_HASH_JENKINS)  # fmt: skip
            return 1
        kind, a, b, n = FIELD_LOADS[sel]
        if kind == "payload":
            self._emit("payload", PAYLOAD_DREG=reg, PAYLOAD_BASE=a, PAYLOAD_OFFSET=b,
                       PAYLOAD_LEN=length or n)  # fmt: skip
        elif kind == "meta":
            self._emit("meta", META_KEY=a, META_DREG=reg)
        elif kind == "ct":
            self._emit("ct", CT_KEY=a, CT_DREG=reg)
        elif kind == "ct original":
            self._emit("ct", CT_KEY=a, CT_DREG=reg, CT_DIR=_Wide(IP_CT_DIR_ORIGINAL, 8))
        else:
            self._emit("fib", FIB_FLAGS=a, FIB_RESULT=NFT_FIB_RESULT_ADDRTYPE, FIB_DREG=reg)
        return (n + 3) // 4

    def _load_key(self, key: Sequence[Selector]) -> int:
        """Load a key, part after part in consecutive 32-bit registers; returns slots used."""
        slot = 0
        for sel in key:
            slot += self._load(sel, slot)
        return slot

    def _cmp_reg(self, op: Op, slot: int, data: bytes) -> None:
        self._emit("cmp", CMP_SREG=register(slot), CMP_OP=CMP_OPS[op], CMP_DATA=data)

    def _bitwise(self, mask: bytes, xor: bytes | None = None) -> None:
        """``reg 1 = (reg 1 & mask) ^ xor``."""
        xor = bytes(len(mask)) if xor is None else xor
        self._emit("bitwise", BITWISE_SREG=NFT_REG_1, BITWISE_DREG=NFT_REG_1,
                   BITWISE_LEN=len(mask), BITWISE_MASK=mask, BITWISE_XOR=xor)  # fmt: skip

    def _cmp(self, c: Cmp) -> None:
        if isinstance(c.right, IPv4Network | IPv6Network):
            self._prefix(c.left, c.op, c.right)
            return
        data = field_bytes(c.left, c.right)
        self._load(c.left, 0)
        if c.mask is not None:
            self._bitwise(field_bytes(c.left, c.mask))
            self._cmp_reg(c.op, 0, data)
        elif c.left in BITMASK_FIELDS:
            # nft: ``ct state new`` is ``(state & new) != 0``; "none of these" is ``== 0``.
            self._bitwise(data)
            self._cmp_reg(Op.NE if c.op is Op.EQ else Op.EQ, 0, bytes(len(data)))
        else:
            self._cmp_reg(c.op, 0, data)

    def _prefix(self, f: Field, op: Op, net: IPv4Network | IPv6Network) -> None:
        """A prefix as nft lowers it: a shorter load when byte-aligned, else a bitwise mask."""
        plen, full, addr = net.prefixlen, net.max_prefixlen, net.network_address.packed
        if plen % 8 == 0 and plen > 0:
            self._load(f, 0, plen // 8)
            self._cmp_reg(op, 0, addr[: plen // 8])
            return
        self._load(f, 0)
        self._bitwise(net.netmask.packed)
        self._cmp_reg(op, 0, addr)
        assert plen < full

    def _lookup(self, key: Sequence[Selector], name: str, **kw: int) -> None:
        self._load_key(key)
        attrs: dict[str, int | str] = {"LOOKUP_SREG": register(0), "LOOKUP_SET": name}
        if "dreg" in kw:
            attrs["LOOKUP_DREG"] = kw["dreg"]
        if kw.get("flags"):
            attrs["LOOKUP_FLAGS"] = kw["flags"]
        if kw.get("set_id"):
            attrs["LOOKUP_SET_ID"] = kw["set_id"]
        self._emit("lookup", **attrs)

    def _inline_vmap(self, e: InlineVMap) -> None:
        types = tuple(selector_type(sel) for sel in e.key)
        m = Map(name="__map%d", key=types, data=(DataType.VERDICT,), flags=_ANON_MAP)
        els = [Element(set=m.name, key=k, value=v) for k, v in e.entries]
        set_id = self.anon(m, els, concat_ids([t.type_id for t in types]))
        self._lookup(e.key, m.name, dreg=NFT_REG_VERDICT, set_id=set_id)

    def _dnat_map(self, e: DnatMap) -> None:
        m = self.sets[e.map]
        assert isinstance(m, Map)
        v6 = m.data[0] is DataType.IPV6_ADDR
        if e.port_map is not None:
            # The port first, into a register the address lookup's key does not overwrite.
            self._lookup(e.key, e.port_map, dreg=register(4))
            self._lookup(e.key, e.map, dreg=NFT_REG_1)
            self._emit("nat", NAT_TYPE=NFT_NAT_DNAT, NAT_FAMILY=10 if v6 else 2,
                       NAT_REG_ADDR_MIN=NFT_REG_1, NAT_REG_PROTO_MIN=register(4))  # fmt: skip
            return
        self._lookup(e.key, e.map, dreg=NFT_REG_1)
        # the port follows the address in the map's data: slot 1 (ip) or 4 (ip6)
        port = register(4 if v6 else 1)
        self._emit("nat", NAT_TYPE=NFT_NAT_DNAT, NAT_FAMILY=10 if v6 else 2,
                   NAT_REG_ADDR_MIN=NFT_REG_1, NAT_REG_PROTO_MIN=port)  # fmt: skip

    def _dnat(self, e: Dnat) -> None:
        self._immediate(NFT_REG_1, data=e.addr.packed)
        attrs = {"NAT_TYPE": NFT_NAT_DNAT, "NAT_FAMILY": 2 if e.addr.version == 4 else 10,
                 "NAT_REG_ADDR_MIN": NFT_REG_1}  # fmt: skip
        if e.port is not None:
            # nft puts the port in the next 128-bit register, not the next 32-bit one
            self._immediate(NFT_REG_1 + 1, data=struct.pack(">H", e.port))
            attrs["NAT_REG_PROTO_MIN"] = NFT_REG_1 + 1
            attrs["NAT_FLAGS"] = NF_NAT_RANGE_PROTO_SPECIFIED
        self._emit("nat", **attrs)

    def _immediate(self, reg: int, *, data: bytes = b"", verdict: Verdict | None = None) -> None:
        if verdict is None:
            self._emit("immediate", IMM_DREG=reg, IMM_DATA=data)
        elif verdict.chain is None:
            self._emit("immediate", IMM_DREG=reg, IMM_VERDICT=VERDICT_CODES[verdict.kind])
        else:
            code = VERDICT_CODES[verdict.kind]
            self._emit("immediate", IMM_DREG=reg, IMM_VERDICT=code, IMM_CHAIN=verdict.chain)

    def _mark_set(self, e: MarkSet) -> None:
        if e.op == "set":
            self._immediate(NFT_REG_1, data=struct.pack("=I", e.value))
        else:
            self._load(Field.META_MARK, 0)
            mask = 0xFFFFFFFF if e.op == "xor" else ~e.value & 0xFFFFFFFF
            self._bitwise(struct.pack("=I", mask), struct.pack("=I", e.value))
        self._emit("meta", META_KEY=NFT_META_MARK, META_SREG=NFT_REG_1)

    def _reject(self, e: Reject) -> None:
        kind, code = e.kind, e.code
        if kind is RejectKind.ICMP and self.table.family is Family.INET and code is None:
            kind = RejectKind.ICMPX  # nft's plain ``reject`` in an inet table
        if code is None:
            icmp = DEFAULT_REJECT_CODE.get(self.table.family, DEFAULT_REJECT_CODE[Family.IP])
            code = {RejectKind.ICMP: icmp, RejectKind.ICMPX: ICMPX_PORT_UNREACH}.get(kind, 0)
        self._emit("reject", REJECT_TYPE=REJECT_TYPES[kind], REJECT_CODE=_Wide(code, 8))

    def _set_update(self, e: SetUpdate) -> None:
        used = self._load_key(e.key)
        attrs: dict[str, int | str | _Wide] = {
            "DYNSET_SREG_KEY": register(0), "DYNSET_OP": NFT_DYNSET_OP_UPDATE,
            "DYNSET_SET_NAME": e.set,
        }  # fmt: skip
        if e.data:
            # the data in the next 128-bit register after the key, as nft places it
            start = -(-used // 4) * 4
            slot = start
            for sel in e.data:
                slot += self._load(sel, slot)
            attrs["DYNSET_SREG_DATA"] = register(start)
        if e.timeout is not None:
            attrs["DYNSET_TIMEOUT"] = _Wide(e.timeout * 1000, 64)
        self._emit("dynset", **attrs)

    def _expr(self, e: Expr) -> None:
        match e:
            case Cmp():
                self._cmp(e)
            case Lookup():
                self._lookup(e.key, e.set, flags=NFT_LOOKUP_F_INV if e.negate else 0)
            case VMap():
                self._lookup(e.key, e.map, dreg=NFT_REG_VERDICT)
            case InlineVMap():
                self._inline_vmap(e)
            case Counter():
                self._emit("counter")
            case MarkSet():
                self._mark_set(e)
            case Dnat():
                self._dnat(e)
            case DnatMap():
                self._dnat_map(e)
            case Masquerade():
                flags = NF_NAT_RANGE_PROTO_RANDOM_FULLY if e.fully_random else 0
                self._emit("masq", **({"MASQ_FLAGS": flags} if flags else {}))
            case Reject():
                self._reject(e)
            case SetUpdate():
                self._set_update(e)
            case Verdict():
                self._immediate(NFT_REG_VERDICT, verdict=e)
            case _:
                assert_never(e)


_ATTRS: dict[str, int] = {}


def _attr(key: str) -> int:
    """The libnftnl attribute number NFTNL_EXPR_<key> (looked up once)."""
    attr = _ATTRS.get(key)
    if attr is None:
        attr = _ATTRS[key] = getattr(lib, "NFTNL_EXPR_" + key)
    return attr


@dataclass(frozen=True, slots=True)
class _Wide:
    """An expression attribute that libnftnl stores as u8 or u64 rather than u32."""

    value: int
    bits: int


_ANON_MAP = SetFlag.ANONYMOUS | SetFlag.CONSTANT | SetFlag.MAP
