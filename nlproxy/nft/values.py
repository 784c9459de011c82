"""Set types and values in kernel byte layout, both ways: IR values to bytes and bytes back.

Shared by the write side (``encode.py`` packs element keys and data, ``lower.py`` packs
comparison operands) and the read side (``decode.py`` and ``readback.py`` turn kernel bytes back
into IR values), so the two agree on one layout: addresses and ports in network order, marks in
host order, parts of a concatenation padded to 4 bytes, a single part not padded; nft's type ids
concatenated 6 bits per part. Pure: no I/O, no libnftnl, no kernel. It never decides what to
program, and it never guesses: bytes the IR has no value for raise :class:`UndecodableError`.
"""

from __future__ import annotations

import functools
import struct
import sys
from collections.abc import Callable, Iterable, Sequence
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, summarize_address_range
from typing import Any

from nlproxy.errors import NlproxyError
from nlproxy.nft.ir import DataType, Value, Verdict, VerdictKind

NFT_DATA_VERDICT = 0xFFFFFF00
"""A set's data type when its data are verdicts (linux/netfilter/nf_tables.h)."""
TYPE_BITS = 6
"""Bits per part in nft's type id of a concatenation."""
VERDICT_CODES = {
    VerdictKind.DROP: 0,  # NF_DROP
    VerdictKind.ACCEPT: 1,  # NF_ACCEPT
    VerdictKind.CONTINUE: -1,  # NFT_CONTINUE
    VerdictKind.JUMP: -3,  # NFT_JUMP
    VerdictKind.GOTO: -4,  # NFT_GOTO
    VerdictKind.RETURN: -5,  # NFT_RETURN
}
_VERDICTS = {code: kind for kind, code in VERDICT_CODES.items()}
# nft's type ids (enum datatypes) that may appear in a set's key or data, by (id, length).
_TYPE_IDS: dict[int, DataType] = {dt.type_id: dt for dt in DataType if dt is not DataType.VERDICT}
_HOST_U32 = struct.Struct("=I")
_BSWAP = sys.byteorder == "little"


class UndecodableError(NlproxyError):
    """Something read back from the kernel that the IR cannot express (a foreign pattern)."""


def pad4(n: int) -> int:
    return (n + 3) & ~3


# ---------------------------------------------------------------------------------------------
# Types


def concat_ids(ids: Iterable[int]) -> int:
    """nft's type id of a concatenation of type ids: each shifted left 6 bits per later part."""
    t = 0
    for type_id in ids:
        t = (t << TYPE_BITS) | type_id
    return t


def concat_type(types: Sequence[DataType]) -> int:
    """nft's type id of a concatenation of datatypes (see :func:`concat_ids`)."""
    return concat_ids(dt.type_id for dt in types)


def concat_len(types: Sequence[DataType]) -> int:
    """Key length: the part's own length alone, or the sum of 4-byte-padded parts."""
    if len(types) == 1:
        return types[0].length
    return sum(pad4(dt.length) for dt in types)


def type_ids(type_id: int) -> list[int]:
    """The part ids of nft's concatenated type id, first part first (the inverse of
    :func:`concat_ids`)."""
    ids: list[int] = []
    while type_id:
        ids.append(type_id & ((1 << TYPE_BITS) - 1))
        type_id >>= TYPE_BITS
    ids.reverse()
    return ids


def split_type(type_id: int, length: int, *, what: str) -> tuple[DataType, ...]:
    """Split nft's concatenated type id (6 bits per part, first part highest) into datatypes.

    Raises:
        UndecodableError: an unknown type id, or lengths that do not add up to ``length``.
    """
    if type_id == NFT_DATA_VERDICT:
        return (DataType.VERDICT,)
    try:
        parts = tuple(_TYPE_IDS[i] for i in type_ids(type_id))
    except KeyError as exc:
        raise UndecodableError(what, f"unknown nft datatype id {exc.args[0]}") from None
    if not parts or concat_len(parts) != length:
        raise UndecodableError(what, f"type 0x{type_id:x} does not match length {length}")
    return parts


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
    DataType.INTEGER: ("I", "", _bswap32 if _BSWAP else int),
}


class Packer:
    """Packs value tuples of one key or data layout into bytes, as the kernel expects them.

    Big-endian struct codes, with host-order marks byte-swapped first; parts of a concatenation
    padded to 4 bytes, a single part not padded (``concat`` says otherwise: the leading parts
    of a longer concatenation are padded however many they are).
    """

    def __init__(self, types: Sequence[DataType], *, concat: bool | None = None) -> None:
        pad = len(types) > 1 if concat is None else concat
        fmt = ">" + "".join(_PART[dt][0] + (_PART[dt][1] if pad else "") for dt in types)
        self.struct = struct.Struct(fmt)
        self.convs = [_PART[dt][2] for dt in types]
        self.size = self.struct.size
        self.v4_ints = bool(types) and all(
            c is (_ipv4_int if i == 0 else int) for i, c in enumerate(self.convs)
        )
        """An IPv4 address then integers: packed from the address's int and the integers as
        they are, without a converter call per value (``packed.py``'s hot paths)."""

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
        if len(convs) == 4:  # the backends maps' keys: address . proto . port . index
            c0, c1, c2, c3 = convs
            for row in rows:
                pack_into(buf, off, c0(row[0]), c1(row[1]), c2(row[2]), c3(row[3]))
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
# Decoding values


def host_u32(data: bytes) -> int:
    """A 32-bit value in host order (marks, ct state bits)."""
    return int(_HOST_U32.unpack(data)[0])


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
        return host_u32(data)
    raise UndecodableError(f"value {data.hex()}", f"cannot decode as {dt}")


def decode_key(parts: tuple[DataType, ...], data: bytes) -> tuple[Value, ...]:
    """Split a (possibly concatenated) key or data blob into one value per part."""
    return _plain_decoder(parts)(data)


@functools.cache
def _plain_decoder(parts: tuple[DataType, ...]) -> Callable[[bytes], tuple[Value, ...]]:
    return key_decoder(parts)


def _host_order(v: int) -> int:
    """A 32-bit value unpacked big-endian, as the host-order value it holds."""
    return int.from_bytes(v.to_bytes(4, "big"), sys.byteorder)


# Per key part: its struct code (unpacked big-endian) and what turns that into the IR value.
_PARTS: dict[DataType, tuple[str, Callable[[Any], Value] | None]] = {
    DataType.IPV4_ADDR: ("I", IPv4Address),
    DataType.IPV6_ADDR: ("16s", IPv6Address),
    DataType.INET_SERVICE: ("H", None),
    DataType.INET_PROTO: ("B", None),
    DataType.MARK: ("I", _host_order if _BSWAP else None),
    DataType.INTEGER: ("I", _host_order if _BSWAP else None),
}


Addresses = dict[int, IPv4Address]
"""IPv4 addresses already made during one read-back, by value: the same address recurs in many
keys and values (a ClusterIP in every backend element, an endpoint in its hairpin pair), and
one object per address instead of one per occurrence is ~25 MB less at 100k endpoints."""


@functools.cache
def _layout(parts: tuple[DataType, ...]) -> tuple[struct.Struct, tuple[int, ...]]:
    """The struct for keys of one set type, and which parts need a conversion."""
    fmt = ">"
    convs = []
    for i, p in enumerate(parts):
        if p not in _PARTS:
            raise UndecodableError(f"datatype {p.name}", "has no key values")
        code, conv = _PARTS[p]
        fmt += code + ("x" * (pad4(p.length) - p.length) if len(parts) > 1 else "")
        if conv is not None:
            convs.append(i)
    return struct.Struct(fmt), tuple(convs)


def key_decoder(
    parts: tuple[DataType, ...], addrs: Addresses | None = None
) -> Callable[[bytes], tuple[Value, ...]]:
    """A fast decoder for keys of one set type (read-back decodes 100k elements at a time): one
    struct unpack for the whole key, then a conversion of the parts that need one.

    Args:
        addrs: share IPv4 address objects through this (see :data:`Addresses`).
    """
    layout, at = _layout(parts)
    unpack, size = layout.unpack_from, layout.size
    convs: list[tuple[int, Callable[[Any], Value]]] = []
    for i in at:
        conv = _PARTS[parts[i]][1]
        assert conv is not None, "only parts with a conversion are listed"
        if addrs is not None and parts[i] is DataType.IPV4_ADDR:
            conv = functools.partial(_shared_v4, addrs)
        convs.append((i, conv))

    def decode(data: bytes) -> tuple[Value, ...]:
        if len(data) < size:
            raise UndecodableError(f"value {data.hex()}", f"too short for {_names(parts)}")
        values: list[Value] = list(unpack(data))
        for i, conv in convs:
            values[i] = conv(values[i])
        return tuple(values)

    return decode


def _shared_v4(addrs: Addresses, v: int) -> IPv4Address:
    ip = addrs.get(v)
    if ip is None:
        ip = addrs[v] = IPv4Address(v)
    return ip


def _names(parts: tuple[DataType, ...]) -> str:
    return " . ".join(p.name for p in parts)


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
