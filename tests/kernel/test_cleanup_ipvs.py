"""``cleanup --kube-proxy`` on what kube-proxy's IPVS mode leaves, as far as this kernel has it.

Made by the real tools, as kube-proxy makes them: its iptables chains with the real
``iptables`` (iptables-nft), its ipsets with the real ``ipset``, referenced from a rule by
``-m set``. This kernel has neither IPVS nor dummy devices: the virtual servers and the
``kube-ipvs0`` dummy are covered by the message tests (tests/unit/test_ipvs.py) and the VM test
(vm-tests/test_7_ipvs.py); here a non-dummy ``kube-ipvs0`` shows that only a dummy is taken.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable

import pytest

IPSETS = ("KUBE-CLUSTER-IP", "KUBE-NODE-PORT-TCP", "KUBE-6-CLUSTER-IP", "KUBE-LOOP-BACK")
USER_IPSETS = ("KUBE-USER-ALLOW", "blocklist")


def run(ns: str, *argv: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", ns, *argv],
        check=True, capture_output=True, text=True, timeout=30,
    ).stdout  # fmt: skip


def cli(ns: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nlproxy", "--netns", ns, *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.fixture
def ipvs_node(make_netns: Callable[[str], str]) -> str:
    if shutil.which("ipset") is None:
        pytest.fail("the ipset tool is missing (scripts/install-debs.sh installs it)")
    ns = make_netns("ipvs")
    run(ns, "ipset", "create", "KUBE-CLUSTER-IP", "hash:ip,port")
    run(ns, "ipset", "create", "KUBE-NODE-PORT-TCP", "bitmap:port", "range", "0-65535")
    run(ns, "ipset", "create", "KUBE-6-CLUSTER-IP", "hash:ip,port", "family", "inet6")
    run(ns, "ipset", "create", "KUBE-LOOP-BACK", "hash:ip,port,ip")
    run(ns, "ipset", "add", "KUBE-CLUSTER-IP", "10.96.0.1,tcp:443")
    for name in USER_IPSETS:
        run(ns, "ipset", "create", name, "hash:ip")
    ipt = ("iptables-nft",)
    for table, chain in (
        ("nat", "KUBE-SERVICES"), ("nat", "KUBE-POSTROUTING"), ("nat", "KUBE-NODE-PORT"),
        ("nat", "KUBE-LOAD-BALANCER"), ("nat", "KUBE-MARK-MASQ"), ("filter", "KUBE-FORWARD"),
        ("filter", "KUBE-NODE-PORT"), ("filter", "KUBE-PROXY-FIREWALL"),
        ("filter", "KUBE-SOURCE-RANGES-FIREWALL"), ("filter", "KUBE-IPVS-FILTER"),
        ("filter", "KUBE-IPVS-OUT-FILTER"),
        # Not kube-proxy's: the kubelet's, and a user's chain named like kube-proxy's
        ("filter", "KUBE-FIREWALL"), ("filter", "KUBE-FW-USER"),
    ):  # fmt: skip
        run(ns, *ipt, "-t", table, "-N", chain)
    for table, rule in (
        ("nat", "-A PREROUTING -j KUBE-SERVICES"),
        ("nat", "-A OUTPUT -j KUBE-SERVICES"),
        ("nat", "-A POSTROUTING -j KUBE-POSTROUTING"),
        ("nat", "-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT"),
        ("nat", "-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT"),
        ("nat", "-A KUBE-NODE-PORT -p tcp -m set --match-set KUBE-NODE-PORT-TCP dst -j ACCEPT"),
        ("filter", "-A INPUT -j KUBE-IPVS-FILTER"),
        ("filter", "-A INPUT -j KUBE-NODE-PORT"),
        ("filter", "-A OUTPUT -j KUBE-IPVS-OUT-FILTER"),
        ("filter", "-A FORWARD -j KUBE-FORWARD"),
        ("filter", "-A KUBE-IPVS-FILTER -m set --match-set KUBE-LOOP-BACK dst,dst,src -j RETURN"),
        ("filter", "-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -j REJECT"),
        ("filter", "-A INPUT -j KUBE-FIREWALL"),
        ("filter", "-A INPUT -j KUBE-FW-USER"),
        ("filter", "-A KUBE-FW-USER -m set --match-set blocklist src -j DROP"),
    ):
        run(ns, *ipt, "-t", table, *rule.split())
    # A kube-ipvs0 that is not a dummy is not kube-proxy's.
    run(ns, "ip", "link", "add", "kube-ipvs0", "type", "bridge")
    run(ns, "ip", "addr", "add", "10.96.0.1/32", "dev", "kube-ipvs0")
    return ns


def test_ipvs_leftovers_removed_exactly_and_idempotently(ipvs_node: str) -> None:
    ns = ipvs_node
    inspected = cli(ns, "inspect")
    assert "another proxy's rules: 4 KUBE-* ipsets (kube-proxy, IPVS)" in inspected.stderr
    first = cli(ns, "cleanup", "--kube-proxy")
    assert first.returncode == 0, first.stderr
    assert "removed: 4 KUBE-* ipsets (kube-proxy, IPVS)" in first.stdout
    assert "removed: 5 KUBE-* chains in table ip nat (kube-proxy, iptables-nft)" in first.stdout
    assert "removed: 6 KUBE-* chains in table ip filter (kube-proxy, iptables-nft)" in first.stdout

    assert sorted(run(ns, "ipset", "list", "-n").split()) == sorted(USER_IPSETS)
    saved = run(ns, "iptables-nft-save")
    for gone in ("KUBE-SERVICES", "KUBE-IPVS-FILTER", "KUBE-NODE-PORT", "KUBE-LOAD-BALANCER",
                 "KUBE-IPVS-OUT-FILTER", "KUBE-SOURCE-RANGES-FIREWALL", "REJECT"):  # fmt: skip
        assert gone not in saved, saved
    assert "-A INPUT -j KUBE-FIREWALL" in saved
    assert "-A KUBE-FW-USER -m set --match-set blocklist src -j DROP" in saved
    assert "kube-ipvs0" in run(ns, "ip", "-br", "link")

    again = cli(ns, "cleanup", "--kube-proxy")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "no kube-proxy rules found"
