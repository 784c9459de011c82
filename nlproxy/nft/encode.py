"""Encode a transaction of ``nlproxy.nft.ir`` operations into one nfnetlink batch.

Sits between validation (``validate.py``, which has already checked every operation) and the
transport (``backend.py`` sends the bytes this module builds). Tables, chains, sets and rules go
through libnftnl objects (``native/`` shim, via cffi); elements, the hot path, are packed into one
bytes buffer per run of elements and turned into NEWSETELEM messages by a single C call. Rule
bodies are lowered exactly as nft 1.0.6 lowers the equivalent text (checked with
``nft --debug=netlink``), so ``nft list`` and the read-back decode what we program. It never sends
anything and never decides what to program.

Every message gets a sequence number; :meth:`Batch.locate` maps a sequence number (and the
extended-ack offset, for an element message) back to the operation behind it.
"""

from __future__ import annotations

import bisect
import enum
import struct
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import Any, assert_never

from nlproxy._nftshim import ffi, lib
from nlproxy.nft.ir import (
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
    Lookup,
    Map,
    MarkSet,
    Masquerade,
    Numgen,
    Op,
    Operation,
    Policy,
    Reject,
    RejectKind,
    Rule,
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
from nlproxy.nft.validate import selector_type

NFNL_SUBSYS_NFTABLES = 10
NLM_F_ACK = 0x4
NLM_F_REPLACE = 0x100
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
NLM_F_APPEND = 0x800
NFT_TABLE_F_OWNER = 0x2
NFT_TABLE_F_PERSIST = 0x4
NFT_SET_ELEM_INTERVAL_END = 0x1
NFT_DATA_VERDICT = 0xFFFFFF00
ELEM_MSG_BYTES = 60000
"""Element list bytes per NEWSETELEM message: the list is one attribute, whose length is 16 bits."""


class Msg(enum.IntEnum):
    """NFT_MSG_* (linux/netfilter/nf_tables.h)."""

    NEWTABLE = 0
    DELTABLE = 2
    NEWCHAIN = 3
    DELCHAIN = 5
    NEWRULE = 6
    DELRULE = 8
    NEWSET = 9
    DELSET = 11
    NEWSETELEM = 12
    DELSETELEM = 14
    DESTROYTABLE = 26
    DESTROYCHAIN = 27
    DESTROYRULE = 28
    DESTROYSET = 29
    DESTROYSETELEM = 30


_NEW_FLAGS = {Verb.ADD: NLM_F_CREATE, Verb.CREATE: NLM_F_CREATE | NLM_F_EXCL}
# nft's byte order for each type, stored in a set's userdata (0 invalid, 1 host, 2 big endian).
_BYTEORDER = {
    DataType.IPV4_ADDR: 2,
    DataType.IPV6_ADDR: 2,
    DataType.INET_SERVICE: 2,
    DataType.MARK: 1,
    DataType.INET_PROTO: 0,
    DataType.VERDICT: 0,
}
# NFTNL_UDATA_SET_*: what nft 1.0.6 writes for a set declared with ``type``.
_UD_KEYBYTEORDER, _UD_DATABYTEORDER, _UD_KEY_TYPEOF, _UD_DATA_TYPEOF = 0, 1, 3, 4
_UD_DATA_INTERVAL, _UD_SET_COMMENT = 6, 7
_UD_CONCAT = b"\x00\x04" + struct.pack("=I", 13) + b"\x01\x00"
_BSWAP = sys.byteorder == "little"


def udata_tlv(kind: int, payload: bytes) -> bytes:
    """One libnftnl userdata TLV: type byte, length byte, payload."""
    return bytes((kind, len(payload))) + payload


def comment_udata(comment: str) -> bytes:
    """A rule/chain/table comment as nft stores it: TLV type 0, NUL-terminated."""
    return udata_tlv(0, comment.encode() + b"\0")


def set_udata(s: SetLike) -> bytes:
    """A set's userdata as nft 1.0.6 writes it for ``type`` declarations."""
    single = len(s.key) == 1
    out = udata_tlv(_UD_KEYBYTEORDER, struct.pack("=I", _BYTEORDER[s.key[0]] if single else 0))
    if isinstance(s, Map):
        order = _BYTEORDER[s.data[0]] if len(s.data) == 1 else 0
        out += udata_tlv(_UD_DATABYTEORDER, struct.pack("=I", order))
    if not single:
        out += udata_tlv(_UD_KEY_TYPEOF, _UD_CONCAT)
    if isinstance(s, Map) and len(s.data) > 1:
        out += udata_tlv(_UD_DATA_TYPEOF, _UD_CONCAT)
    if isinstance(s, Map):
        out += udata_tlv(_UD_DATA_INTERVAL, struct.pack("=I", 0))
    if s.comment:
        out += udata_tlv(_UD_SET_COMMENT, s.comment.encode() + b"\0")
    return out


def concat_type(types: Sequence[DataType]) -> int:
    """nft's type id of a concatenation: each part's id shifted left 6 bits per later part."""
    t = 0
    for dt in types:
        t = (t << 6) | dt.type_id
    return t


def concat_len(types: Sequence[DataType]) -> int:
    """Key length: the part's own length alone, or the sum of 4-byte-padded parts."""
    if len(types) == 1:
        return types[0].length
    return sum((dt.length + 3) & ~3 for dt in types)


# ---------------------------------------------------------------------------------------------
# Packing values


def _bswap32(v: int) -> int:
    return int.from_bytes(v.to_bytes(4, "little"), "big")


def _ipv4_int(v: Value) -> int:
    if v.__class__ is IPv4Address:
        ip: int = v._ip  # type: ignore[attr-defined]  # int(v) minus a call: the hot path
        return ip
    return int(v.network_address) if isinstance(v, IPv4Network) else int(v)  # type: ignore[arg-type]


def _ipv6_bytes(v: Value) -> bytes:
    if isinstance(v, IPv6Network):
        return v.network_address.packed
    assert isinstance(v, IPv6Address)
    return v.packed


_PART: dict[DataType, tuple[str, str, Callable[[Any], Any]]] = {
    # datatype: (struct code alone, padding in a concatenation, converter)
    DataType.IPV4_ADDR: ("I", "", _ipv4_int),
    DataType.IPV6_ADDR: ("16s", "", _ipv6_bytes),
    DataType.INET_PROTO: ("B", "3x", int),
    DataType.INET_SERVICE: ("H", "2x", int),
    DataType.MARK: ("I", "", _bswap32 if _BSWAP else int),
}


class Packer:
    """Packs value tuples of one key or data layout into bytes, as the kernel expects them.

    Big-endian struct codes, with host-order marks byte-swapped first; parts of a concatenation
    padded to 4 bytes, a single part not padded.
    """

    def __init__(self, types: Sequence[DataType]) -> None:
        pad = len(types) > 1
        fmt = ">" + "".join(_PART[dt][0] + (_PART[dt][1] if pad else "") for dt in types)
        self.struct = struct.Struct(fmt)
        self.convs = [_PART[dt][2] for dt in types]
        self.size = self.struct.size

    def pack(self, values: Sequence[Value]) -> bytes:
        return self.struct.pack(*[c(v) for c, v in zip(self.convs, values, strict=True)])

    def pack_many(self, rows: Sequence[Sequence[Value]]) -> bytearray:
        buf = bytearray(self.size * len(rows))
        pack_into, convs, off = self.struct.pack_into, self.convs, 0
        if len(convs) == 1:
            c0 = convs[0]
            for row in rows:
                pack_into(buf, off, c0(row[0]))
                off += self.size
            return buf
        if len(convs) == 2:
            c0, c1 = convs
            for row in rows:
                pack_into(buf, off, c0(row[0]), c1(row[1]))
                off += self.size
            return buf
        if len(convs) == 3:
            c0, c1, c2 = convs
            for row in rows:
                pack_into(buf, off, c0(row[0]), c1(row[1]), c2(row[2]))
                off += self.size
            return buf
        for row in rows:
            pack_into(buf, off, *[c(v) for c, v in zip(convs, row, strict=True)])
            off += self.size
        return buf


def interval_bounds(dt: DataType, v: Value) -> tuple[Value, Value | None]:
    """First and one-past-last address of ``v`` (None past the end of the address space)."""
    if isinstance(v, IPv4Network | IPv6Network):
        first, last = v.network_address, v.broadcast_address
    elif isinstance(v, IPv4Address | IPv6Address):
        first = last = v
    else:
        return v, v + 1 if v < (1 << (8 * dt.length)) - 1 else None
    top = (1 << last.max_prefixlen) - 1
    return first, (last + 1) if int(last) < top else None


def interval_last(v: Value) -> Value:
    """Last value (inclusive) of ``v``: a network's broadcast address, else ``v``."""
    if isinstance(v, IPv4Network | IPv6Network):
        return v.broadcast_address
    return v


# ---------------------------------------------------------------------------------------------
# The batch


@dataclass(slots=True)
class _Span:
    """Messages ``first_seq .. first_seq + count - 1`` and the operations behind them."""

    first_seq: int
    count: int
    ops: Sequence[int]
    offsets: Any = None  # element runs: cdata uint32_t[] of each element's offset
    msg_index: Any = None  # element runs: cdata uint32_t[] of each element's message
    what: str = ""
    msg_off: int = -1  # single messages: offset in the batch
    expr_of: Sequence[int] = ()  # rules: the IR expression behind each netlink expression


class Batch:
    """One nfnetlink batch for ``table``: :meth:`add` operations, send what :meth:`finish` gives.

    Args:
        table: the table every object belongs to.
        sets: sets and maps the kernel already has (``Ruleset.sets``); sets added in the batch
            are learnt as they come. Elements need their set's key and data types.
        first_seq: sequence number of BATCH_BEGIN; messages follow it.
    """

    def __init__(self, table: Table, sets: Mapping[str, SetLike], first_seq: int) -> None:
        self.table = table
        self.family = table.family.nfproto
        self.tname = table.name.encode()
        self.sets: dict[str, SetLike] = dict(sets)
        self._buf = ffi.gc(lib.nls_buf_new(1 << 20), lib.nls_buf_free)
        self.first_seq = first_seq
        self._seq = first_seq + 1
        self._spans: list[_Span] = []
        self._keep: list[Any] = []
        self._anon_id = 0
        self._packers: dict[tuple[DataType, ...], Packer] = {}
        _check(lib.nls_put_batch_begin(self._buf, first_seq), "batch begin")

    @property
    def messages(self) -> int:
        """Messages in the batch, BATCH_BEGIN and BATCH_END not counted."""
        return sum(span.count for span in self._spans)

    @property
    def last_seq(self) -> int:
        return self._seq - 1

    def finish(self) -> memoryview:
        """Close the batch with BATCH_END and return its bytes (valid while the batch lives).

        The last message before BATCH_END asks for an ACK (NLM_F_ACK): a successful batch then
        gets exactly one answer, and the backend knows the kernel processed all of it.
        """
        if self._seq > self.first_seq + 1:
            _check(lib.nls_set_msg_flags(self._buf, self._seq - 1, NLM_F_ACK), "batch ack")
        _check(lib.nls_put_batch_end(self._buf, self._seq), "batch end")
        self._seq += 1
        return memoryview(ffi.buffer(self._buf.data, self._buf.len))

    def add(self, ops: Sequence[Operation]) -> None:
        """Encode ``ops`` in order; element operations between two other operations are grouped
        per set (see :func:`element_runs`) so they share bulk messages."""
        i = 0
        while i < len(ops):
            if not isinstance(ops[i].obj, Element):
                self._object(i, ops[i])
                i += 1
                continue
            j = i
            while j < len(ops) and isinstance(ops[j].obj, Element):
                j += 1
            for verb, indices in element_runs(ops, i, j):
                self._elements(verb, [ops[k].obj for k in indices], indices)  # type: ignore[misc]
            i = j

    def locate(self, seq: int, offset: int | None) -> tuple[int | None, str]:
        """The operation behind message ``seq`` (and, for elements, the error's ``offset``).

        Returns:
            (index of the operation in the transaction or None, extra description).
        """
        firsts = [s.first_seq for s in self._spans]
        k = bisect.bisect_right(firsts, seq) - 1
        if k < 0 or seq >= self._spans[k].first_seq + self._spans[k].count:
            return None, ""
        span = self._spans[k]
        if span.expr_of and offset is not None:
            n = _expr_at(ffi.buffer(self._buf.data, self._buf.len), span.msg_off, offset)
            if n is not None and n < len(span.expr_of):
                return span.ops[0], f"exprs[{span.expr_of[n]}]"
        if span.offsets is None or not span.ops:
            return (span.ops[0] if span.ops else None), span.what
        msg = seq - span.first_seq
        members = [i for i in range(len(span.ops)) if span.msg_index[i] == msg]
        if offset is not None:
            for i in reversed(members):
                if span.offsets[i] <= offset:
                    return span.ops[i], span.what
        return (span.ops[members[0]] if members else span.ops[0]), span.what

    # -- objects ----------------------------------------------------------------------------

    def _span(self, count: int, ops: Sequence[int], what: str = "", **kw: Any) -> int:
        first = self._seq
        self._spans.append(_Span(first, count, ops, what=what, **kw))
        self._seq += count
        return first

    def _put(
        self, kind: int, msg: Msg, flags: int, obj: Any, index: int, what: str = "", **kw: Any
    ) -> None:
        seq = self._span(1, [index], what, **kw)
        off = lib.nls_put_obj(self._buf, kind, msg, self.family, flags, seq, obj)
        _check(off, what)
        self._spans[-1].msg_off = off

    def _object(self, index: int, op: Operation) -> None:
        obj = op.obj
        if isinstance(obj, Table):
            self._table(index, op.verb, obj)
        elif isinstance(obj, Chain):
            self._chain(index, op.verb, obj)
        elif isinstance(obj, Set | Map):
            self._set(index, op.verb, obj)
        elif isinstance(obj, Rule):
            self._rule(index, op.verb, obj)

    def _table(self, index: int, verb: Verb, t: Table) -> None:
        if verb is Verb.FLUSH:
            self._flush_rules(index, None)
            return
        obj = ffi.gc(lib.nftnl_table_alloc(), lib.nftnl_table_free)
        lib.nftnl_table_set_str(obj, lib.NFTNL_TABLE_NAME, self.tname)
        lib.nftnl_table_set_u32(obj, lib.NFTNL_TABLE_FAMILY, self.family)
        if verb in _NEW_FLAGS:
            flags = (NFT_TABLE_F_OWNER if t.owner else 0) | (
                NFT_TABLE_F_PERSIST if t.persist else 0
            )
            lib.nftnl_table_set_u32(obj, lib.NFTNL_TABLE_FLAGS, flags)
            if t.comment:
                ud = comment_udata(t.comment)
                lib.nftnl_table_set_data(obj, lib.NFTNL_TABLE_USERDATA, ud, len(ud))
        msg = {Verb.DELETE: Msg.DELTABLE, Verb.DESTROY: Msg.DESTROYTABLE}.get(verb, Msg.NEWTABLE)
        self._put(lib.NLS_TABLE, msg, _NEW_FLAGS.get(verb, 0), obj, index)

    def _chain(self, index: int, verb: Verb, c: Chain) -> None:
        if verb is Verb.FLUSH:
            self._flush_rules(index, c.name)
            return
        obj = ffi.gc(lib.nftnl_chain_alloc(), lib.nftnl_chain_free)
        lib.nftnl_chain_set_str(obj, lib.NFTNL_CHAIN_TABLE, self.tname)
        lib.nftnl_chain_set_str(obj, lib.NFTNL_CHAIN_NAME, c.name.encode())
        lib.nftnl_chain_set_u32(obj, lib.NFTNL_CHAIN_FAMILY, self.family)
        if verb in _NEW_FLAGS:
            if c.hook is not None and c.type is not None:
                lib.nftnl_chain_set_u32(obj, lib.NFTNL_CHAIN_HOOKNUM, c.hook.number)
                lib.nftnl_chain_set_s32(obj, lib.NFTNL_CHAIN_PRIO, c.priority)
                lib.nftnl_chain_set_str(obj, lib.NFTNL_CHAIN_TYPE, c.type.value.encode())
                if c.policy is not None:
                    policy = 1 if c.policy is Policy.ACCEPT else 0  # NF_ACCEPT / NF_DROP
                    lib.nftnl_chain_set_u32(obj, lib.NFTNL_CHAIN_POLICY, policy)
            if c.comment:
                ud = comment_udata(c.comment)
                lib.nftnl_chain_set_data(obj, lib.NFTNL_CHAIN_USERDATA, ud, len(ud))
        msg = {Verb.DELETE: Msg.DELCHAIN, Verb.DESTROY: Msg.DESTROYCHAIN}.get(verb, Msg.NEWCHAIN)
        self._put(lib.NLS_CHAIN, msg, _NEW_FLAGS.get(verb, 0), obj, index)

    def _flush_rules(self, index: int, chain: str | None) -> None:
        """``flush chain`` / ``flush table``: DELRULE without a handle deletes every rule."""
        obj = ffi.gc(lib.nftnl_rule_alloc(), lib.nftnl_rule_free)
        lib.nftnl_rule_set_str(obj, lib.NFTNL_RULE_TABLE, self.tname)
        if chain is not None:
            lib.nftnl_rule_set_str(obj, lib.NFTNL_RULE_CHAIN, chain.encode())
        lib.nftnl_rule_set_u32(obj, lib.NFTNL_RULE_FAMILY, self.family)
        self._put(lib.NLS_RULE, Msg.DELRULE, 0, obj, index)

    def _set(self, index: int, verb: Verb, s: SetLike) -> None:
        if verb is Verb.FLUSH:
            self._flush_set(index, s.name)
            return
        if verb in _NEW_FLAGS:
            self.sets[s.name] = s
            obj = self._set_obj(s, s.name, 0)
            self._put(lib.NLS_SET, Msg.NEWSET, _NEW_FLAGS[verb], obj, index)
            return
        obj = ffi.gc(lib.nftnl_set_alloc(), lib.nftnl_set_free)
        lib.nftnl_set_set_str(obj, lib.NFTNL_SET_TABLE, self.tname)
        lib.nftnl_set_set_str(obj, lib.NFTNL_SET_NAME, s.name.encode())
        lib.nftnl_set_set_u32(obj, lib.NFTNL_SET_FAMILY, self.family)
        msg = Msg.DELSET if verb is Verb.DELETE else Msg.DESTROYSET
        self._put(lib.NLS_SET, msg, 0, obj, index)

    def _set_obj(
        self, s: SetLike, name: str, set_id: int, size: int = 0, key_type: int | None = None
    ) -> Any:
        obj = ffi.gc(lib.nftnl_set_alloc(), lib.nftnl_set_free)
        lib.nftnl_set_set_str(obj, lib.NFTNL_SET_TABLE, self.tname)
        lib.nftnl_set_set_str(obj, lib.NFTNL_SET_NAME, name.encode())
        lib.nftnl_set_set_u32(obj, lib.NFTNL_SET_FAMILY, self.family)
        flags = int(s.flags)
        if isinstance(s, Map):
            flags |= SetFlag.MAP
        if s.timeout is not None:
            flags |= SetFlag.TIMEOUT
        concat_interval = bool(flags & SetFlag.INTERVAL) and len(s.key) > 1
        if concat_interval:
            flags |= SetFlag.CONCAT
            lens = bytes(dt.length for dt in s.key)
            lib.nftnl_set_set_data(obj, lib.NFTNL_SET_DESC_CONCAT, lens, len(lens))
        lib.nftnl_set_set_u32(obj, lib.NFTNL_SET_FLAGS, flags)
        key_type = concat_type(s.key) if key_type is None else key_type
        lib.nftnl_set_set_u32(obj, lib.NFTNL_SET_KEY_TYPE, key_type)
        lib.nftnl_set_set_u32(obj, lib.NFTNL_SET_KEY_LEN, concat_len(s.key))
        if isinstance(s, Map):
            if s.is_vmap:
                lib.nftnl_set_set_u32(obj, lib.NFTNL_SET_DATA_TYPE, NFT_DATA_VERDICT)
            else:
                lib.nftnl_set_set_u32(obj, lib.NFTNL_SET_DATA_TYPE, concat_type(s.data))
                lib.nftnl_set_set_u32(obj, lib.NFTNL_SET_DATA_LEN, concat_len(s.data))
        if s.timeout is not None:
            lib.nftnl_set_set_u64(obj, lib.NFTNL_SET_TIMEOUT, s.timeout * 1000)
        lib.nftnl_set_set_u32(obj, lib.NFTNL_SET_ID, set_id or self._next_set_id())
        if size:
            lib.nftnl_set_set_u32(obj, lib.NFTNL_SET_DESC_SIZE, size)
        ud = set_udata(s)
        lib.nftnl_set_set_data(obj, lib.NFTNL_SET_USERDATA, ud, len(ud))
        return obj

    def _next_set_id(self) -> int:
        self._anon_id += 1
        return self._anon_id

    def _flush_set(self, index: int, name: str) -> None:
        e = ffi.new("struct nls_elems *")
        self._fill_header(e, Msg.DELSETELEM, 0, name, 0)
        seq = self._span(1, [index])
        _check(lib.nls_put_elems(self._buf, seq, e), f"set {name}")

    def _fill_header(self, e: Any, msg: Msg, flags: int, name: str, set_id: int) -> None:
        e.msg, e.family, e.flags = msg, self.family, flags
        tname, sname = ffi.new("char[]", self.tname), ffi.new("char[]", name.encode())
        self._keep += [tname, sname]
        e.table, e.set, e.set_id, e.max_bytes = tname, sname, set_id, ELEM_MSG_BYTES

    # -- rules ------------------------------------------------------------------------------

    def _rule(self, index: int, verb: Verb, r: Rule) -> None:
        obj = ffi.gc(lib.nftnl_rule_alloc(), lib.nftnl_rule_free)
        lib.nftnl_rule_set_str(obj, lib.NFTNL_RULE_TABLE, self.tname)
        lib.nftnl_rule_set_str(obj, lib.NFTNL_RULE_CHAIN, r.chain.encode())
        lib.nftnl_rule_set_u32(obj, lib.NFTNL_RULE_FAMILY, self.family)
        if r.handle is not None:
            lib.nftnl_rule_set_u64(obj, lib.NFTNL_RULE_HANDLE, r.handle)
        if verb in (Verb.DELETE, Verb.DESTROY):
            msg = Msg.DELRULE if verb is Verb.DELETE else Msg.DESTROYRULE
            self._put(lib.NLS_RULE, msg, 0, obj, index)
            return
        lowering = _RuleLowering(self.table, self.sets, self._anon_set(index))
        for expr in lowering.lower(r.exprs):
            lib.nftnl_rule_add_expr(obj, expr)
        if r.comment:
            ud = comment_udata(r.comment)
            lib.nftnl_rule_set_data(obj, lib.NFTNL_RULE_USERDATA, ud, len(ud))
        flags = {
            Verb.INSERT: NLM_F_CREATE,
            Verb.REPLACE: NLM_F_REPLACE,
        }.get(verb, NLM_F_CREATE | NLM_F_APPEND)
        self._put(lib.NLS_RULE, Msg.NEWRULE, flags, obj, index, expr_of=lowering.owner)

    def _anon_set(self, index: int) -> Callable[[Map, Sequence[Element], int], int]:
        """A callback for the lowering: create an anonymous map (``__map%d``), return its id."""

        def create(m: Map, elements: Sequence[Element], key_type: int) -> int:
            set_id = self._next_set_id()
            obj = self._set_obj(m, "__map%d", set_id, size=len(elements), key_type=key_type)
            flags = NLM_F_CREATE
            self._put(lib.NLS_SET, Msg.NEWSET, flags, obj, index, "anonymous map of the rule")
            self._elements(Verb.ADD, elements, [index] * len(elements), m, set_id)
            return set_id

        return create

    # -- elements ---------------------------------------------------------------------------

    def _packer(self, types: tuple[DataType, ...]) -> Packer:
        p = self._packers.get(types)
        if p is None:
            p = self._packers[types] = Packer(types)
        return p

    def _elements(
        self,
        verb: Verb,
        els: Sequence[Element],
        ops: Sequence[int],
        s: SetLike | None = None,
        set_id: int = 0,
    ) -> None:
        s = s or self.sets[els[0].set]
        if s.flags & SetFlag.INTERVAL:
            els, ops, key_ends, eflags = self._intervals(s, els, ops)
        else:
            key_ends, eflags = None, None
        e = ffi.new("struct nls_elems *")
        msg = {Verb.DELETE: Msg.DELSETELEM, Verb.DESTROY: Msg.DESTROYSETELEM}.get(
            verb, Msg.NEWSETELEM
        )
        name = "__map%d" if set_id else s.name
        self._fill_header(e, msg, _NEW_FLAGS.get(verb, 0), name, set_id)
        keys = self._packer(s.key).pack_many([el.key for el in els])
        e.count, e.key_len = len(els), len(keys) // max(len(els), 1)
        e.keys = self._hold(ffi.from_buffer("uint8_t[]", keys))
        if key_ends is not None:
            e.key_ends = self._hold(ffi.from_buffer("uint8_t[]", key_ends))
        if eflags is not None:
            e.elem_flags = self._hold(ffi.new("uint32_t[]", eflags))
        if msg is Msg.NEWSETELEM:
            self._element_payload(e, s, els)
        offsets = ffi.new("uint32_t[]", max(len(els), 1))
        msg_index = ffi.new("uint32_t[]", max(len(els), 1))
        e.offsets, e.msg_index = offsets, msg_index
        seq = self._seq
        count = lib.nls_put_elems(self._buf, seq, e)
        _check(count, f"elements of set {s.name}")
        what = "" if not set_id else "anonymous map of the rule"
        self._span(count, ops, what, offsets=offsets, msg_index=msg_index)

    def _hold(self, cdata: Any) -> Any:
        self._keep.append(cdata)
        return cdata

    def _element_payload(self, e: Any, s: SetLike, els: Sequence[Element]) -> None:
        """Data, verdicts, timeouts and comments of new elements, where any element has them."""
        if isinstance(s, Map) and s.is_vmap:
            codes, chains, names = [], [], {}
            for el in els:
                v = el.value
                if v is None:  # an interval's closing element
                    codes.append(0)
                    chains.append(ffi.NULL)
                    continue
                assert isinstance(v, Verdict)
                codes.append(VERDICT_CODES[v.kind])
                if v.chain is None:
                    chains.append(ffi.NULL)
                else:
                    if v.chain not in names:
                        names[v.chain] = self._hold(ffi.new("char[]", v.chain.encode()))
                    chains.append(names[v.chain])
            e.verdicts = self._hold(ffi.new("int32_t[]", codes))
            e.chains = self._hold(ffi.new("char *[]", chains))
        elif isinstance(s, Map):
            p = self._packer(s.data)
            zero = (0,) * len(s.data)
            rows = [el.value if isinstance(el.value, tuple) else _zero_row(s, zero) for el in els]
            data = p.pack_many(rows)
            e.data, e.data_len = self._hold(ffi.from_buffer("uint8_t[]", data)), p.size
        if any(el.timeout for el in els):
            e.timeouts_ms = self._hold(
                ffi.new("uint64_t[]", [(el.timeout or 0) * 1000 for el in els])
            )
        if any(el.comment for el in els):
            ptrs = [
                self._hold(ffi.new("char[]", el.comment.encode())) if el.comment else ffi.NULL
                for el in els
            ]
            e.comments = self._hold(ffi.new("char *[]", ptrs))

    def _intervals(
        self, s: SetLike, els: Sequence[Element], ops: Sequence[int]
    ) -> tuple[list[Element], list[int], bytes | None, list[int] | None]:
        """Interval keys as nft sends them.

        A single-part key becomes two kernel elements: the start, and one past the end flagged
        NFT_SET_ELEM_INTERVAL_END (left out when the range reaches the top of the address
        space). A concatenation keeps one element with NFTA_SET_ELEM_KEY_END, the inclusive end.
        """
        if len(s.key) > 1:
            ends = [tuple(interval_last(v) for v in el.key) for el in els]
            return list(els), list(ops), bytes(self._packer(s.key).pack_many(ends)), None
        out: list[Element] = []
        out_ops: list[int] = []
        flags: list[int] = []
        for el, op in zip(els, ops, strict=True):
            first, after = interval_bounds(s.key[0], el.key[0])
            out.append(
                Element(
                    set=el.set, key=(first,), value=el.value, timeout=el.timeout, comment=el.comment
                )
            )
            out_ops.append(op)
            flags.append(0)
            if after is not None:
                out.append(Element(set=el.set, key=(after,)))
                out_ops.append(op)
                flags.append(NFT_SET_ELEM_INTERVAL_END)
        return out, out_ops, None, flags


def _zero_row(s: SetLike, zero: tuple[int, ...]) -> tuple[Value, ...]:
    """Placeholder data for an interval's closing element (the C side does not send it)."""
    assert isinstance(s, Map)
    return (
        tuple(
            IPv4Address(0)
            if dt is DataType.IPV4_ADDR
            else IPv6Address(0)
            if dt is DataType.IPV6_ADDR
            else 0
            for dt in s.data
        )
        or zero
    )


def element_runs(ops: Sequence[Operation], start: int, stop: int) -> list[tuple[Verb, list[int]]]:
    """Group the element operations ``ops[start:stop]`` into runs that can share messages.

    A run is one set and one verb. Operations on different sets are independent, so a run
    collects its set's operations from the whole stretch; a set's run ends where its verb
    changes (delete then add of the same key must stay in that order). Runs come out in the
    order of their first operation.
    """
    runs: list[tuple[Verb, list[int]]] = []
    current: dict[str, tuple[Verb, list[int]]] = {}
    for k in range(start, stop):
        op = ops[k]
        assert isinstance(op.obj, Element)
        run = current.get(op.obj.set)
        if run is None or run[0] is not op.verb:
            run = current[op.obj.set] = (op.verb, [])
            runs.append(run)
        run[1].append(k)
    return runs


def _expr_at(buf: Any, msg_off: int, offset: int) -> int | None:
    """Which netlink expression of the NEWRULE message at ``msg_off`` holds byte ``offset``
    (counted from the message's start, as extended acks count)."""
    off = 16 + 4  # nlmsghdr, nfgenmsg
    (length,) = struct.unpack_from("=I", buf, msg_off)
    while off + 4 <= length:
        alen, kind = struct.unpack_from("=HH", buf, msg_off + off)
        if alen < 4:
            return None
        if kind & 0x3FFF == 4:  # NFTA_RULE_EXPRESSIONS
            inner, n = off + 4, 0
            while inner + 4 <= off + alen:
                elen = struct.unpack_from("=H", buf, msg_off + inner)[0]
                if elen < 4:
                    return None
                if inner <= offset < inner + elen:
                    return n
                inner += (elen + 3) & ~3
                n += 1
            return None
        off += (alen + 3) & ~3
    return None


def _check(rc: int, what: str) -> None:
    if rc < 0:
        raise MemoryError(f"encoding {what} failed: errno {-rc}")


# ---------------------------------------------------------------------------------------------
# Rule bodies: each IR expression lowered to the netlink expressions nft 1.0.6 emits for it.

VERDICT_CODES = {
    VerdictKind.DROP: 0,  # NF_DROP
    VerdictKind.ACCEPT: 1,  # NF_ACCEPT
    VerdictKind.CONTINUE: -1,  # NFT_CONTINUE
    VerdictKind.JUMP: -3,  # NFT_JUMP
    VerdictKind.GOTO: -4,  # NFT_GOTO
    VerdictKind.RETURN: -5,  # NFT_RETURN
}
NFT_REG_VERDICT, NFT_REG_1, NFT_REG32_00 = 0, 1, 8
_CMP_OPS = {Op.EQ: 0, Op.NE: 1, Op.LT: 2, Op.LE: 3, Op.GT: 4, Op.GE: 5}
_NETWORK, _TRANSPORT = 1, 2  # NFT_PAYLOAD_*_HEADER
_FIB_F_SADDR, _FIB_F_DADDR, _FIB_RESULT_ADDRTYPE = 1, 2, 3
_NF_NAT_RANGE_PROTO_SPECIFIED, _NF_NAT_RANGE_PROTO_RANDOM_FULLY = 0x2, 0x10
_NFT_NAT_DNAT, _NFT_DYNSET_OP_UPDATE, _NFT_LOOKUP_F_INV, _NFT_NG_RANDOM = 1, 1, 1, 1
_REJECT_TYPE = {RejectKind.ICMP: 0, RejectKind.TCP_RESET: 1, RejectKind.ICMPX: 2}
_BITMASK = frozenset({Field.CT_STATE, Field.CT_STATUS})
# Field: (expression, base or key, offset, length)
_LOAD: dict[Field, tuple[str, int, int, int]] = {
    Field.IP_SADDR: ("payload", _NETWORK, 12, 4),
    Field.IP_DADDR: ("payload", _NETWORK, 16, 4),
    Field.IP6_SADDR: ("payload", _NETWORK, 8, 16),
    Field.IP6_DADDR: ("payload", _NETWORK, 24, 16),
    Field.TH_SPORT: ("payload", _TRANSPORT, 0, 2),
    Field.TH_DPORT: ("payload", _TRANSPORT, 2, 2),
    Field.META_L4PROTO: ("meta", 16, 0, 1),  # NFT_META_L4PROTO
    Field.META_MARK: ("meta", 3, 0, 4),  # NFT_META_MARK
    Field.META_NFPROTO: ("meta", 15, 0, 1),  # NFT_META_NFPROTO
    Field.CT_STATE: ("ct", 0, 0, 4),  # NFT_CT_STATE
    Field.CT_STATUS: ("ct", 2, 0, 4),  # NFT_CT_STATUS
    Field.FIB_DADDR_TYPE: ("fib", _FIB_F_DADDR, 0, 4),
    Field.FIB_SADDR_TYPE: ("fib", _FIB_F_SADDR, 0, 4),
}


def register(slot: int) -> int:
    """nft's register number for 32-bit slot ``slot``: a 128-bit NFT_REG_n when aligned."""
    return NFT_REG_1 + slot // 4 if slot % 4 == 0 else NFT_REG32_00 + slot


def selector_len(sel: Selector) -> int:
    return 4 if isinstance(sel, Numgen) else _LOAD[sel][3]


_FIELD_PACKERS: dict[DataType, Packer] = {}


def field_bytes(f: Field, v: Value) -> bytes:
    """A comparison operand as the kernel holds the field: network order, or host order."""
    dt = f.datatype
    if dt is not None:
        packer = _FIELD_PACKERS.get(dt)
        if packer is None:
            packer = _FIELD_PACKERS[dt] = Packer((dt,))
        return packer.pack((v,))
    assert isinstance(v, int)
    return struct.pack("=B" if f is Field.META_NFPROTO else "=I", v)


def _nfproto_of(f: Field) -> int | None:
    if f.text.startswith("ip "):
        return 2
    return 10 if f.text.startswith("ip6 ") else None


def _fields(e: Expr) -> list[Field]:
    match e:
        case Cmp():
            return [e.left]
        case Lookup() | VMap() | InlineVMap() | DnatMap() | SetUpdate():
            return [sel for sel in e.key if isinstance(sel, Field)]
        case _:
            return []


class _RuleLowering:
    """Lowers one rule's expressions into libnftnl expression objects, in order."""

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
            self._emit("numgen", NG_DREG=reg, NG_MODULUS=sel.modulus, NG_TYPE=_NFT_NG_RANDOM)
            return 1
        kind, a, b, n = _LOAD[sel]
        if kind == "payload":
            self._emit("payload", PAYLOAD_DREG=reg, PAYLOAD_BASE=a, PAYLOAD_OFFSET=b,
                       PAYLOAD_LEN=length or n)  # fmt: skip
        elif kind == "meta":
            self._emit("meta", META_KEY=a, META_DREG=reg)
        elif kind == "ct":
            self._emit("ct", CT_KEY=a, CT_DREG=reg)
        else:
            self._emit("fib", FIB_FLAGS=a, FIB_RESULT=_FIB_RESULT_ADDRTYPE, FIB_DREG=reg)
        return (n + 3) // 4

    def _load_key(self, key: Sequence[Selector]) -> int:
        """Load a key, part after part in consecutive 32-bit registers; returns slots used."""
        slot = 0
        for sel in key:
            slot += self._load(sel, slot)
        return slot

    def _cmp_reg(self, op: Op, slot: int, data: bytes) -> None:
        self._emit("cmp", CMP_SREG=register(slot), CMP_OP=_CMP_OPS[op], CMP_DATA=data)

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
        elif c.left in _BITMASK:
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
        # nft types a numgen key part as "integer" (type 4), not mark
        ids = [
            _TYPE_INTEGER if isinstance(sel, Numgen) else t.type_id
            for sel, t in zip(e.key, types, strict=True)
        ]
        key_type = 0
        for type_id in ids:
            key_type = (key_type << 6) | type_id
        set_id = self.anon(m, els, key_type)
        self._lookup(e.key, m.name, dreg=NFT_REG_VERDICT, set_id=set_id)

    def _dnat_map(self, e: DnatMap) -> None:
        m = self.sets[e.map]
        assert isinstance(m, Map)
        v6 = m.data[0] is DataType.IPV6_ADDR
        self._lookup(e.key, e.map, dreg=NFT_REG_1)
        # the port follows the address in the map's data: slot 1 (ip) or 4 (ip6)
        port = register(4 if v6 else 1)
        self._emit("nat", NAT_TYPE=_NFT_NAT_DNAT, NAT_FAMILY=10 if v6 else 2,
                   NAT_REG_ADDR_MIN=NFT_REG_1, NAT_REG_PROTO_MIN=port)  # fmt: skip

    def _dnat(self, e: Dnat) -> None:
        self._immediate(NFT_REG_1, data=e.addr.packed)
        attrs = {"NAT_TYPE": _NFT_NAT_DNAT, "NAT_FAMILY": 2 if e.addr.version == 4 else 10,
                 "NAT_REG_ADDR_MIN": NFT_REG_1}  # fmt: skip
        if e.port is not None:
            # nft puts the port in the next 128-bit register, not the next 32-bit one
            self._immediate(NFT_REG_1 + 1, data=struct.pack(">H", e.port))
            attrs["NAT_REG_PROTO_MIN"] = NFT_REG_1 + 1
            attrs["NAT_FLAGS"] = _NF_NAT_RANGE_PROTO_SPECIFIED
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
        self._emit("meta", META_KEY=3, META_SREG=NFT_REG_1)  # NFT_META_MARK

    def _reject(self, e: Reject) -> None:
        kind, code = e.kind, e.code
        if kind is RejectKind.ICMP and self.table.family is Family.INET and code is None:
            kind = RejectKind.ICMPX  # nft's plain ``reject`` in an inet table
        if code is None:
            v6 = self.table.family is Family.IP6
            code = {RejectKind.ICMP: 4 if v6 else 3, RejectKind.ICMPX: 1}.get(kind, 0)
        self._emit("reject", REJECT_TYPE=_REJECT_TYPE[kind], REJECT_CODE=_Wide(code, 8))

    def _set_update(self, e: SetUpdate) -> None:
        self._load_key(e.key)
        attrs: dict[str, int | str | _Wide] = {
            "DYNSET_SREG_KEY": register(0), "DYNSET_OP": _NFT_DYNSET_OP_UPDATE,
            "DYNSET_SET_NAME": e.set,
        }  # fmt: skip
        if e.timeout is not None:
            attrs["DYNSET_TIMEOUT"] = _Wide(e.timeout * 1000, 64)
        self._emit("dynset", **attrs)

    def _expr(self, e: Expr) -> None:
        match e:
            case Cmp():
                self._cmp(e)
            case Lookup():
                self._lookup(e.key, e.set, flags=_NFT_LOOKUP_F_INV if e.negate else 0)
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
                flags = _NF_NAT_RANGE_PROTO_RANDOM_FULLY if e.fully_random else 0
                self._emit("masq", **({"MASQ_FLAGS": flags} if flags else {}))
            case Reject():
                self._reject(e)
            case SetUpdate():
                self._set_update(e)
            case Verdict():
                self._immediate(NFT_REG_VERDICT, verdict=e)
            case _:
                assert_never(e)


_TYPE_INTEGER = 4  # nft's TYPE_INTEGER
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
