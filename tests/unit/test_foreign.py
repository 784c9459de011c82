"""Which chains are kube-proxy's (removed by ``cleanup --kube-proxy``) and which the kubelet's."""

from __future__ import annotations

import struct

import pytest

from nlproxy.inspect.foreign import ForeignTable, is_foreign_change, is_kube_proxy_chain


@pytest.mark.parametrize(
    "chain",
    ["KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ", "KUBE-FORWARD",
     "KUBE-PROXY-FIREWALL", "KUBE-PROXY-CANARY", "KUBE-EXTERNAL-SERVICES",
     "KUBE-SVC-ABCDEFGHIJKLMNOP", "KUBE-SEP-ABCDEFGHIJKLMNOP", "KUBE-EXT-NPX46M4PTMTKRN6Y",
     "KUBE-SVL-TCOU7JCQXEZGVUNU", "KUBE-FW-ERIFXISQEP7F7OF4", "KUBE-XLB-JD5MR3NA4I4DYORP",
     # IPVS mode
     "KUBE-NODE-PORT", "KUBE-LOAD-BALANCER", "KUBE-IPVS-FILTER", "KUBE-IPVS-OUT-FILTER",
     "KUBE-SOURCE-RANGES-FIREWALL"],
)  # fmt: skip
def test_kube_proxy_chains(chain: str) -> None:
    assert is_kube_proxy_chain(chain)


@pytest.mark.parametrize(
    "chain",
    ["KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT", "PREROUTING", "CNI-HOSTPORT",
     "KUBE-SERVICES-EXTRA", "cali-PREROUTING",
     # A user's chains that only start like kube-proxy's (issue 26: KUBE-FW-USER was deleted)
     "KUBE-FW-USER", "KUBE-SVC-X", "KUBE-SEP-abcdefghijklmnop", "KUBE-SVC-ABCDEFGHIJKLMNOPQ",
     "KUBE-SVC-ABCDEFGHIJKLMNO1"],
)  # fmt: skip
def test_chains_of_others_are_left_alone(chain: str) -> None:
    assert not is_kube_proxy_chain(chain)


def test_descriptions_name_the_table_and_mode() -> None:
    own = ForeignTable(family="ip6", table="kube-proxy", mode="nftables", chains=())
    shared = ForeignTable(family="ip", table="nat", mode="iptables-nft", chains=("KUBE-SERVICES",))
    assert own.describe == "table ip6 kube-proxy (kube-proxy, nftables mode)"
    assert shared.describe == "1 KUBE-* chains in table ip nat (kube-proxy, iptables-nft)"


def notification(msg: int, family: int, table: str, **names: str) -> tuple[int, bytes]:
    """An nftables notification as the kernel sends it: nfgenmsg, then the table's name
    (attribute 1 in table, chain and rule messages) and a chain name (3 for NEWCHAIN's
    NFTA_CHAIN_NAME, 2 for NEWRULE's NFTA_RULE_CHAIN)."""
    attrs = nla(1, table.encode() + b"\0")
    if "chain" in names:
        attrs += nla(3 if msg in (3, 5) else 2, names["chain"].encode() + b"\0")
    return (10 << 8) | msg, struct.pack("!BBH", family, 0, 0) + attrs


def nla(kind: int, value: bytes) -> bytes:
    return struct.pack("=HH", 4 + len(value), kind) + value + bytes(-len(value) % 4)


@pytest.mark.parametrize(
    ("message", "foreign"),
    [
        pytest.param(notification(0, 2, "kube-proxy"), True, id="new-kube-proxy-table"),
        pytest.param(notification(6, 10, "kube-proxy", chain="services"), True, id="rule-ip6"),
        pytest.param(notification(3, 2, "nat", chain="KUBE-SERVICES"), True, id="iptables-chain"),
        pytest.param(
            notification(6, 2, "filter", chain="KUBE-IPVS-FILTER"), True, id="ipvs-filter-rule"
        ),
        pytest.param(notification(3, 2, "nat", chain="KUBE-FW-USER"), False, id="user-chain"),
        pytest.param(notification(6, 2, "nat", chain="CNI-HOSTPORT"), False, id="cni-rule"),
        pytest.param(notification(0, 2, "nlproxy"), False, id="own-table"),
        pytest.param(notification(2, 2, "kube-proxy"), True, id="table-deleted"),
        pytest.param(notification(5, 2, "nat", chain="KUBE-SERVICES"), True, id="chain-deleted"),
        pytest.param(notification(2, 2, "nat"), False, id="nat-table-deleted"),
        pytest.param(notification(12, 2, "kube-proxy"), False, id="set-element"),
        pytest.param(notification(0, 1, "kube-proxy"), False, id="inet-family"),
    ],
)
def test_kube_proxy_writing_again_is_told_from_one_notification(
    message: tuple[int, bytes], foreign: bool
) -> None:
    assert is_foreign_change(*message) is foreign
