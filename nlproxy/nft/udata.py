"""libnftnl userdata: the TLVs nft stores with tables, chains, rules, sets and elements.

The encoder (``encode.py``) writes them, the read-back (``readback.py``) reads the comments back,
so both agree on nft 1.0.6's layout (``nftnl_udata``: a type byte, a length byte, the payload).
Pure: no I/O, no libnftnl; it never decides what to program.
"""

from __future__ import annotations

import struct

from nlproxy.nft.ir import DataType, Map, SetLike

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


def udata_comment(udata: bytes, kind: int = 0) -> str:
    """The comment TLV (type ``kind``, NUL-terminated) in nftnl userdata, or ""."""
    off = 0
    while off + 2 <= len(udata):
        t, n = udata[off], udata[off + 1]
        if t == kind:
            return udata[off + 2 : off + 2 + n].rstrip(b"\0").decode(errors="replace")
        off += 2 + n
    return ""
