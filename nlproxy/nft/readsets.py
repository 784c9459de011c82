"""Read sets, maps and their elements back from the kernel into the IR.

Sits under the read-back: ``readback.py`` dumps a table's sets through :func:`parse_set` and their
elements through :func:`read_elements`, and hands each set's :class:`RawSet` info to the rule
decoder. Element bytes become IR values with ``values.py``; interval sets come back as the
networks (or single values) that exactly cover each range. It only reads: it never changes the
kernel, and never approximates what it cannot express (:class:`UndecodableError`), nor returns
the elements of a walk the kernel disturbed (:func:`walked`).
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeAlias

from nlproxy.netlink.codec import NFGENMSG, NLM_F_DUMP, span_map, spans
from nlproxy.netlink.nlsock import NetfilterSocket
from nlproxy.nft.decode import SetInfo
from nlproxy.nft.dump import (
    Disturbed,
    get_bytes,
    get_str,
    messages,
    nftnl,
    parsed,
    request,
)
from nlproxy.nft.ir import DataType, Element, Family, Map, Set, SetFlag, SetLike, Value, Verdict
from nlproxy.nft.packed import PackedElements, packable
from nlproxy.nft.uapi import (
    NFT_MSG_GETSETELEM,
    NFT_SET_ELEM_INTERVAL_END,
    NFTA_DATA_VALUE,
    NFTA_DATA_VERDICT,
    NFTA_LIST_ELEM,
    NFTA_SET_ELEM_DATA,
    NFTA_SET_ELEM_FLAGS,
    NFTA_SET_ELEM_KEY,
    NFTA_SET_ELEM_KEY_END,
    NFTA_SET_ELEM_LIST_ELEMENTS,
    NFTA_SET_ELEM_TIMEOUT,
    NFTA_SET_ELEM_USERDATA,
    NFTA_VERDICT_CHAIN,
    NFTA_VERDICT_CODE,
)
from nlproxy.nft.udata import udata_comment
from nlproxy.nft.values import (
    Addresses,
    UndecodableError,
    decode_key,
    interval_value,
    key_decoder,
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
        parts = [dt.length for dt in self.data if dt is not DataType.VERDICT]
        data_len = sum(pad4(n) for n in parts) if len(parts) > 1 else sum(parts)
        return SetInfo(self.key, self.key_len, self.anonymous, entries, data_len)


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


class _RawElem(NamedTuple):
    """One element as the kernel sent it (a tuple: read-back makes 100k+ of them)."""

    key: bytes
    key_end: bytes | None
    flags: int
    data: bytes | None
    verdict: int | None
    chain: str | None
    timeout_ms: int
    comment: str


def walked(set_name: str, listed: int, distinct: int) -> None:
    """Check that a dump of set ``set_name`` that listed ``listed`` elements, ``distinct`` of
    them different, came from an undisturbed walk.

    The kernel sends a set's elements over many messages; for each it walks the set from the
    start and skips as many as it sent already (``nft_rhash_walk``). When a hash set's table
    is resized between two messages (deferred work after the commit that grew it past 75%
    load, or shrank it), or the packet path adds elements to it, the walk's order changes:
    elements sent already come again, and as many are never sent. The kernel flags a dump
    NLM_F_DUMP_INTR only when the ruleset's generation moves, which none of these does, so a
    key listed twice is the sign (with nothing else changing, repeats equal omissions). An
    element the kernel removes on its own (a timed-out one it collects) shifts the walk the
    other way, leaving one out and repeating none: only sets with timeouts have those.

    Raises:
        Disturbed: a key was listed more than once (read the set again).
    """
    if listed != distinct:
        raise Disturbed(
            f"set {set_name}: {listed - distinct} of {listed} elements listed twice (and as many"
            " left out): its hash table moved during the dump"
        )


def _walked_raw(rs: RawSet, raw: list[_RawElem]) -> None:
    """:func:`walked` for the elements of ``rs`` as parsed, unless ``rs`` is a dynamic set, or
    one with timeouts (the kernel lets the packet path update those without the flag). The
    packet path adds to and refreshes such a set at any time, without a generation, so a read
    of one in a whole table is as of no one moment anyway (the diff leaves a dynamic set's
    elements alone; nlproxy's sets with timeouts are all dynamic), and one busy with new
    clients would fail every read-back of the table.

    An element is told from another by its key; in an interval set, by its key, its end and
    whether it is an end element (which may share its key with the next range's start)."""
    if rs.flags & (SetFlag.EVAL | SetFlag.TIMEOUT):  # the packet path may update a timeout
        return  # set not flagged dynamic too (the kernel lets it), and its elements expire
    if rs.flags & SetFlag.INTERVAL:
        end = NFT_SET_ELEM_INTERVAL_END
        distinct = len({(e.key, e.key_end, e.flags & end) for e in raw})
    else:
        distinct = len({e.key for e in raw})
    walked(rs.name, len(raw), distinct)


def elements_request(family: Family, table: str, set_name: str, seq: int) -> bytes:
    """The GETSETELEM dump request for the elements of one set."""
    _, lib = nftnl()

    def payload(nlh: Any) -> None:
        obj = lib.nftnl_set_alloc()
        lib.nftnl_set_set_str(obj, lib.NFTNL_SET_TABLE, table.encode())
        lib.nftnl_set_set_str(obj, lib.NFTNL_SET_NAME, set_name.encode())
        lib.nftnl_set_elems_nlmsg_build_payload(nlh, obj)
        lib.nftnl_set_free(obj)

    return request(NFT_MSG_GETSETELEM, family, NLM_F_DUMP, seq, payload)


def read_elements(
    s: NetfilterSocket, family: Family, table: str, rs: RawSet, addrs: Addresses | None = None
) -> list[Element]:
    """Dump the elements of set ``rs`` of ``family table``, as IR elements.

    ``addrs`` shares IPv4 address objects across the sets of one read-back (see ``values.py``).

    Raises:
        Interrupted: the ruleset changed during the dump (:class:`Disturbed`: the walk was
            disturbed, see :func:`walked`; never for a dynamic set).
        UndecodableError: an element the IR cannot express.
    """
    seq = s.next_seq()
    raw: list[_RawElem] = []
    layouts: Layouts = {}
    for msg in messages(s, elements_request(family, table, rs.name, seq), seq):
        raw.extend(_parse_elements(msg.payload, layouts))
    _walked_raw(rs, raw)
    if rs.flags & SetFlag.INTERVAL:
        return _interval_elements(rs, raw)
    key = key_decoder(rs.key, addrs)
    data = key_decoder(rs.data, addrs) if rs.data and rs.data != (DataType.VERDICT,) else None
    return [_element(rs, e, key(e.key), data) for e in raw]


def read_set_elements(
    s: NetfilterSocket, family: Family, table: str, rs: RawSet, addrs: Addresses | None = None
) -> list[Element] | PackedElements:
    """:func:`read_elements`, but the elements of a named set that can be held packed come
    back as the kernel's bytes (``packed.py``), not decoded, when none of them carries what a
    packed set cannot hold (a comment, a timeout, flags: another writer's elements).

    Raises:
        Interrupted: the ruleset changed during the dump, or (:class:`Disturbed`) the walk
            was disturbed.
        UndecodableError: an element the IR cannot express.
    """
    if rs.anonymous or not packable(rs.ir):
        return read_elements(s, family, table, rs, addrs)
    seq = s.next_seq()
    payloads = [m.payload for m in messages(s, elements_request(family, table, rs.name, seq), seq)]
    store = PackedElements(rs.ir)
    key_len, data_len = store.key_size, store.data_size
    records = [_plain_records(p, key_len, data_len) for p in payloads]
    # An empty set stays a plain one: its elements to come may carry comments.
    if all(r is not None for r in records) and any(r and r[0] for r in records):
        own, listed = store.own(), 0
        for r in records:
            assert r is not None  # checked above
            own.update(zip(*r, strict=True))
            listed += len(r[0])
        walked(rs.name, listed, len(own))  # a packable set is never a dynamic one
        return store
    raw: list[_RawElem] = []
    layouts: Layouts = {}
    for payload in payloads:
        raw.extend(_parse_elements(payload, layouts))
    _walked_raw(rs, raw)
    plain = all(
        e.key_end is None
        and not e.flags
        and not e.timeout_ms
        and not e.comment
        and e.verdict is None
        and len(e.key) == key_len
        and (len(e.data) if e.data is not None else 0) == data_len
        for e in raw
    )
    if not plain or not raw:
        key = key_decoder(rs.key, addrs)
        data = key_decoder(rs.data, addrs) if rs.data else None
        return [_element(rs, e, key(e.key), data) for e in raw]
    store.own().update((e.key, e.data or b"") for e in raw)
    return store


def read_pairs(s: NetfilterSocket, family: Family, table: str, set_name: str) -> dict[bytes, bytes]:
    """Every element of set ``set_name`` as the kernel's bytes, key -> data (``b""`` in a set),
    decoding none: for a caller that compares data with bytes it packed (``dynmap.py``).

    Raises:
        Interrupted: the ruleset changed during the dump, or (:class:`Disturbed`) the walk
            was disturbed: a dynamic set's, by the packet path too (see :func:`walked`).
    """
    seq = s.next_seq()
    layouts: Layouts = {}
    out: dict[bytes, bytes] = {}
    listed = 0
    for msg in messages(s, elements_request(family, table, set_name, seq), seq):
        records = _records(msg.payload)
        if records is not None:
            out.update(zip(*records, strict=True))
            listed += len(records[0])
            continue
        elements = _parse_elements(msg.payload, layouts)
        out.update((e.key, e.data or b"") for e in elements)
        listed += len(elements)
    try:
        walked(set_name, listed, len(out))
    except Disturbed as exc:
        exc.seen = out
        raise
    return out


def _records(payload: bytes) -> tuple[list[bytes], list[bytes]] | None:
    """The keys and data of one NEWSETELEM message whose elements are all laid out as its
    first (the same attributes, of the same lengths: a dynamic map's, each with a timeout and
    an expiration), sliced straight from the message; None otherwise (a verdict map's, or
    elements of different layouts: :func:`_parse_elements` reads them).

    The first element is walked; every byte of it but the values of its key, data and other
    leaf attributes is then checked for all elements at once (a strided slice, as
    :func:`_plain_records` does), and each key and datum is one slice.
    """
    top = span_map(payload, NFGENMSG.size)
    if NFTA_SET_ELEM_LIST_ELEMENTS not in top:
        return [], []
    start, stop = top[NFTA_SET_ELEM_LIST_ELEMENTS]
    if stop == start:
        return [], []
    if stop - start < 4:
        return None
    size = pad4(int.from_bytes(payload[start : start + 2], sys.byteorder))
    count, rest = divmod(stop - start, size)
    if rest or size < 8:
        return None
    a = span_map(payload, start + 4, start + size)
    if NFTA_SET_ELEM_KEY not in a:
        return None
    key = span_map(payload, *a[NFTA_SET_ELEM_KEY]).get(NFTA_DATA_VALUE)
    data = None
    if NFTA_SET_ELEM_DATA in a:
        data = span_map(payload, *a[NFTA_SET_ELEM_DATA]).get(NFTA_DATA_VALUE)
        if data is None:  # a verdict
            return None
    if key is None:
        return None
    leaves = [key, *([data] if data else [])]
    leaves += [v for kind, v in a.items() if kind not in (NFTA_SET_ELEM_KEY, NFTA_SET_ELEM_DATA)]
    values = {j - start for lo, hi in leaves for j in range(lo, hi)}
    first = payload[start : start + size]
    for j in range(size):
        if j not in values and payload[start + j : stop : size] != first[j : j + 1] * count:
            return None
    (k0, k1), (d0, d1) = key, data or (start, start)
    keys = [payload[o : o + k1 - k0] for o in range(k0, stop, size)]
    if data is None:
        return keys, [b""] * count
    return keys, [payload[o : o + d1 - d0] for o in range(d0, stop, size)]


def _plain_records(
    payload: bytes, key_len: int, data_len: int
) -> tuple[list[bytes], list[bytes]] | None:
    """The keys and data of one NEWSETELEM message whose elements are all plain (a key, and
    data of a map, nothing else), sliced straight from the message; None when any element is
    laid out otherwise (then :func:`_parse_elements` reads them).

    Plain elements of one set are records of one length, headers identical: each header byte
    is checked for all records at once (a strided slice), then each key and datum is one slice.
    """
    top = span_map(payload, NFGENMSG.size)
    if NFTA_SET_ELEM_LIST_ELEMENTS not in top:
        return [], []
    start, stop = top[NFTA_SET_ELEM_LIST_ELEMENTS]
    kp, dp = pad4(key_len), pad4(data_len)
    head = struct.pack("=HHHH", 8 + key_len, NFTA_SET_ELEM_KEY, 4 + key_len, NFTA_DATA_VALUE)
    data_at = 12 + kp
    if data_len:
        head_data = struct.pack(
            "=HHHH", 8 + data_len, NFTA_SET_ELEM_DATA, 4 + data_len, NFTA_DATA_VALUE
        )
        size = data_at + 8 + dp
    else:
        head_data, size = b"", data_at
    count, rest = divmod(stop - start, size)
    if rest or not count:
        return None if rest else ([], [])
    record = struct.pack("=HH", size, NFTA_LIST_ELEM) + head
    template = (record + bytes(kp) + head_data + bytes(dp)) if data_len else record + bytes(kp)
    values = {*range(12, 12 + key_len), *range(data_at + 8, data_at + 8 + data_len)}
    for j in range(size):
        if j not in values and payload[start + j : stop : size] != template[j : j + 1] * count:
            return None
    keys = [payload[o : o + key_len] for o in range(start + 12, stop, size)]
    if not data_len:
        return keys, [b""] * count
    at = start + data_at + 8
    return keys, [payload[o : o + data_len] for o in range(at, stop, size)]


_BE32 = struct.Struct(">I")
_BE64 = struct.Struct(">Q")


_Layout: TypeAlias = tuple[Callable[[bytes, int], tuple[Any, ...]], tuple[Any, ...], "_Spots"]
Layouts: TypeAlias = dict[int, list[_Layout]]
"""Learnt element layouts, by the element's attribute length: (header reader, the headers it
must read, where the fields are); see :func:`_parse_elements`."""
_MAX_LAYOUTS = 8
"""Layouts learnt per element length (past that, elements of the length are walked)."""


def _parse_elements(payload: bytes, layouts: Layouts | None = None) -> list[_RawElem]:
    """The elements of one NFT_MSG_NEWSETELEM message (``payload``: after the netlink header),
    read straight from its attributes: the same fields libnftnl's element parser yields, without
    a library call per field (read-back parses 100k+ elements).

    The elements of a set nearly all share one layout (the same attributes, at the same
    offsets): with ``layouts`` (kept across the messages of a dump), an element whose headers
    are those of one met before is read from the places found then, in one ``unpack_from``
    instead of a walk of its three or four nested attribute lists.
    """
    top = span_map(payload, NFGENMSG.size)
    if NFTA_SET_ELEM_LIST_ELEMENTS not in top:
        return []
    out: list[_RawElem] = []
    known = layouts.get if layouts is not None else _no_layouts
    for kind, start, stop in spans(payload, *top[NFTA_SET_ELEM_LIST_ELEMENTS]):
        if kind != NFTA_LIST_ELEM:
            continue
        # the learnt layouts' check here rather than in _element_at: a call less per element
        off = start - 4
        for read, expected, spots in known(stop - off, ()):
            if read(payload, off) == expected:
                out.append(_from_spots(payload, spots, off))
                break
        else:
            out.append(_element_at(payload, start, stop, layouts))
    return out


def _no_layouts(_length: int, default: tuple[()]) -> tuple[()]:
    return default


def _element_at(buf: bytes, start: int, stop: int, layouts: Layouts | None) -> _RawElem:
    """The element whose LIST_ELEM attribute's payload is ``buf[start:stop]``, walked (and its
    layout learnt, with ``layouts``)."""
    off, length = start - 4, stop - start + 4
    seen: list[int] | None = None if layouts is None else []
    spots = _spots(buf, span_map(buf, start, stop, seen), seen)
    if seen is not None and layouts is not None and len(layouts.get(length, ())) < _MAX_LAYOUTS:
        # the header words at the offsets read, relative to the element: equal words there
        # mean an equal walk, hence fields at the same places
        rel = sorted({o - off for o in seen})
        fmt = "=" + "".join(f"{gap}xI" for gap in _gaps(rel))
        read = struct.Struct(fmt).unpack_from
        layouts.setdefault(length, []).append((read, read(buf, off), spots.moved(-off)))
    return _from_spots(buf, spots, 0)


def _gaps(rel: list[int]) -> list[int]:
    """The padding before each 4-byte word at offsets ``rel`` (sorted, distinct)."""
    out, pos = [], 0
    for o in rel:
        out.append(o - pos)
        pos = o + 4
    return out


class _Spots(NamedTuple):
    """Where an element's fields are in the message: (start, end) of a blob or the offset of a
    number; None where the element has no such attribute. ``verdict``: -1 for a verdict
    without a code (read as 0)."""

    key: tuple[int, int] | None
    key_end: tuple[int, int] | None
    flags: int | None
    data: tuple[int, int] | None
    verdict: int | None
    chain: tuple[int, int] | None
    timeout: int | None
    udata: tuple[int, int] | None

    def moved(self, by: int) -> _Spots:
        def span(x: tuple[int, int] | None) -> tuple[int, int] | None:
            return None if x is None else (x[0] + by, x[1] + by)

        def at(x: int | None) -> int | None:
            return None if x is None else x + by

        return _Spots(
            key=span(self.key),
            key_end=span(self.key_end),
            flags=at(self.flags),
            data=span(self.data),
            verdict=self.verdict if self.verdict == -1 else at(self.verdict),
            chain=span(self.chain),
            timeout=at(self.timeout),
            udata=span(self.udata),
        )


def _spots(buf: bytes, a: dict[int, tuple[int, int]], seen: list[int] | None) -> _Spots:
    """Where ``_RawElem``'s fields are, for an element with top attributes ``a``."""
    verdict = chain = data = None
    if NFTA_SET_ELEM_DATA in a:
        inner = span_map(buf, *a[NFTA_SET_ELEM_DATA], seen)
        if NFTA_DATA_VERDICT in inner:
            v = span_map(buf, *inner[NFTA_DATA_VERDICT], seen)
            verdict = v[NFTA_VERDICT_CODE][0] if NFTA_VERDICT_CODE in v else -1
            chain = v.get(NFTA_VERDICT_CHAIN)
        elif NFTA_DATA_VALUE in inner:
            data = inner.get(NFTA_DATA_VALUE)
    key = key_end = None
    if NFTA_SET_ELEM_KEY in a:
        key = span_map(buf, *a[NFTA_SET_ELEM_KEY], seen).get(NFTA_DATA_VALUE)
    if NFTA_SET_ELEM_KEY_END in a:
        key_end = span_map(buf, *a[NFTA_SET_ELEM_KEY_END], seen).get(NFTA_DATA_VALUE)
    flags, timeout = a.get(NFTA_SET_ELEM_FLAGS), a.get(NFTA_SET_ELEM_TIMEOUT)
    return _Spots(
        key=key,
        key_end=key_end,
        flags=None if flags is None else flags[0],
        data=data,
        verdict=verdict,
        chain=chain,
        timeout=None if timeout is None else timeout[0],
        udata=a.get(NFTA_SET_ELEM_USERDATA),
    )


def _from_spots(buf: bytes, sp: _Spots, by: int) -> _RawElem:
    """The element whose fields are at ``sp`` moved by ``by`` bytes."""
    key = b"" if sp.key is None else buf[sp.key[0] + by : sp.key[1] + by]
    verdict = None
    if sp.verdict is not None:
        verdict = 0 if sp.verdict == -1 else _BE32.unpack_from(buf, sp.verdict + by)[0]
    chain = None
    if sp.chain is not None:
        chain = buf[sp.chain[0] + by : sp.chain[1] + by].split(b"\0", 1)[0].decode()
    udata = None if sp.udata is None else buf[sp.udata[0] + by : sp.udata[1] + by]
    return _RawElem(
        key=key,
        key_end=None if sp.key_end is None else buf[sp.key_end[0] + by : sp.key_end[1] + by],
        flags=0 if sp.flags is None else _BE32.unpack_from(buf, sp.flags + by)[0],
        data=None if sp.data is None else buf[sp.data[0] + by : sp.data[1] + by],
        verdict=verdict,
        chain=chain,
        timeout_ms=0 if sp.timeout is None else _BE64.unpack_from(buf, sp.timeout + by)[0],
        comment=udata_comment(udata) if udata else "",
    )


def _element(
    rs: RawSet,
    e: _RawElem,
    key: tuple[Value, ...],
    data: Callable[[bytes], tuple[Value, ...]] | None = None,
) -> Element:
    """One IR element; ``data`` decodes the map's data (None: looked up per element)."""
    value: tuple[Value, ...] | Verdict | None = None
    if e.verdict is not None:
        value = verdict_of(e.verdict, e.chain)
    elif e.data is not None:
        value = data(e.data) if data is not None else decode_key(rs.data, e.data)
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
