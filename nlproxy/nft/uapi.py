"""Kernel numbers of the nftables expressions nlproxy writes and reads, defined once.

Shared by the lowering (``lower.py``, IR → netlink expressions) and its inverse, the decoder
(``decode.py``), by the encoder and read-back for table and element flags, so both directions
spell each uapi value the same way, and by everything that reads nftables messages itself
(backend, read-back, monitor, the foreign-rules finder): message types and NFTA_* attributes.
:data:`FIELD_LOADS` says where each IR field lives (which expression loads it, from where, how
many bytes); the decoder's lookup tables are derived from it. Constants keep their uapi names
(linux/netfilter/nf_tables.h, nf_nat.h). Pure data: no I/O, no libnftnl.
"""

from __future__ import annotations

from nlproxy.nft.ir import Family, Field, Op, RejectKind

# linux/netfilter/nfnetlink.h
NFNL_SUBSYS_NFTABLES = 10
NFNLGRP_NFTABLES = 7
# linux/netfilter/nf_tables.h: enum nf_tables_msg_types
NFT_MSG_NEWTABLE = 0
NFT_MSG_GETTABLE = 1
NFT_MSG_DELTABLE = 2
NFT_MSG_NEWCHAIN = 3
NFT_MSG_GETCHAIN = 4
NFT_MSG_DELCHAIN = 5
NFT_MSG_NEWRULE = 6
NFT_MSG_GETRULE = 7
NFT_MSG_DELRULE = 8
NFT_MSG_NEWSET = 9
NFT_MSG_GETSET = 10
NFT_MSG_DELSET = 11
NFT_MSG_NEWSETELEM = 12
NFT_MSG_GETSETELEM = 13
NFT_MSG_DELSETELEM = 14  # the last message about an object of a table
NFT_MSG_NEWGEN = 15
NFT_MSG_GETGEN = 16
NFT_MSG_DESTROYTABLE = 26
NFT_MSG_DESTROYCHAIN = 27
NFT_MSG_DESTROYRULE = 28
NFT_MSG_DESTROYSET = 29
NFT_MSG_DESTROYSETELEM = 30
# linux/netfilter/nf_tables.h: netlink attributes (NFTA_*)
NFTA_LIST_ELEM = 1
NFTA_TABLE_NAME = 1
NFTA_CHAIN_TABLE = 1
NFTA_CHAIN_NAME = 3
NFTA_RULE_TABLE = 1
NFTA_RULE_CHAIN = 2
NFTA_RULE_HANDLE = 3
NFTA_RULE_EXPRESSIONS = 4
NFTA_EXPR_NAME = 1
NFTA_EXPR_DATA = 2
NFTA_IMMEDIATE_DATA = 2
NFTA_DATA_VALUE = 1
NFTA_DATA_VERDICT = 2
NFTA_VERDICT_CODE = 1
NFTA_VERDICT_CHAIN = 2
NFTA_SET_TABLE = 1
NFTA_SET_NAME = 2
NFTA_SET_FLAGS = 3
NFTA_SET_KEY_TYPE = 4
NFTA_SET_KEY_LEN = 5
NFTA_SET_DATA_TYPE = 6
NFTA_SET_DATA_LEN = 7
NFTA_SET_TIMEOUT = 11
NFTA_SET_EXPR = 17
NFTA_SET_EXPRESSIONS = 18
NFTA_SET_ELEM_LIST_TABLE = 1
NFTA_SET_ELEM_LIST_ELEMENTS = 3
NFTA_SET_ELEM_KEY = 1
NFTA_SET_ELEM_DATA = 2
NFTA_SET_ELEM_FLAGS = 3
NFTA_SET_ELEM_TIMEOUT = 4
NFTA_SET_ELEM_USERDATA = 6
NFTA_SET_ELEM_EXPR = 7
NFTA_SET_ELEM_KEY_END = 10
NFTA_SET_ELEM_EXPRESSIONS = 11
NFTA_COUNTER_BYTES = 1
NFTA_COUNTER_PACKETS = 2
NFTA_GEN_ID = 1
NFTA_GEN_PROC_PID = 2
NFTA_GEN_PROC_NAME = 3
# linux/netfilter/nf_tables.h: values
NFT_REG_VERDICT = 0
NFT_REG_1 = 1
NFT_REG32_00 = 8
NFT_PAYLOAD_NETWORK_HEADER = 1
NFT_PAYLOAD_TRANSPORT_HEADER = 2
NFT_META_MARK = 3
NFT_META_NFPROTO = 15
NFT_META_L4PROTO = 16
NFT_META_IIF = 4
NFT_META_IIFNAME = 6
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
    Field.META_IIFNAME: ("meta", NFT_META_IIFNAME, 0, 16),  # IFNAMSIZ, NUL padded
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
