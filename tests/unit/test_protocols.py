"""One protocol table, two spellings: each tool's name for each number, as nlproxy prints it
where the tool would (nft's values and headers, ``conntrack -L``'s protocol column)."""

from __future__ import annotations

import pytest

from nlproxy.conntrack.messages import LINE_PROTO_NAMES, PORT_PROTOS, PROTO_NUMBERS
from nlproxy.netlink import protocols
from nlproxy.nft.ir import DataType
from nlproxy.nft.validate import format_value


@pytest.mark.parametrize(
    ("number", "nft_value", "header", "conntrack"),
    [
        pytest.param(1, "icmp", None, "icmp", id="icmp"),
        pytest.param(6, "tcp", "tcp", "tcp", id="tcp"),
        pytest.param(17, "udp", "udp", "udp", id="udp"),
        pytest.param(33, "dccp", "dccp", "dccp", id="dccp"),
        pytest.param(47, "47", None, "gre", id="gre-a-number-to-nft"),
        pytest.param(58, "ipv6-icmp", None, "icmpv6", id="icmpv6-spelt-two-ways"),
        pytest.param(132, "sctp", "sctp", "sctp", id="sctp"),
        pytest.param(136, "136", "udplite", "udplite", id="udplite-a-header-not-a-value"),
        pytest.param(4, "4", None, None, id="unnamed"),
    ],
)
def test_each_tool_spells_each_protocol_its_way(
    number: int, nft_value: str, header: str | None, conntrack: str | None
) -> None:
    assert protocols.NFT_NAMES.get(number, str(number)) == nft_value
    assert format_value(number, DataType.INET_PROTO) == nft_value
    assert protocols.PORT_HEADERS.get(number) == header
    assert (number in PORT_PROTOS) == (header is not None)
    assert LINE_PROTO_NAMES.get(number) == conntrack


def test_views_come_from_one_table() -> None:
    numbers = {p.number for p in protocols.PROTOCOLS}
    assert set(protocols.NAMES) == numbers
    assert set(protocols.NFT_NAMES).issubset(numbers)
    assert protocols.WITH_PORTS.issubset(numbers)
    assert {protocols.NUMBERS[name] for name in PROTO_NUMBERS} == {6, 17, 132}
