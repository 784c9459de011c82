"""``iifname``: the bytes a name or a name prefix is compared with, and reading them back."""

from __future__ import annotations

import pytest

from nlproxy.nft.decode import cmp_of
from nlproxy.nft.ir import Cmp, Field, Op, iifname_matches
from nlproxy.nft.lower import field_bytes
from nlproxy.nft.values import UndecodableError

IIFNAME = Field.META_IIFNAME


@pytest.mark.parametrize(
    ("pattern", "data"),
    [
        pytest.param("cbr0", b"cbr0" + bytes(12), id="name-padded-to-ifnamsiz"),
        pytest.param("abcdefghijklmno", b"abcdefghijklmno\0", id="longest-name"),
        pytest.param("veth*", b"veth", id="prefix-own-bytes"),
        pytest.param("e*", b"e", id="one-byte-prefix"),
    ],
)
def test_compared_bytes_and_back(pattern: str, data: bytes) -> None:
    assert field_bytes(IIFNAME, pattern) == data
    for op in (Op.EQ, Op.NE):
        assert cmp_of(IIFNAME, 16, op, data, None, None) == Cmp(IIFNAME, pattern, op)


@pytest.mark.parametrize(
    ("op", "data", "mask"),
    [
        pytest.param(Op.EQ, b"eth0\0x" + bytes(10), None, id="bytes-after-the-nul"),
        pytest.param(Op.EQ, b"eth\0", None, id="short-with-nul"),
        pytest.param(Op.EQ, bytes(16), None, id="empty-name"),
        pytest.param(Op.LT, b"eth0" + bytes(12), None, id="ordering"),
        pytest.param(Op.EQ, b"eth0" + bytes(12), b"\xff" * 16, id="masked"),
        pytest.param(Op.EQ, b"\xff\xfe", None, id="not-utf8"),
    ],
)
def test_other_compares_are_not_read_as_a_name(op: Op, data: bytes, mask: bytes | None) -> None:
    with pytest.raises(UndecodableError):
        cmp_of(IIFNAME, 16, op, data, mask, None)


def test_a_name_only_compares_with_iifname() -> None:
    with pytest.raises(ValueError, match="th dport"):
        field_bytes(Field.TH_DPORT, "eth0")


@pytest.mark.parametrize(
    ("pattern", "name", "hit"),
    [
        ("veth*", "veth12ab", True),
        ("veth*", "veth", True),
        ("veth*", "eth0", False),
        ("cbr0", "cbr0", True),
        ("cbr0", "cbr01", False),
        ("cbr0", "cbr", False),
    ],
)
def test_matches(pattern: str, name: str, hit: bool) -> None:
    assert iifname_matches(pattern, name) is hit
