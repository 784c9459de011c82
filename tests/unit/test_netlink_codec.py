"""The netlink codec: what it writes the kernel reads, and what it cannot vouch for it does not
read (short, overlong and truncated attributes; short messages)."""

from __future__ import annotations

import ast
import struct
from pathlib import Path

import pytest

from nlproxy.netlink import codec


def test_attribute_is_padded_and_nested_flag_masked_on_read() -> None:
    inner = codec.u8_attr(1, 7) + codec.str_attr(2, "abc")
    outer = codec.nest(5, inner)
    assert codec.u8_attr(1, 7) == struct.pack("=HH", 5, 1) + b"\x07\0\0\0"
    assert struct.unpack_from("=HH", outer) == (4 + len(inner), 5 | codec.NLA_F_NESTED)
    [(kind, payload)] = codec.attributes(outer)
    assert kind == 5
    assert codec.attribute_map(payload) == {1: b"\x07", 2: b"abc\0"}
    assert codec.text(codec.attribute_map(payload)[2]) == "abc"


def test_integers_are_big_endian_but_u32_host_order() -> None:
    attrs = codec.attribute_map(
        codec.be16_attr(1, 0x1234)
        + codec.be32_attr(2, 0x12345678)
        + codec.be64_attr(3, 1 << 40)
        + codec.u32_attr(4, 0x12345678)
    )
    assert codec.be16(attrs[1]) == 0x1234
    assert codec.be32(attrs[2]) == 0x12345678
    assert codec.be64(attrs[3]) == 1 << 40
    assert attrs[4] == struct.pack("=I", 0x12345678)


@pytest.mark.parametrize(
    ("tail", "why"),
    [
        pytest.param(struct.pack("=HH", 2, 9), "shorter than its header", id="short"),
        pytest.param(struct.pack("=HH", 40, 9) + b"\0" * 4, "longer than what is left", id="long"),
        pytest.param(b"\0\0", "a header cut short", id="truncated"),
    ],
)
def test_walk_stops_at_what_it_cannot_vouch_for(tail: bytes, why: str) -> None:
    buf = codec.be32_attr(1, 1) + tail + codec.be32_attr(2, 2)
    seen: list[int] = []
    found = list(codec.spans_noting(buf, 0, len(buf), seen))
    assert list(codec.spans(buf)) == found
    assert [kind for kind, _, _ in found] == [1], why
    # the header that stopped the walk was read, so a layout check covers it
    assert seen == [0, 8]


def test_span_map_keeps_the_last_of_a_repeated_type_and_honours_end() -> None:
    buf = codec.be32_attr(3, 1) + codec.be32_attr(3, 2) + codec.be32_attr(4, 3)
    spans = codec.span_map(buf, 0, 16)
    assert set(spans) == {3}
    start, end = spans[3]
    assert codec.be32(buf[start:end]) == 2


def test_nfnl_message_frames_header_and_nfgenmsg() -> None:
    attrs = codec.str_attr(1, "t")
    msg = codec.nfnl_message(codec.nfnl_type(10, 1), codec.NLM_F_REQUEST, 7, 2, attrs, res_id=10)
    [(mtype, flags, seq, start, end)] = codec.headers(msg)
    assert (mtype, flags, seq) == ((10 << 8) | 1, codec.NLM_F_REQUEST, 7)
    assert end == len(msg)
    assert msg[start:end][:4] == b"\x02\x00\x00\x0a"  # family 2, version 0, res_id big-endian
    assert codec.nfnl_attributes(msg[start:end]) == {1: b"t\0"}


def _error(errno: int, seq: int, tlvs: bytes = b"", flags: int = 0) -> bytes:
    original = codec.nlmsghdr(20, 0x0A01, codec.NLM_F_REQUEST, seq)
    payload = struct.pack("=i", -errno) + original + tlvs
    return codec.nlmsghdr(16 + len(payload), codec.NLMSG_ERROR, flags, seq) + payload


def test_error_messages_name_errno_sequence_and_extended_ack() -> None:
    tlvs = codec.str_attr(codec.NLMSGERR_ATTR_MSG, "bad table") + codec.u32_attr(
        codec.NLMSGERR_ATTR_OFFS, 24
    )
    flags = codec.NLM_F_CAPPED | codec.NLM_F_ACK_TLVS
    datagram = _error(2, 5, tlvs, flags) + _error(0, 6)
    nack, ack = codec.parse_messages(datagram)
    assert (nack.type, nack.error, nack.error_seq) == (codec.NLMSG_ERROR, 2, 5)
    assert nack.ext_ack() == ("bad table", 24)
    assert (ack.error, ack.error_seq, ack.ext_ack()) == (0, 6, ("", None))
    _, _, _, start, _ = next(codec.headers(datagram))
    assert codec.error_code(datagram, start) == 2


def test_a_message_shorter_than_its_header_ends_the_datagram() -> None:
    good = codec.nfnl_message(codec.NFNL_MSG_BATCH_BEGIN, 0, 1, 0)
    bad = struct.pack("=IHHII", 8, 0, 0, 2, 0)
    assert [m.seq for m in codec.parse_messages(good + bad + good)] == [1]


def test_netlink_knows_nothing_of_its_users() -> None:
    """netlink/ is transport: it imports no stage (nft, conntrack, inspect, ...)."""
    package = Path(codec.__file__).parent
    imported = set()
    for module in package.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
    ours = {name for name in imported if name.startswith("nlproxy.")}
    assert ours <= {"nlproxy.errors", "nlproxy.netlink", "nlproxy.netlink.codec"}, ours
