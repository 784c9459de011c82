"""Element read-back through learnt layouts gives what walking every element gives, for every
kind of element attribute, and for elements that only look alike (same length, other
attributes)."""

from __future__ import annotations

import struct

from nlproxy.nft.readsets import Layouts, _parse_elements, _records
from nlproxy.nft.udata import comment_udata

NESTED = 0x8000


def nla(kind: int, payload: bytes, nested: bool = False) -> bytes:
    length = 4 + len(payload)
    return (
        struct.pack("=HH", length, kind | (NESTED if nested else 0)) + payload + bytes(-length % 4)
    )


def value(v: bytes) -> bytes:
    return nla(1, v)  # NFTA_DATA_VALUE


def element(
    key: bytes,
    *,
    key_end: bytes | None = None,
    flags: int | None = None,
    data: bytes | None = None,
    verdict: tuple[int | None, str | None] | None = None,
    timeout_ms: int | None = None,
    comment: str | None = None,
    no_key_value: bool = False,
) -> bytes:
    attrs = nla(1, b"" if no_key_value else value(key), nested=True)  # NFTA_SET_ELEM_KEY
    if key_end is not None:
        attrs += nla(10, value(key_end), nested=True)
    if flags is not None:
        attrs += nla(3, struct.pack(">I", flags))
    if data is not None:
        attrs += nla(2, value(data), nested=True)
    if verdict is not None:
        code, chain = verdict
        inner = b"" if code is None else nla(1, struct.pack(">i", code))
        inner += b"" if chain is None else nla(2, chain.encode() + b"\0")
        attrs += nla(2, nla(2, inner, nested=True), nested=True)
    if timeout_ms is not None:
        attrs += nla(4, struct.pack(">Q", timeout_ms))
    if comment is not None:
        attrs += nla(6, comment_udata(comment))
    return nla(1, attrs, nested=True)  # NFTA_LIST_ELEM


def message(*elements: bytes) -> bytes:
    """An NFT_MSG_NEWSETELEM payload: nfgenmsg, set and table names, the element list."""
    head = struct.pack("=BBH", 2, 0, 0) + nla(1, b"t\0") + nla(2, b"s\0")
    return head + nla(3, b"".join(elements), nested=True)


ELEMENTS = [
    element(b"\x0a\x00\x00\x01", data=b"\x0a\x80\x00\x01\x1f\x90\x00\x00"),
    element(b"\x0a\x00\x00\x02", data=b"\x0a\x80\x00\x02\x1f\x90\x00\x00"),
    element(b"\x0a\x00\x00\x03", verdict=(-4, "svc-abc")),  # goto
    element(b"\x0a\x00\x00\x04", verdict=(-4, "svc-xyz")),
    element(b"\x0a\x00\x00\x05", verdict=(1, None)),  # accept
    element(b"\x0a\x00\x00\x06", verdict=(None, None)),  # a verdict without a code: 0
    element(b"\x0a\x00\x00\x07", flags=1, timeout_ms=5000, comment="default/web:http"),
    element(b"\x0a\x00\x00\x08", flags=0, timeout_ms=7000, comment="default/web:htt2"),
    element(b"\x0a\x00\x00\x00", key_end=b"\x0a\x00\x00\xff"),
    element(b"\x0a\x00\x01\x00", key_end=b"\x0a\x00\x01\xff"),
    element(b"", no_key_value=True),
    element(b"\x0a\x00\x00\x09", comment="x" * 3),  # same length as the next, other attribute
    element(b"\x0a\x00\x00\x0a", timeout_ms=1),
]


def test_learnt_layouts_read_what_the_walk_reads() -> None:
    payload = message(*ELEMENTS)
    walked = _parse_elements(payload)
    layouts: Layouts = {}
    assert _parse_elements(payload, layouts) == walked  # learning
    assert layouts
    assert _parse_elements(payload, layouts) == walked  # reading through what was learnt
    assert _parse_elements(message(*reversed(ELEMENTS)), layouts) == walked[::-1]
    assert [e.comment for e in walked][6:8] == ["default/web:http", "default/web:htt2"]
    assert walked[5].verdict == 0


def _pairs(payload: bytes) -> tuple[list[bytes], list[bytes]]:
    walked = _parse_elements(payload)
    return [e.key for e in walked], [e.data or b"" for e in walked]


def test_records_of_one_layout_are_sliced_as_walking_them_reads_them() -> None:
    """A dynamic map's elements (key, address . port data, a timeout each) come from
    ``_records`` as from walking each; elements of mixed layouts, or a verdict map's, are left
    to the walk."""
    clients = [
        element(
            bytes([10, 0, i // 256, i % 256]),
            data=bytes([10, 1, 0, i % 7, 0, 80, 0, 0]),
            timeout_ms=600_000 - i,
        )
        for i in range(300)
    ]
    payload = message(*clients)
    assert _records(payload) == _pairs(payload)
    assert _records(message()) == ([], [])
    plain_set = message(*(element(bytes([10, 0, 0, i])) for i in range(5)))
    assert _records(plain_set) == _pairs(plain_set)
    mixed = message(*clients[:3], element(bytes([10, 9, 9, 9]), data=bytes(8)))
    assert _records(mixed) is None
    other_flags = message(*clients[:3], element(bytes([10, 9, 9, 9]), data=bytes(8), flags=1))
    assert _records(other_flags) is None
    verdicts = message(*(element(bytes([10, 0, 0, i]), verdict=(-3, "c")) for i in range(3)))
    assert _records(verdicts) is None
