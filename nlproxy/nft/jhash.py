"""The kernel's ``jhash`` (linux/jhash.h, Bob Jenkins' lookup3) and ``nft_hash``'s scaling.

Sits beside the IR for its readers that must agree with the kernel bit for bit: the packet
tracer predicts which slot of a consistent-hash table a client lands in, and ``nlproxy explain``
names the backend. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from nlproxy.nft.ir import DataType, Jhash, Value
from nlproxy.nft.values import Packer, pad4

_M = 0xFFFFFFFF
JHASH_INITVAL = 0xDEADBEEF


def _rol(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _M


# __jhash_mix: (x, y, z, r) is ``x -= y; x ^= rol32(y, r); y += z`` on (a, b, c) by index.
_MIX = ((0, 2, 1, 4), (1, 0, 2, 6), (2, 1, 0, 8), (0, 2, 1, 16), (1, 0, 2, 19), (2, 1, 0, 4))
# __jhash_final: (x, y, r) is ``x ^= y; x -= rol32(y, r)``.
_FINAL = ((2, 1, 14), (0, 2, 11), (1, 0, 25), (2, 1, 16), (0, 2, 4), (1, 0, 14), (2, 1, 24))


def _mix(v: list[int]) -> None:
    for x, y, z, r in _MIX:
        v[x] = ((v[x] - v[y]) & _M) ^ _rol(v[y], r)
        v[y] = (v[y] + v[z]) & _M


def _final(v: list[int]) -> int:
    for x, y, r in _FINAL:
        v[x] = ((v[x] ^ v[y]) - _rol(v[y], r)) & _M
    return v[2]


def jhash(data: bytes, seed: int) -> int:
    """``jhash(key, length, initval)`` of the kernel, on a little-endian machine: the register
    bytes are read as host-order 32-bit words, the tail byte by byte."""
    length = len(data)
    v = [(JHASH_INITVAL + length + seed) & _M] * 3
    k = 0
    while length > 12:
        _add(v, data[k : k + 12])
        _mix(v)
        length -= 12
        k += 12
    if length == 0:
        return v[2]
    _add(v, data[k:] + bytes(12 - length))
    return _final(v)


def _add(v: list[int], block: bytes) -> None:
    for i in range(3):
        v[i] = (v[i] + int.from_bytes(block[4 * i : 4 * i + 4], "little")) & _M


def nft_jhash(data: bytes, modulus: int, seed: int, offset: int = 0) -> int:
    """What ``jhash <data> mod <modulus> seed <seed> [offset <offset>]`` writes to its register:
    the hash scaled into ``[0, modulus)`` by ``reciprocal_scale`` (a multiply and a shift, not
    a remainder), plus the offset."""
    return ((jhash(data, seed) * modulus) >> 32) + offset


def key_types(sel: Jhash) -> tuple[DataType, ...]:
    """The datatypes of the hashed fields (validation refuses a field without one)."""
    types = tuple(f.datatype for f in sel.key)
    assert all(t is not None for t in types), "validated: hashed fields have a datatype"
    return types  # type: ignore[return-value]


def key_length(sel: Jhash) -> int:
    """The bytes hashed: one field as loaded, or a concatenation with every part padded to a
    32-bit register, as nft computes ``len`` for ``jhash a . b``."""
    types = key_types(sel)
    return types[0].length if len(types) == 1 else sum(pad4(t.length) for t in types)


def hash_of(sel: Jhash, values: Sequence[Value]) -> int:
    """The number ``sel`` yields for a packet whose hashed fields hold ``values``."""
    data = Packer(key_types(sel)).pack(tuple(values))
    return nft_jhash(data, sel.modulus, sel.seed)
