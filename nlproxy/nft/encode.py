"""Encode a transaction of ``nlproxy.nft.ir`` operations into one nfnetlink batch.

Sits between validation (``validate.py``, which has already checked every operation) and the
transport (``backend.py`` sends the bytes this module builds). Tables, chains, sets and rules go
through libnftnl objects (``native/`` shim, via cffi); elements, the hot path, are packed into one
bytes buffer per run of elements and turned into NEWSETELEM messages by a single C call. Helpers
below it: ``lower.py`` lowers rule bodies as nft 1.0.6 does, ``values.py`` packs keys and data,
``elements.py`` groups element runs and expands intervals, ``udata.py`` writes userdata. It never
sends anything and never decides what to program.

Every message gets a sequence number; :meth:`Batch.locate` maps a sequence number (and the
extended-ack offset, for an element message) back to the operation behind it.
"""

from __future__ import annotations

import bisect
import enum
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nlproxy._nftshim import ffi, lib
from nlproxy.netlink.codec import (
    NFGENMSG,
    NLM_F_ACK,
    NLM_F_APPEND,
    NLM_F_CREATE,
    NLM_F_EXCL,
    NLM_F_REPLACE,
    NLMSGHDR,
    spans,
)
from nlproxy.nft import uapi
from nlproxy.nft.elements import element_runs, interval_elements, zero_row
from nlproxy.nft.ir import (
    Chain,
    DataType,
    Element,
    Map,
    Operation,
    PackedRun,
    Policy,
    Rule,
    Set,
    SetFlag,
    SetLike,
    Table,
    Verb,
    Verdict,
)
from nlproxy.nft.lower import RuleLowering, register
from nlproxy.nft.uapi import (
    NFNL_SUBSYS_NFTABLES,
    NFT_TABLE_F_OWNER,
    NFT_TABLE_F_PERSIST,
    NFTA_RULE_EXPRESSIONS,
)
from nlproxy.nft.udata import comment_udata, set_udata
from nlproxy.nft.values import (
    NFT_DATA_VERDICT,
    VERDICT_CODES,
    Packer,
    concat_len,
    concat_type,
    interval_bounds,
)

__all__ = [
    "ELEM_MSG_BYTES",
    "NFNL_SUBSYS_NFTABLES",
    "Batch",
    "Msg",
    "Packer",
    "concat_len",
    "concat_type",
    "element_runs",
    "interval_bounds",
    "register",
    "set_udata",
]
"""Also re-exported from the helper modules, where callers have always imported them."""

ELEM_MSG_BYTES = 60000
"""Element list bytes per NEWSETELEM message: the list is one attribute, whose length is 16 bits."""


class Msg(enum.IntEnum):
    """The NFT_MSG_* types the encoder sends (numbers: ``uapi.py``)."""

    NEWTABLE = uapi.NFT_MSG_NEWTABLE
    DELTABLE = uapi.NFT_MSG_DELTABLE
    NEWCHAIN = uapi.NFT_MSG_NEWCHAIN
    DELCHAIN = uapi.NFT_MSG_DELCHAIN
    NEWRULE = uapi.NFT_MSG_NEWRULE
    DELRULE = uapi.NFT_MSG_DELRULE
    NEWSET = uapi.NFT_MSG_NEWSET
    DELSET = uapi.NFT_MSG_DELSET
    NEWSETELEM = uapi.NFT_MSG_NEWSETELEM
    DELSETELEM = uapi.NFT_MSG_DELSETELEM
    DESTROYTABLE = uapi.NFT_MSG_DESTROYTABLE
    DESTROYCHAIN = uapi.NFT_MSG_DESTROYCHAIN
    DESTROYRULE = uapi.NFT_MSG_DESTROYRULE
    DESTROYSET = uapi.NFT_MSG_DESTROYSET
    DESTROYSETELEM = uapi.NFT_MSG_DESTROYSETELEM


_NEW_FLAGS = {Verb.ADD: NLM_F_CREATE, Verb.CREATE: NLM_F_CREATE | NLM_F_EXCL}


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
    packed: PackedRun | None = None  # a packed run: names the element an error points at


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
            obj = ops[i].obj
            if isinstance(obj, PackedRun):
                self._packed(ops[i].verb, obj, i)
                i += 1
                continue
            if not isinstance(obj, Element):
                self._object(i, ops[i])
                i += 1
                continue
            j = i
            while j < len(ops) and ops[j].obj.__class__ is Element:
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
        i = self._member(span, seq, offset)
        return span.ops[i], span.what

    def refused_element(self, seq: int, offset: int | None) -> tuple[PackedRun, int] | None:
        """When message ``seq`` carries a packed run: the run and the position in it of the
        element the error's ``offset`` points at (the first of the message without one)."""
        firsts = [s.first_seq for s in self._spans]
        k = bisect.bisect_right(firsts, seq) - 1
        if k < 0 or seq >= self._spans[k].first_seq + self._spans[k].count:
            return None
        span = self._spans[k]
        if span.packed is None or not span.ops:
            return None
        return span.packed, self._member(span, seq, offset)

    @staticmethod
    def _member(span: _Span, seq: int, offset: int | None) -> int:
        """The element of an element span that message ``seq``'s error ``offset`` points at."""
        msg = seq - span.first_seq
        members = [i for i in range(len(span.ops)) if span.msg_index[i] == msg]
        if offset is not None:
            for i in reversed(members):
                if span.offsets[i] <= offset:
                    return i
        return members[0] if members else 0

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
        if isinstance(s, Set) and s.counter:  # NFTA_SET_EXPR, a template the kernel clones
            lib.nftnl_set_add_expr(obj, lib.nftnl_expr_alloc(b"counter"))  # the set owns it
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
        lowering = RuleLowering(self.table, self.sets, self._anon_set(index))
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
            els, ops, key_ends, eflags = interval_elements(s, els, ops, self._packer(s.key))
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

    def _packed(self, verb: Verb, run: PackedRun, index: int) -> None:
        """A packed run: its keys and data are joined into the buffers the C side reads, as
        :meth:`_elements` packs them from values (the same messages, byte for byte)."""
        if not run.keys:
            return
        s = self.sets[run.set]
        e = ffi.new("struct nls_elems *")
        msg = {Verb.DELETE: Msg.DELSETELEM, Verb.DESTROY: Msg.DESTROYSETELEM}.get(
            verb, Msg.NEWSETELEM
        )
        self._fill_header(e, msg, _NEW_FLAGS.get(verb, 0), s.name, 0)
        count = len(run.keys)
        keys = b"".join(run.keys)
        e.count, e.key_len = count, len(keys) // count
        e.keys = self._hold(ffi.from_buffer("uint8_t[]", keys))
        if msg is Msg.NEWSETELEM and isinstance(s, Map):
            assert run.data is not None, "an add to a packed map carries data"
            data = b"".join(run.data)
            e.data, e.data_len = self._hold(ffi.from_buffer("uint8_t[]", data)), len(data) // count
        offsets = ffi.new("uint32_t[]", count)
        msg_index = ffi.new("uint32_t[]", count)
        e.offsets, e.msg_index = offsets, msg_index
        n = lib.nls_put_elems(self._buf, self._seq, e)
        _check(n, f"elements of set {s.name}")
        self._span(n, _Repeat(index, count), offsets=offsets, msg_index=msg_index, packed=run)

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
            rows = [el.value if isinstance(el.value, tuple) else zero_row(s, zero) for el in els]
            data = p.pack_many(rows)
            e.data, e.data_len = self._hold(ffi.from_buffer("uint8_t[]", data)), p.size
        if any(el.timeout for el in els):
            e.timeouts_ms = self._hold(
                ffi.new("uint64_t[]", [(el.timeout or 0) * 1000 for el in els])
            )
        if any(el.comment for el in els):
            # One buffer of NUL-terminated comments and a pointer into it per element (a
            # dispatch map has one per service port: one allocation, not one each).
            texts = [el.comment.encode() for el in els]
            blob = self._hold(ffi.new("char[]", b"\0".join(texts) + b"\0"))
            ptrs, at = [], 0
            for text in texts:
                ptrs.append(blob + at if text else ffi.NULL)
                at += len(text) + 1
            e.comments = self._hold(ffi.new("char *[]", ptrs))


class _Repeat(Sequence[int]):
    """One operation index ``n`` times: the operation behind every element of a packed run (a
    list of them would be an entry per element)."""

    __slots__ = ("_n", "_op")

    def __init__(self, op: int, n: int) -> None:
        self._op, self._n = op, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._op] * len(range(*i.indices(self._n)))
        if not -self._n <= i < self._n:
            raise IndexError(i)
        return self._op


def _expr_at(buf: Any, msg_off: int, offset: int) -> int | None:
    """Which netlink expression of the NEWRULE message at ``msg_off`` holds byte ``offset``
    (counted from the message's start, as extended acks count)."""
    (length,) = struct.unpack_from("=I", buf, msg_off)
    at, attrs = msg_off + offset, msg_off + NLMSGHDR.size + NFGENMSG.size
    for kind, start, stop in spans(buf, attrs, msg_off + length):
        if kind == NFTA_RULE_EXPRESSIONS:
            for n, (_, lo, hi) in enumerate(spans(buf, start, stop)):
                if lo - 4 <= at < hi:  # the expression's header included
                    return n
            return None
    return None


def _check(rc: int, what: str) -> None:
    if rc < 0:
        raise MemoryError(f"encoding {what} failed: errno {-rc}")
