"""Which chains are kube-proxy's (removed by ``cleanup --kube-proxy``) and which the kubelet's."""

from __future__ import annotations

import pytest

from nlproxy.inspect.foreign import ForeignTable, is_kube_proxy_chain


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
