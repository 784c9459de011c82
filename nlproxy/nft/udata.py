"""libnftnl userdata: the TLVs nft stores with tables, chains, rules, sets and elements.

The encoder (``encode.py``) writes them, the read-back (``readback.py``) reads the comments back,
so both agree on nft 1.0.6's layout (``nftnl_udata``: a type byte, a length byte, the payload).
Pure: no I/O, no libnftnl; it never decides what to program.
"""

from __future__ import annotations

import struct

from nlproxy.nft.ir import DataType, Map, SetFlag, SetLike

# nft's byte order for each type, stored in a set's userdata (0 invalid, 1 host, 2 big endian).
_BYTEORDER = {
    DataType.IPV4_ADDR: 2,
    DataType.IPV6_ADDR: 2,
    DataType.INET_SERVICE: 2,
    DataType.MARK: 1,
    DataType.INTEGER: 1,
    DataType.INET_PROTO: 0,
    DataType.VERDICT: 0,
}
# NFTNL_UDATA_SET_*: what nft 1.0.6 writes for a set declared with ``type``.
_UD_KEYBYTEORDER, _UD_DATABYTEORDER, _UD_KEY_TYPEOF, _UD_DATA_TYPEOF = 0, 1, 3, 4
_UD_DATA_INTERVAL, _UD_SET_COMMENT = 6, 7
_UD_CONCAT = b"\x00\x04" + struct.pack("=I", 13) + b"\x01\x00"


# ``typeof`` declarations: nft stores each key/data expression's own userdata (nft 1.0.6,
# ``*_build_udata``): an expression type (nft's ``enum expr_types``), then its attributes.
_EXPR_PAYLOAD, _EXPR_META, _EXPR_CONCAT, _EXPR_NUMGEN = 7, 9, 13, 23
_NFT_META_L4PROTO, _NFT_NG_RANDOM = 16, 1
TYPEOF_MODULUS = 65536
"""The modulus written in a ``typeof ... numgen random mod N`` declaration. It only tells nft the
part's type (a 32-bit integer): the ``backends`` maps hold indexes 0..N-1 for every N."""
# The expression nlproxy declares each key/data type with, as (nft text, the expression's
# userdata). Payload: (nft's proto_desc_id, header template index): ip 12 / IPHDR_DADDR 12,
# ip6 13 / IP6HDR_DADDR 9, th 11 / THDR_DPORT 2.
_TYPEOF: dict[DataType, tuple[str, int, tuple[int, ...]]] = {
    DataType.IPV4_ADDR: ("ip daddr", _EXPR_PAYLOAD, (12, 12)),
    DataType.IPV6_ADDR: ("ip6 daddr", _EXPR_PAYLOAD, (13, 9)),
    DataType.INET_PROTO: ("meta l4proto", _EXPR_META, (_NFT_META_L4PROTO,)),
    DataType.INET_SERVICE: ("th dport", _EXPR_PAYLOAD, (11, 2)),
    DataType.INTEGER: (
        f"numgen random mod {TYPEOF_MODULUS}",
        _EXPR_NUMGEN,
        (_NFT_NG_RANDOM, TYPEOF_MODULUS, 0),
    ),
}


def needs_typeof(s: SetLike) -> bool:
    """Whether nft can only declare ``s`` with ``typeof`` (a part has no ``type`` name).

    Anonymous sets are never declared (nft lists them inline), so they need none.
    """
    if s.flags & SetFlag.ANONYMOUS:
        return False
    types = s.key + s.data if isinstance(s, Map) else s.key
    return DataType.INTEGER in types


def typeof_text(types: tuple[DataType, ...]) -> str:
    """The ``typeof`` expressions nlproxy declares ``types`` with (``ip daddr . th dport``)."""
    return " . ".join(_TYPEOF[t][0] for t in types)


def _u32s(values: tuple[int, ...]) -> bytes:
    return b"".join(udata_tlv(i, struct.pack("=I", v)) for i, v in enumerate(values))


def _typeof_udata(types: tuple[DataType, ...]) -> bytes:
    """One ``typeof`` TLV's payload: an expression, or a concatenation of them."""
    exprs = [_u32s((_TYPEOF[t][1],)) + udata_tlv(1, _u32s(_TYPEOF[t][2])) for t in types]
    if len(exprs) == 1:
        return exprs[0]
    items = b"".join(udata_tlv(i, e) for i, e in enumerate(exprs))
    return _u32s((_EXPR_CONCAT,)) + udata_tlv(1, items)


def udata_tlv(kind: int, payload: bytes) -> bytes:
    """One libnftnl userdata TLV: type byte, length byte, payload."""
    return bytes((kind, len(payload))) + payload


def comment_udata(comment: str) -> bytes:
    """A rule/chain/table comment as nft stores it: TLV type 0, NUL-terminated."""
    return udata_tlv(0, comment.encode() + b"\0")


def set_udata(s: SetLike) -> bytes:
    """A set's userdata as nft 1.0.6 writes it for its ``type`` (or ``typeof``) declaration."""
    single = len(s.key) == 1
    typeof = needs_typeof(s)
    out = udata_tlv(_UD_KEYBYTEORDER, struct.pack("=I", _BYTEORDER[s.key[0]] if single else 0))
    if isinstance(s, Map):
        order = _BYTEORDER[s.data[0]] if len(s.data) == 1 else 0
        out += udata_tlv(_UD_DATABYTEORDER, struct.pack("=I", order))
    if typeof:
        out += udata_tlv(_UD_KEY_TYPEOF, _typeof_udata(s.key))
    elif not single:
        out += udata_tlv(_UD_KEY_TYPEOF, _UD_CONCAT)
    if isinstance(s, Map) and typeof:
        out += udata_tlv(_UD_DATA_TYPEOF, _typeof_udata(s.data))
    elif isinstance(s, Map) and len(s.data) > 1:
        out += udata_tlv(_UD_DATA_TYPEOF, _UD_CONCAT)
    if isinstance(s, Map):
        out += udata_tlv(_UD_DATA_INTERVAL, struct.pack("=I", 0))
    if s.comment:
        out += udata_tlv(_UD_SET_COMMENT, s.comment.encode() + b"\0")
    return out


def udata_comment(udata: bytes, kind: int = 0) -> str:
    """The comment TLV (type ``kind``, NUL-terminated) in nftnl userdata, or ""."""
    off = 0
    while off + 2 <= len(udata):
        t, n = udata[off], udata[off + 1]
        if t == kind:
            return udata[off + 2 : off + 2 + n].rstrip(b"\0").decode(errors="replace")
        off += 2 + n
    return ""
