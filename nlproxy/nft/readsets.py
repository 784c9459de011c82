"""Read sets, maps and their elements back from the kernel into the IR.

Sits under the read-back: ``readback.py`` dumps a table's sets through :func:`parse_set` and their
elements through :func:`read_elements`, and hands each set's :class:`RawSet` info to the rule
decoder. Element bytes become IR values with ``values.py``; interval sets come back as the
networks (or single values) that exactly cover each range. It only reads: it never changes the
kernel, and never approximates what it cannot express (:class:`UndecodableError`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from nlproxy.nft.decode import SetInfo
from nlproxy.nft.dump import (
    NFT_MSG_GETSETELEM,
    get_bytes,
    get_str,
    iterate,
    messages,
    nftnl,
    nlh_of,
    parsed,
    request,
)
from nlproxy.nft.ir import DataType, Element, Family, Map, Set, SetFlag, SetLike, Value, Verdict
from nlproxy.nft.nlsock import NLM_F_DUMP, NetfilterSocket
from nlproxy.nft.uapi import NFT_SET_ELEM_INTERVAL_END
from nlproxy.nft.udata import udata_comment
from nlproxy.nft.values import (
    UndecodableError,
    decode_key,
    interval_value,
    key_order,
    pad4,
    split_type,
    verdict_of,
)

_DERIVED_FLAGS = SetFlag.MAP | SetFlag.CONCAT
"""Set flags implied by the IR type (Map) and key (interval + concatenation): not kept."""


@dataclass(slots=True)
class RawSet:
    """A set as the kernel described it, with its IR object (``ir``) derived from that."""

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
        """What the rule decoder needs to know about this set, given its elements."""
        entries: tuple[tuple[tuple[Value, ...], Verdict], ...] = ()
        if self.anonymous and self.data == (DataType.VERDICT,):
            pairs = [(el.key, el.value) for el in elements if isinstance(el.value, Verdict)]
            entries = tuple(sorted(pairs, key=lambda kv: key_order(kv[0])))
        return SetInfo(self.key, self.key_len, self.anonymous, entries)


def parse_set(nlh: Any, family: Family) -> tuple[str, RawSet]:
    """One set of a set dump: (its table's name, the set).

    Raises:
        UndecodableError: a key or data type the IR cannot express.
    """
    _, lib = nftnl()
    with parsed("set", nlh) as s:
        name = get_str(lib.nftnl_set_get_str, s, lib.NFTNL_SET_NAME)
        flags = lib.nftnl_set_get_u32(s, lib.NFTNL_SET_FLAGS)
        key_len = lib.nftnl_set_get_u32(s, lib.NFTNL_SET_KEY_LEN)
        key = split_type(
            lib.nftnl_set_get_u32(s, lib.NFTNL_SET_KEY_TYPE), key_len, what=f"set {name} key"
        )
        data: tuple[DataType, ...] = ()
        if flags & SetFlag.MAP:
            data = split_type(
                lib.nftnl_set_get_u32(s, lib.NFTNL_SET_DATA_TYPE),
                lib.nftnl_set_get_u32(s, lib.NFTNL_SET_DATA_LEN),
                what=f"map {name} data",
            )
        timeout = 0
        if lib.nftnl_set_is_set(s, lib.NFTNL_SET_TIMEOUT):
            timeout = lib.nftnl_set_get_u64(s, lib.NFTNL_SET_TIMEOUT)
        udata = get_bytes(lib.nftnl_set_get_data, s, lib.NFTNL_SET_USERDATA)
        return get_str(lib.nftnl_set_get_str, s, lib.NFTNL_SET_TABLE), RawSet(
            name=name,
            flags=flags,
            key=key,
            key_len=key_len,
            data=data,
            timeout_ms=timeout,
            comment=udata_comment(udata, lib.NFTNL_UDATA_SET_COMMENT),
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


def read_elements(s: NetfilterSocket, family: Family, table: str, rs: RawSet) -> list[Element]:
    """Dump the elements of set ``rs`` of ``family table``, as IR elements.

    Raises:
        Interrupted: the ruleset changed during the dump.
        UndecodableError: an element the IR cannot express.
    """
    _, lib = nftnl()
    seq = s.next_seq()

    def payload(nlh: Any) -> None:
        obj = lib.nftnl_set_alloc()
        lib.nftnl_set_set_str(obj, lib.NFTNL_SET_TABLE, table.encode())
        lib.nftnl_set_set_str(obj, lib.NFTNL_SET_NAME, rs.name.encode())
        lib.nftnl_set_elems_nlmsg_build_payload(nlh, obj)
        lib.nftnl_set_free(obj)

    req = request(NFT_MSG_GETSETELEM, family, NLM_F_DUMP, seq, payload)
    raw: list[_RawElem] = []
    for msg in messages(s, req, seq):
        raw.extend(_parse_elements(nlh_of(msg)))
    if rs.flags & SetFlag.INTERVAL:
        return _interval_elements(rs, raw)
    return [_element(rs, e, decode_key(rs.key, e.key)) for e in raw]


def _parse_elements(nlh: Any) -> list[_RawElem]:
    ffi, lib = nftnl()
    out: list[_RawElem] = []
    get, is_set = lib.nftnl_set_elem_get, lib.nftnl_set_elem_is_set
    n = ffi.new("uint32_t *")

    def blob(e: Any, attr: int) -> bytes | None:
        ptr = get(e, attr, n)
        return None if ptr == ffi.NULL else bytes(ffi.buffer(ptr, n[0]))

    with parsed("set", nlh, "elems_nlmsg_parse") as s:
        iterator = (
            lib.nftnl_set_elems_iter_create,
            lib.nftnl_set_elems_iter_next,
            lib.nftnl_set_elems_iter_destroy,
        )
        for e in iterate(*iterator, s):
            verdict = chain = None
            if is_set(e, lib.NFTNL_SET_ELEM_VERDICT):
                verdict = lib.nftnl_set_elem_get_u32(e, lib.NFTNL_SET_ELEM_VERDICT)
                if is_set(e, lib.NFTNL_SET_ELEM_CHAIN):
                    chain = get_str(lib.nftnl_set_elem_get_str, e, lib.NFTNL_SET_ELEM_CHAIN)
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
                    comment=udata_comment(udata) if udata else "",
                )
            )
    return out


def _int(blob: bytes | None) -> int:
    """A host-order integer attribute (libnftnl's element getters crash on absent ones)."""
    return int.from_bytes(blob, sys.byteorder) if blob else 0


def _element(rs: RawSet, e: _RawElem, key: tuple[Value, ...]) -> Element:
    value: tuple[Value, ...] | Verdict | None = None
    if e.verdict is not None:
        value = verdict_of(e.verdict, e.chain)
    elif e.data is not None:
        value = decode_key(rs.data, e.data)
    elif rs.data:
        raise UndecodableError(f"map {rs.name}", f"element {key} has no data")
    return Element(
        set=rs.name,
        key=key,
        value=value,
        timeout=e.timeout_ms // 1000 if e.timeout_ms else None,
        comment=e.comment,
    )


def _interval_elements(rs: RawSet, raw: list[_RawElem]) -> list[Element]:
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


def _range_elements(rs: RawSet, e: _RawElem, lo: bytes, hi: bytes) -> list[Element]:
    parts: list[list[Value]] = [[]]
    off = 0
    for dt in rs.key:
        width = dt.length if len(rs.key) == 1 else pad4(dt.length)
        values = interval_value(dt, lo[off : off + dt.length], hi[off : off + dt.length])
        parts = [[*p, v] for p in parts for v in values]
        off += width
    return [_element(rs, e, tuple(p)) for p in parts]
