"""Read one nftables table back from the kernel into the IR (:class:`Ruleset`).

Where it sits: the reconciler seeds its cache of what is programmed from here at start-up and on
every full verification, and ``nlproxy rules`` prints what it returns. It dumps the table, its
chains, sets, elements and rules over a NETLINK_NETFILTER socket with libnftnl (the ``_nftshim``
cffi module) building the requests and parsing the replies; ``decode.py`` turns the parsed
expressions and bytes into IR values. It only reads: it never changes the kernel, and never reads
tables other than the one asked for.

A rule the IR cannot express comes back as an :class:`UndecodedRule` (handle, comment and
libnftnl's text of its expressions), which never compares equal to a planned rule.
"""

from __future__ import annotations

import functools
import struct
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from nlproxy.errors import NlproxyError
from nlproxy.nft import decode
from nlproxy.nft.decode import RawExpr, SetInfo, UndecodableError, UndecodedRule
from nlproxy.nft.ir import (
    Chain,
    ChainType,
    DataType,
    Element,
    Family,
    Hook,
    Map,
    Policy,
    Rule,
    Ruleset,
    Set,
    SetFlag,
    SetLike,
    Table,
    Value,
    Verdict,
)
from nlproxy.nft.nlsock import NLM_F_DUMP, Message, NetfilterSocket

# linux/netfilter/nf_tables.h: enum nf_tables_msg_types
NFT_MSG_GETTABLE = 1
NFT_MSG_GETCHAIN = 4
NFT_MSG_GETRULE = 7
NFT_MSG_GETSET = 10
NFT_MSG_GETSETELEM = 13
NFT_MSG_GETGEN = 16
NFT_TABLE_F_OWNER = 0x2
NFT_TABLE_F_PERSIST = 0x4
NFT_SET_ELEM_INTERVAL_END = 0x1
NLM_F_ACK = 0x4
NLM_F_DUMP_INTR = 0x10
ENOENT = 2
_RETRIES = 5
_HDR = struct.Struct("=IHHII")
_DERIVED_FLAGS = SetFlag.MAP | SetFlag.CONCAT
"""Set flags implied by the IR type (Map) and key (interval + concatenation): not kept."""


class ReadbackError(NlproxyError):
    """The kernel's answer to a dump could not be read."""


@functools.cache
def _lib() -> tuple[Any, Any]:
    """The cffi module, imported on first use (importing nlproxy.nft must not need it)."""
    from nlproxy._nftshim import ffi, lib

    return ffi, lib


def read_ruleset(
    family: Family, name: str, *, netns: str | None = None, sock: NetfilterSocket | None = None
) -> Ruleset | None:
    """Dump table ``family name`` with everything in it.

    Retries from the start when the ruleset changed during the dumps (generation id moved or
    the kernel flagged a dump as interrupted), so the result is one consistent snapshot.
    Blocking (about 1.5 s for 100k map elements): call it through ``trio.to_thread.run_sync``
    from async code.

    Args:
        family: the table's family.
        name: the table's name.
        netns: network namespace to open a socket in, when ``sock`` is not given.
        sock: an open socket to use (left open).

    Returns:
        The table's contents, or None if the table does not exist.

    Raises:
        ReadbackError: the dumps kept being interrupted, or the kernel refused one.
        UndecodableError: a set whose type or elements the IR cannot express.
    """
    own = sock is None
    s = NetfilterSocket(netns) if sock is None else sock
    try:
        for _ in range(_RETRIES):
            try:
                gen = _generation(s)
                rs = _read_once(s, family, name)
                if _generation(s) == gen:
                    return rs
            except _Interrupted:
                continue
        raise ReadbackError(f"table {family} {name}", "ruleset kept changing during the dump")
    finally:
        if own:
            s.close()


class _Interrupted(Exception):
    """A dump reply carried NLM_F_DUMP_INTR: start again."""


def _read_once(s: NetfilterSocket, family: Family, name: str) -> Ruleset | None:
    table = _read_table(s, family, name)
    if table is None:
        return None
    rs = Ruleset(table=table)
    for chain in _dump(s, NFT_MSG_GETCHAIN, family, name, _parse_chain):
        rs.add_chain(chain)
    infos: dict[str, SetInfo] = {}
    for raw in list(_dump(s, NFT_MSG_GETSET, family, name, _parse_set)):
        elements = _read_elements(s, family, name, raw)
        infos[raw.name] = raw.info(elements)
        if not raw.anonymous:
            rs.add_set(raw.ir)
            for el in elements:
                rs.add_element(el)
    parse_rule = functools.partial(_parse_rule, infos=infos)
    for rule in _dump(s, NFT_MSG_GETRULE, family, name, parse_rule):
        rs.rules.setdefault(rule.chain, []).append(rule)
    return rs


# ---------------------------------------------------------------------------------------------
# Requests and dumps


def _request(msg: int, family: Family, flags: int, seq: int, build: Callable[[Any], None]) -> bytes:
    ffi, lib = _lib()
    buf = ffi.new("char[]", 4096)
    nlh = lib.nftnl_nlmsg_build_hdr(buf, msg, family.nfproto, flags, seq)
    build(nlh)
    return bytes(ffi.buffer(buf, nlh.nlmsg_len))


def _nlh(msg: Message) -> Any:
    """A parseable ``struct nlmsghdr *`` for a received message (nlsock strips the header)."""
    ffi, _ = _lib()
    data = _HDR.pack(_HDR.size + len(msg.payload), msg.type, msg.flags, msg.seq, 0) + msg.payload
    return ffi.from_buffer("struct nlmsghdr *", data)


def _messages(s: NetfilterSocket, request: bytes, seq: int) -> Iterator[Message]:
    for msg in s.dump(request, seq):
        if msg.flags & NLM_F_DUMP_INTR:
            # The rest of this dump carries its sequence number; the retry's dumps skip it.
            raise _Interrupted
        yield msg


def _generation(s: NetfilterSocket) -> int:
    _, lib = _lib()
    seq = s.next_seq()
    req = _request(NFT_MSG_GETGEN, Family.INET, NLM_F_ACK, seq, lambda nlh: None)
    for msg in s.dump(req, seq):
        with _parsed("gen", _nlh(msg)) as gen:
            return int(lib.nftnl_gen_get_u32(gen, lib.NFTNL_GEN_ID))
    raise ReadbackError("generation", "the kernel sent no generation id")


def _read_table(s: NetfilterSocket, family: Family, name: str) -> Table | None:
    _, lib = _lib()
    seq = s.next_seq()

    def build(nlh: Any) -> None:
        t = lib.nftnl_table_alloc()
        lib.nftnl_table_set_str(t, lib.NFTNL_TABLE_NAME, name.encode())
        lib.nftnl_table_nlmsg_build_payload(nlh, t)
        lib.nftnl_table_free(t)

    req = _request(NFT_MSG_GETTABLE, family, NLM_F_ACK, seq, build)
    try:
        msgs = list(_messages(s, req, seq))
    except OSError as exc:
        if exc.errno == ENOENT:
            return None
        raise ReadbackError(f"table {family} {name}", exc.strerror or str(exc)) from exc
    for msg in msgs:
        with _parsed("table", _nlh(msg)) as t:
            flags = lib.nftnl_table_get_u32(t, lib.NFTNL_TABLE_FLAGS)
            comment = _comment(_get_bytes(lib.nftnl_table_get_data, t, lib.NFTNL_TABLE_USERDATA))
            return Table(
                family=family,
                name=name,
                owner=bool(flags & NFT_TABLE_F_OWNER),
                persist=bool(flags & NFT_TABLE_F_PERSIST),
                comment=comment,
            )
    return None


_DUMP_KINDS = {NFT_MSG_GETCHAIN: "chain", NFT_MSG_GETSET: "set", NFT_MSG_GETRULE: "rule"}


def _dump(
    s: NetfilterSocket,
    msg_type: int,
    family: Family,
    table: str,
    parse: Callable[[Any, Family], Any],
) -> Iterator[Any]:
    """Dump one kind of object of ``table``, yielding what ``parse(nlh, family)`` gives for each.

    ``parse`` returns (table name, object): the kernel ignores the table filter of chain dumps
    (nf_tables_dump_chains), so objects of other tables are dropped here.
    """
    _, lib = _lib()
    seq = s.next_seq()
    kind = _DUMP_KINDS[msg_type]
    alloc, free = getattr(lib, f"nftnl_{kind}_alloc"), getattr(lib, f"nftnl_{kind}_free")
    set_str = getattr(lib, f"nftnl_{kind}_set_str")
    build = getattr(lib, f"nftnl_{kind}_nlmsg_build_payload")
    attr = getattr(lib, f"NFTNL_{kind.upper()}_TABLE")

    def payload(nlh: Any) -> None:
        obj = alloc()
        set_str(obj, attr, table.encode())
        build(nlh, obj)
        free(obj)

    req = _request(msg_type, family, NLM_F_DUMP, seq, payload)
    for msg in _messages(s, req, seq):
        owner, obj = parse(_nlh(msg), family)
        if owner == table:
            yield obj


@contextmanager
def _parsed(kind: str, nlh: Any, parse: str = "nlmsg_parse") -> Iterator[Any]:
    """A libnftnl ``kind`` object (table, chain, set, rule, gen) parsed from ``nlh``, freed when
    the block ends."""
    _, lib = _lib()
    obj = getattr(lib, f"nftnl_{kind}_alloc")()
    try:
        if getattr(lib, f"nftnl_{kind}_{parse}")(nlh, obj) < 0:
            raise ReadbackError(kind, "cannot parse the kernel's answer")
        yield obj
    finally:
        getattr(lib, f"nftnl_{kind}_free")(obj)


def _iterate(create: Any, next_: Any, destroy: Any, obj: Any) -> list[Any]:
    """All items of a libnftnl iterator (they live as long as ``obj``)."""
    ffi, _ = _lib()
    it = create(obj)
    items = []
    try:
        item = next_(it)
        while item != ffi.NULL:
            items.append(item)
            item = next_(it)
    finally:
        destroy(it)
    return items


def _get_bytes(getter: Any, obj: Any, attr: int) -> bytes:
    ffi, _ = _lib()
    n = ffi.new("uint32_t *")
    ptr = getter(obj, attr, n)
    if ptr == ffi.NULL:
        return b""
    return bytes(ffi.buffer(ptr, n[0]))


def _get_str(getter: Any, obj: Any, attr: int) -> str:
    ffi, _ = _lib()
    ptr = getter(obj, attr)
    return "" if ptr == ffi.NULL else str(ffi.string(ptr).decode())


def _comment(udata: bytes, kind: int = 0) -> str:
    """The comment TLV (type ``kind``, NUL-terminated) in nftnl userdata, or ""."""
    off = 0
    while off + 2 <= len(udata):
        t, n = udata[off], udata[off + 1]
        if t == kind:
            return udata[off + 2 : off + 2 + n].rstrip(b"\0").decode(errors="replace")
        off += 2 + n
    return ""


# ---------------------------------------------------------------------------------------------
# Chains


_POLICIES = {0: Policy.DROP, 1: Policy.ACCEPT}


def _parse_chain(nlh: Any, family: Family) -> tuple[str, Chain]:
    _, lib = _lib()
    with _parsed("chain", nlh) as c:
        return _get_str(lib.nftnl_chain_get_str, c, lib.NFTNL_CHAIN_TABLE), _chain(c)


def _chain(c: Any) -> Chain:
    _, lib = _lib()
    name = _get_str(lib.nftnl_chain_get_str, c, lib.NFTNL_CHAIN_NAME)
    comment = _comment(_get_bytes(lib.nftnl_chain_get_data, c, lib.NFTNL_CHAIN_USERDATA))
    if not lib.nftnl_chain_is_set(c, lib.NFTNL_CHAIN_HOOKNUM):
        return Chain(name=name, comment=comment)
    hooknum = lib.nftnl_chain_get_u32(c, lib.NFTNL_CHAIN_HOOKNUM)
    policy = None
    if lib.nftnl_chain_is_set(c, lib.NFTNL_CHAIN_POLICY):
        policy = _POLICIES.get(lib.nftnl_chain_get_u32(c, lib.NFTNL_CHAIN_POLICY))
    try:
        return Chain(
            name=name,
            type=ChainType(_get_str(lib.nftnl_chain_get_str, c, lib.NFTNL_CHAIN_TYPE)),
            hook=list(Hook)[hooknum],
            priority=int(lib.nftnl_chain_get_s32(c, lib.NFTNL_CHAIN_PRIO)),
            policy=policy,
            comment=comment,
        )
    except (ValueError, IndexError) as exc:
        raise UndecodableError(f"chain {name}", f"base chain: {exc}") from exc


# ---------------------------------------------------------------------------------------------
# Sets and elements


@dataclass(slots=True)
class _RawSet:
    name: str
    flags: int
    key: tuple[DataType, ...]
    key_len: int
    data: tuple[DataType, ...]
    timeout_ms: int
    comment: str
    anonymous: bool = False
    ir: SetLike = field(init=False)

    def __post_init__(self) -> None:
        flags = SetFlag(self.flags) & ~_DERIVED_FLAGS
        timeout = self.timeout_ms // 1000 if self.timeout_ms else None
        if self.data:
            self.ir = Map(
                name=self.name,
                key=self.key,
                data=self.data,
                flags=flags,
                timeout=timeout,
                comment=self.comment,
            )
        else:
            self.ir = Set(
                name=self.name, key=self.key, flags=flags, timeout=timeout, comment=self.comment
            )

    def info(self, elements: list[Element]) -> SetInfo:
        entries: tuple[tuple[tuple[Value, ...], Verdict], ...] = ()
        if self.anonymous and self.data == (DataType.VERDICT,):
            pairs = [(el.key, el.value) for el in elements if isinstance(el.value, Verdict)]
            entries = tuple(sorted(pairs, key=lambda kv: decode.key_order(kv[0])))
        return SetInfo(self.key, self.key_len, self.anonymous, entries)


def _parse_set(nlh: Any, family: Family) -> tuple[str, _RawSet]:
    _, lib = _lib()
    with _parsed("set", nlh) as s:
        name = _get_str(lib.nftnl_set_get_str, s, lib.NFTNL_SET_NAME)
        flags = lib.nftnl_set_get_u32(s, lib.NFTNL_SET_FLAGS)
        key_len = lib.nftnl_set_get_u32(s, lib.NFTNL_SET_KEY_LEN)
        key = decode.split_type(
            lib.nftnl_set_get_u32(s, lib.NFTNL_SET_KEY_TYPE), key_len, what=f"set {name} key"
        )
        data: tuple[DataType, ...] = ()
        if flags & SetFlag.MAP:
            data = decode.split_type(
                lib.nftnl_set_get_u32(s, lib.NFTNL_SET_DATA_TYPE),
                lib.nftnl_set_get_u32(s, lib.NFTNL_SET_DATA_LEN),
                what=f"map {name} data",
            )
        timeout = 0
        if lib.nftnl_set_is_set(s, lib.NFTNL_SET_TIMEOUT):
            timeout = lib.nftnl_set_get_u64(s, lib.NFTNL_SET_TIMEOUT)
        udata = _get_bytes(lib.nftnl_set_get_data, s, lib.NFTNL_SET_USERDATA)
        return _get_str(lib.nftnl_set_get_str, s, lib.NFTNL_SET_TABLE), _RawSet(
            name=name,
            flags=flags,
            key=key,
            key_len=key_len,
            data=data,
            timeout_ms=timeout,
            comment=_comment(udata, lib.NFTNL_UDATA_SET_COMMENT),
            anonymous=bool(flags & SetFlag.ANONYMOUS),
        )


@dataclass(frozen=True, slots=True)
class _RawElem:
    key: bytes
    key_end: bytes | None
    flags: int
    data: bytes | None
    verdict: int | None
    chain: str | None
    timeout_ms: int
    comment: str


def _read_elements(s: NetfilterSocket, family: Family, table: str, rs: _RawSet) -> list[Element]:
    _, lib = _lib()
    seq = s.next_seq()

    def payload(nlh: Any) -> None:
        obj = lib.nftnl_set_alloc()
        lib.nftnl_set_set_str(obj, lib.NFTNL_SET_TABLE, table.encode())
        lib.nftnl_set_set_str(obj, lib.NFTNL_SET_NAME, rs.name.encode())
        lib.nftnl_set_elems_nlmsg_build_payload(nlh, obj)
        lib.nftnl_set_free(obj)

    req = _request(NFT_MSG_GETSETELEM, family, NLM_F_DUMP, seq, payload)
    raw: list[_RawElem] = []
    for msg in _messages(s, req, seq):
        raw.extend(_parse_elements(_nlh(msg)))
    if rs.flags & SetFlag.INTERVAL:
        return _interval_elements(rs, raw)
    return [_element(rs, e, decode.decode_key(rs.key, e.key)) for e in raw]


def _parse_elements(nlh: Any) -> list[_RawElem]:
    ffi, lib = _lib()
    out: list[_RawElem] = []
    get, is_set = lib.nftnl_set_elem_get, lib.nftnl_set_elem_is_set
    n = ffi.new("uint32_t *")

    def blob(e: Any, attr: int) -> bytes | None:
        ptr = get(e, attr, n)
        return None if ptr == ffi.NULL else bytes(ffi.buffer(ptr, n[0]))

    with _parsed("set", nlh, "elems_nlmsg_parse") as s:
        iterator = (
            lib.nftnl_set_elems_iter_create,
            lib.nftnl_set_elems_iter_next,
            lib.nftnl_set_elems_iter_destroy,
        )
        for e in _iterate(*iterator, s):
            verdict = chain = None
            if is_set(e, lib.NFTNL_SET_ELEM_VERDICT):
                verdict = lib.nftnl_set_elem_get_u32(e, lib.NFTNL_SET_ELEM_VERDICT)
                if is_set(e, lib.NFTNL_SET_ELEM_CHAIN):
                    chain = _get_str(lib.nftnl_set_elem_get_str, e, lib.NFTNL_SET_ELEM_CHAIN)
            udata = blob(e, lib.NFTNL_SET_ELEM_USERDATA)
            out.append(
                _RawElem(
                    key=blob(e, lib.NFTNL_SET_ELEM_KEY) or b"",
                    key_end=blob(e, lib.NFTNL_SET_ELEM_KEY_END),
                    flags=_int(blob(e, lib.NFTNL_SET_ELEM_FLAGS)),
                    data=blob(e, lib.NFTNL_SET_ELEM_DATA),
                    verdict=verdict,
                    chain=chain,
                    timeout_ms=_int(blob(e, lib.NFTNL_SET_ELEM_TIMEOUT)),
                    comment=_comment(udata) if udata else "",
                )
            )
    return out


def _int(blob: bytes | None) -> int:
    """A host-order integer attribute (libnftnl's element getters crash on absent ones)."""
    return int.from_bytes(blob, sys.byteorder) if blob else 0


def _element(rs: _RawSet, e: _RawElem, key: tuple[Value, ...]) -> Element:
    value: tuple[Value, ...] | Verdict | None = None
    if e.verdict is not None:
        value = decode.verdict_of(e.verdict, e.chain)
    elif e.data is not None:
        value = decode.decode_key(rs.data, e.data)
    elif rs.data:
        raise UndecodableError(f"map {rs.name}", f"element {key} has no data")
    return Element(
        set=rs.name,
        key=key,
        value=value,
        timeout=e.timeout_ms // 1000 if e.timeout_ms else None,
        comment=e.comment,
    )


def _interval_elements(rs: _RawSet, raw: list[_RawElem]) -> list[Element]:
    """Intervals back into networks (or single values), one element per network.

    A concatenated interval set stores each range in one element (key .. key_end, inclusive);
    a single-part one stores a start element and an end element holding the first value past
    the range (NFT_SET_ELEM_INTERVAL_END).
    """
    out: list[Element] = []
    if len(rs.key) > 1 or any(e.key_end is not None for e in raw):
        for e in raw:
            out.extend(_range_elements(rs, e, e.key, e.key_end or e.key))
        return out
    # An interval that ends where the next begins has an end and a start element with the same
    # key: the end sorts first, so each start finds its own end right after it.
    ordered = sorted(raw, key=lambda e: (e.key, not e.flags & NFT_SET_ELEM_INTERVAL_END))
    for i, e in enumerate(ordered):
        if e.flags & NFT_SET_ELEM_INTERVAL_END:
            continue
        nxt = ordered[i + 1] if i + 1 < len(ordered) else None
        if nxt is not None and nxt.flags & NFT_SET_ELEM_INTERVAL_END:
            hi = (int.from_bytes(nxt.key, "big") - 1).to_bytes(len(e.key), "big")
        else:
            hi = b"\xff" * len(e.key)
        out.extend(_range_elements(rs, e, e.key, hi))
    return out


def _range_elements(rs: _RawSet, e: _RawElem, lo: bytes, hi: bytes) -> list[Element]:
    parts: list[list[Value]] = [[]]
    off = 0
    for dt in rs.key:
        width = dt.length if len(rs.key) == 1 else decode.pad4(dt.length)
        values = decode.interval_value(dt, lo[off : off + dt.length], hi[off : off + dt.length])
        parts = [[*p, v] for p in parts for v in values]
        off += width
    return [_element(rs, e, tuple(p)) for p in parts]


# ---------------------------------------------------------------------------------------------
# Rules


# Attributes the decoder reads, per expression: "name=NFTNL_EXPR_ suffix", with ":b" for bytes,
# ":s" for a string and ":f" for presence only; the rest are integers.
_ATTRS: dict[str, str] = {
    "payload": "dreg=PAYLOAD_DREG base=PAYLOAD_BASE offset=PAYLOAD_OFFSET len=PAYLOAD_LEN "
    "sreg=PAYLOAD_SREG",
    "meta": "key=META_KEY dreg=META_DREG sreg=META_SREG",
    "ct": "key=CT_KEY dreg=CT_DREG dir=CT_DIR sreg=CT_SREG",
    "fib": "dreg=FIB_DREG result=FIB_RESULT flags=FIB_FLAGS",
    "numgen": "dreg=NG_DREG modulus=NG_MODULUS type=NG_TYPE offset=NG_OFFSET",
    "bitwise": "sreg=BITWISE_SREG dreg=BITWISE_DREG mask=BITWISE_MASK:b xor=BITWISE_XOR:b "
    "op=BITWISE_OP",
    "immediate": "dreg=IMM_DREG data=IMM_DATA:b verdict=IMM_VERDICT chain=IMM_CHAIN:s",
    "cmp": "sreg=CMP_SREG op=CMP_OP data=CMP_DATA:b",
    "lookup": "sreg=LOOKUP_SREG dreg=LOOKUP_DREG set=LOOKUP_SET:s flags=LOOKUP_FLAGS",
    "nat": "type=NAT_TYPE family=NAT_FAMILY addr_min=NAT_REG_ADDR_MIN addr_max=NAT_REG_ADDR_MAX "
    "proto_min=NAT_REG_PROTO_MIN proto_max=NAT_REG_PROTO_MAX flags=NAT_FLAGS",
    "masq": "flags=MASQ_FLAGS proto_min=MASQ_REG_PROTO_MIN",
    "reject": "type=REJECT_TYPE code=REJECT_CODE",
    "dynset": "sreg_key=DYNSET_SREG_KEY sreg_data=DYNSET_SREG_DATA op=DYNSET_OP "
    "timeout=DYNSET_TIMEOUT set=DYNSET_SET_NAME:s expr=DYNSET_EXPR:f",
    "counter": "",
}


@functools.cache
def _attr_specs(name: str) -> tuple[tuple[str, int, str], ...]:
    """(decoder's name, libnftnl attribute number, kind) for each attribute of ``name``."""
    _, lib = _lib()
    out = []
    for item in _ATTRS.get(name, "").split():
        key, _, rest = item.partition("=")
        attr, _, kind = rest.partition(":")
        out.append((key, int(getattr(lib, "NFTNL_EXPR_" + attr)), kind))
    return tuple(out)


def _raw_expr(e: Any, n: Any) -> RawExpr:
    """The attributes of expression ``e`` the decoder reads (``n``: a ``uint32_t *`` to use)."""
    ffi, lib = _lib()
    name = ffi.string(lib.nftnl_expr_get_str(e, lib.NFTNL_EXPR_NAME)).decode()
    attrs: dict[str, int | bytes | str] = {}
    get, buffer, null = lib.nftnl_expr_get, ffi.buffer, ffi.NULL
    for key, attr, kind in _attr_specs(name):
        ptr = get(e, attr, n)  # NULL when the attribute is absent
        if ptr == null:
            continue
        if kind == "f":
            attrs[key] = 1
            continue
        blob = buffer(ptr, n[0])[:]
        if kind == "b":
            attrs[key] = blob
        elif kind == "s":
            attrs[key] = blob.rstrip(b"\0").decode()
        else:
            attrs[key] = int.from_bytes(blob, sys.byteorder)
    return RawExpr(name, attrs)


def _expr_text(e: Any) -> str:
    """libnftnl's text of one expression, as ``nft --debug=netlink`` shows it."""
    ffi, lib = _lib()
    name = ffi.string(lib.nftnl_expr_get_str(e, lib.NFTNL_EXPR_NAME)).decode()
    buf = ffi.new("char[]", 1024)
    lib.nftnl_expr_snprintf(buf, 1024, e, lib.NFTNL_OUTPUT_DEFAULT, 0)
    return f"[ {name} {ffi.string(buf).decode().strip()} ]"


def _parse_rule(nlh: Any, family: Family, infos: dict[str, SetInfo]) -> tuple[str, Rule]:
    """One rule, decoded while libnftnl's copy is alive (its text is needed only on failure)."""
    ffi, lib = _lib()
    with _parsed("rule", nlh) as r:
        table = _get_str(lib.nftnl_rule_get_str, r, lib.NFTNL_RULE_TABLE)
        chain = _get_str(lib.nftnl_rule_get_str, r, lib.NFTNL_RULE_CHAIN)
        comment = _comment(_get_bytes(lib.nftnl_rule_get_data, r, lib.NFTNL_RULE_USERDATA))
        handle = int(lib.nftnl_rule_get_u64(r, lib.NFTNL_RULE_HANDLE))
        iterator = (
            lib.nftnl_expr_iter_create,
            lib.nftnl_expr_iter_next,
            lib.nftnl_expr_iter_destroy,
        )
        ptrs = _iterate(*iterator, r)
        try:
            n = ffi.new("uint32_t *")
            exprs = decode.decode_rule([_raw_expr(e, n) for e in ptrs], family, infos)
        except UndecodableError as exc:
            raw = tuple(_expr_text(e) for e in ptrs)
            return table, UndecodedRule(
                chain=chain, exprs=(), comment=comment, handle=handle, raw=raw, reason=str(exc)
            )
        return table, Rule(chain=chain, exprs=tuple(exprs), comment=comment, handle=handle)
