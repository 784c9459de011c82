"""IP protocol numbers and the names nlproxy prints for them: one table, named views of it.

nft and conntrack spell protocols differently (nft prints ``meta l4proto 58`` as ``ipv6-icmp``,
after /etc/protocols, while ``conntrack -L`` says ``icmpv6``), and nlproxy's output matches each
tool's byte for byte, so both spellings live here side by side and each user reads its view:
``nft/render.py`` and ``nft/validate.py`` :data:`NFT_NAMES` and :data:`PORT_HEADERS`,
``conntrack/messages.py`` :data:`NAMES` and :data:`WITH_PORTS`. Numbers are IANA's (the
kernel's IPPROTO_*, linux/in.h). Pure data.
"""

from __future__ import annotations

from typing import NamedTuple

IPPROTO_ICMP = 1
IPPROTO_TCP = 6
IPPROTO_UDP = 17
IPPROTO_DCCP = 33
IPPROTO_GRE = 47
IPPROTO_ICMPV6 = 58
IPPROTO_SCTP = 132
IPPROTO_UDPLITE = 136


class IpProtocol(NamedTuple):
    number: int
    name: str
    """The protocol's keyword: how ``conntrack -L`` names it, and nft its header (``udplite
    dport``, ``icmpv6 type``)."""
    nft_value: str | None
    """How nft prints it as a value (``meta l4proto``, set elements); None: as its number."""
    ports: bool
    """Its header starts with the source and destination ports (nft's ``th``, conntrack's
    ``sport``/``dport``)."""


PROTOCOLS = (
    IpProtocol(IPPROTO_ICMP, "icmp", "icmp", ports=False),
    IpProtocol(IPPROTO_TCP, "tcp", "tcp", ports=True),
    IpProtocol(IPPROTO_UDP, "udp", "udp", ports=True),
    IpProtocol(IPPROTO_DCCP, "dccp", "dccp", ports=True),
    IpProtocol(IPPROTO_GRE, "gre", None, ports=False),
    IpProtocol(IPPROTO_ICMPV6, "icmpv6", "ipv6-icmp", ports=False),
    IpProtocol(IPPROTO_SCTP, "sctp", "sctp", ports=True),
    IpProtocol(IPPROTO_UDPLITE, "udplite", None, ports=True),
)
"""The protocols nlproxy names; any other prints as its number."""

NAMES = {p.number: p.name for p in PROTOCOLS}
"""Number -> keyword, as ``conntrack -L`` prints it."""
NUMBERS = {p.name: p.number for p in PROTOCOLS}
"""Keyword -> number."""
NFT_NAMES = {p.number: p.nft_value for p in PROTOCOLS if p.nft_value is not None}
"""Number -> the name nft prints for it as a value."""
PORT_HEADERS = {p.number: p.name for p in PROTOCOLS if p.ports}
"""Number -> keyword, for the protocols whose header carries ports."""
WITH_PORTS = frozenset(PORT_HEADERS)
"""The protocols whose header carries ports."""
