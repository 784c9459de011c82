"""Kernel numbers of the nftables expressions nlproxy writes and reads, defined once.

Shared by the lowering (``lower.py``, IR → netlink expressions) and its inverse, the decoder
(``decode.py``), and by the encoder and read-back for table and element flags, so both directions
spell each uapi value the same way. :data:`FIELD_LOADS` says where each IR field lives (which
expression loads it, from where, how many bytes); the decoder's lookup tables are derived from
it. Constants keep their uapi names (linux/netfilter/nf_tables.h, nf_nat.h). Pure data: no I/O,
no libnftnl.
"""

from __future__ import annotations

from nlproxy.nft.ir import Family, Field, Op, RejectKind

# linux/netfilter/nf_tables.h
NFT_REG_VERDICT = 0
NFT_REG_1 = 1
NFT_REG32_00 = 8
NFT_PAYLOAD_NETWORK_HEADER = 1
NFT_PAYLOAD_TRANSPORT_HEADER = 2
NFT_META_MARK = 3
NFT_META_NFPROTO = 15
NFT_META_L4PROTO = 16
NFT_META_IIF = 4
NFT_CT_STATE = 0
NFT_CT_STATUS = 2
NFT_CT_PROTO_DST = 12
NFT_CT_DST_IP = 20
NFT_CT_DST_IP6 = 22
IP_CT_DIR_ORIGINAL = 0  # nf_conntrack_tuple_common.h
LOOPBACK_IFINDEX = 1  # net/net_namespace.h: lo, in every network namespace
NFT_LOOKUP_F_INV = 0x1
NFT_NAT_DNAT = 1
NFT_REJECT_ICMP_UNREACH = 0
NFT_REJECT_TCP_RST = 1
NFT_REJECT_ICMPX_UNREACH = 2
NFT_DYNSET_OP_UPDATE = 1
NFT_NG_RANDOM = 1
NFT_HASH_JENKINS = 0
NFT_FIB_RESULT_ADDRTYPE = 3
NFTA_FIB_F_SADDR = 1 << 0
NFTA_FIB_F_DADDR = 1 << 1
NFT_TABLE_F_OWNER = 0x2
NFT_TABLE_F_PERSIST = 0x4
NFT_SET_ELEM_INTERVAL_END = 0x1
# linux/netfilter/nf_nat.h
NF_NAT_RANGE_MAP_IPS = 0x1
NF_NAT_RANGE_PROTO_SPECIFIED = 0x2
NF_NAT_RANGE_PROTO_RANDOM_FULLY = 0x10

CMP_OPS = {Op.EQ: 0, Op.NE: 1, Op.LT: 2, Op.LE: 3, Op.GT: 4, Op.GE: 5}
"""enum nft_cmp_ops."""
REJECT_TYPES = {
    RejectKind.ICMP: NFT_REJECT_ICMP_UNREACH,
    RejectKind.TCP_RESET: NFT_REJECT_TCP_RST,
    RejectKind.ICMPX: NFT_REJECT_ICMPX_UNREACH,
}
DEFAULT_REJECT_CODE = {Family.IP: 3, Family.IP6: 4}
"""ICMP port-unreachable (ip) and ICMPv6 port-unreachable (ip6): what a bare ``reject`` sends."""
ICMPX_PORT_UNREACH = 1
BITMASK_FIELDS = frozenset({Field.CT_STATE, Field.CT_STATUS})
"""Fields nft compares as bit tests: ``ct state new`` is ``(state & new) != 0``."""

FIELD_LOADS: dict[Field, tuple[str, int, int, int]] = {
    # Field: (expression, payload base or key or fib flags, offset, length)
    Field.IP_SADDR: ("payload", NFT_PAYLOAD_NETWORK_HEADER, 12, 4),
    Field.IP_DADDR: ("payload", NFT_PAYLOAD_NETWORK_HEADER, 16, 4),
    Field.IP6_SADDR: ("payload", NFT_PAYLOAD_NETWORK_HEADER, 8, 16),
    Field.IP6_DADDR: ("payload", NFT_PAYLOAD_NETWORK_HEADER, 24, 16),
    Field.TH_SPORT: ("payload", NFT_PAYLOAD_TRANSPORT_HEADER, 0, 2),
    Field.TH_DPORT: ("payload", NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2),
    Field.META_L4PROTO: ("meta", NFT_META_L4PROTO, 0, 1),
    Field.META_MARK: ("meta", NFT_META_MARK, 0, 4),
    Field.META_NFPROTO: ("meta", NFT_META_NFPROTO, 0, 1),
    Field.CT_STATE: ("ct", NFT_CT_STATE, 0, 4),
    Field.CT_STATUS: ("ct", NFT_CT_STATUS, 0, 4),
    Field.META_IIF: ("meta", NFT_META_IIF, 0, 4),
    # ``ct original …``: loaded with NFTA_CT_DIRECTION original, as nft 1.0.6 does
    # (``ct load dst_ip => reg 1 , dir original``).
    Field.CT_ORIGINAL_IP_DADDR: ("ct original", NFT_CT_DST_IP, 0, 4),
    Field.CT_ORIGINAL_IP6_DADDR: ("ct original", NFT_CT_DST_IP6, 0, 16),
    Field.CT_ORIGINAL_PROTO_DST: ("ct original", NFT_CT_PROTO_DST, 0, 2),
    Field.FIB_DADDR_TYPE: ("fib", NFTA_FIB_F_DADDR, 0, 4),
    Field.FIB_SADDR_TYPE: ("fib", NFTA_FIB_F_SADDR, 0, 4),
}


def field_family(f: Field) -> Family | None:
    """The family whose network header holds ``f`` (``ip saddr``: ip), None for other fields."""
    if f.text.startswith("ip "):
        return Family.IP
    return Family.IP6 if f.text.startswith("ip6 ") else None
