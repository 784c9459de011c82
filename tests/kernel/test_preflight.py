"""``nlproxy preflight`` on a node as kube-proxy leaves it, made by the real tools: its
nftables table, its iptables-nft chains, an IPVS ipset, an iptables-legacy table, and another
proxy's chain; each finding shows, and the exit status follows the API server's address."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from nlproxy.netlink import netns
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import TOKEN, write_kubeconfig

KUBE_PROXY_TABLE = """
table ip kube-proxy {
  chain nat-prerouting { type nat hook prerouting priority dstnat; policy accept; }
}
"""


def run(ns: str, *argv: str, stdin: str | None = None) -> None:
    subprocess.run(
        ["ip", "netns", "exec", ns, *argv],
        input=stdin, check=True, capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def preflight(ns: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nlproxy", "--netns", ns, "preflight", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.fixture
def kube_proxy_node(make_netns: Callable[[str], str]) -> str:
    for tool in ("ipset", "iptables-legacy"):
        if shutil.which(tool) is None:
            pytest.fail(f"the {tool} tool is missing (scripts/install-debs.sh installs it)")
    ns = make_netns("preflight")
    run(ns, "ip", "link", "set", "lo", "up")
    run(ns, "nft", "-f", "-", stdin=KUBE_PROXY_TABLE)
    run(ns, "iptables-nft", "-t", "nat", "-N", "KUBE-SERVICES")
    run(ns, "iptables-nft", "-t", "nat", "-N", "CILIUM_PRE_nat")
    run(ns, "ipset", "create", "KUBE-CLUSTER-IP", "hash:ip,port")
    run(ns, "iptables-legacy", "-t", "nat", "-L", "-n")  # loads the legacy nat table
    return ns


def test_every_finding_on_a_kube_proxy_node(kube_proxy_node: str, tmp_path: Path) -> None:
    ns = kube_proxy_node
    proc = preflight(ns, "--api-server", "https://10.96.0.1:443", "--json")
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["breaks_traffic"] is True
    by: dict[str, list[tuple[str, str]]] = {}
    for f in out["findings"]:
        by.setdefault(f["check"], []).append((f["level"], f["text"]))
    leftovers = " | ".join(text for _, text in by["leftovers"])
    assert "table ip kube-proxy (kube-proxy, nftables mode)" in leftovers
    assert "1 KUBE-* chains in table ip nat (kube-proxy, iptables-nft)" in leftovers
    assert "1 KUBE-* ipsets (kube-proxy, IPVS)" in leftovers
    assert "iptables-legacy tables loaded (ip nat)" in leftovers
    ((level, text),) = by["api-server"]
    assert level == "FAIL"
    assert "10.96.0.1 is in the service CIDR 10.96.0.0/12" in text
    assert [lv for lv, _ in by["kernel"]] == ["ok"]
    assert by["clash"][0][0] == "ok"
    assert "Cilium's CNI rules (chain CILIUM_PRE_nat): not a service proxy" in by["clash"][0][1]
    assert by["conntrack"]  # differences or "already match": read either way

    # The control plane's own address, answering, and an identity it grants: nothing breaks
    # (leftovers are warnings).
    server = ApiServer(token=TOKEN)
    with netns.entered(ns):
        server.start()  # listens in the node's namespace
    try:
        kubeconfig = str(write_kubeconfig(tmp_path / "kc", server))
        ok = preflight(ns, "--kubeconfig", kubeconfig)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert f"ok    api-server  kubeconfig {kubeconfig}: {server.url}" in ok.stdout
        assert "not a ClusterIP (connected)" in ok.stdout
        assert "ok    access      node " in ok.stdout
        assert ok.stdout.rstrip().endswith("nothing stops the switch (docs/migrating.md)")
        # Read only: every leftover is still there.
        again = preflight(ns, "--kubeconfig", kubeconfig, "--json")
        assert again.stdout.count("kube-proxy") >= 3
    finally:
        server.stop()
    # Reachable, but no credentials run could use: a FAIL that says so.
    with netns.entered(ns):
        listener = socket.create_server(("127.0.0.1", 0))
    with listener:
        port = listener.getsockname()[1]
        bare = preflight(ns, "--api-server", f"https://127.0.0.1:{port}")
    assert bare.returncode == 1
    assert "FAIL  access      no kubeconfig, and not in a pod" in bare.stdout


def test_a_refused_configuration_breaks_the_switch(kube_proxy_node: str, tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
        "mode: userspace\n"
    )
    proc = preflight(kube_proxy_node, "--config", str(path), "--api-server", "https://1.2.3.4")
    assert proc.returncode == 1
    assert "FAIL  config      refused: KubeProxyConfiguration: mode: 'userspace'" in proc.stdout


CILIUM = """*raw
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:CILIUM_OUTPUT_raw - [0:0]
:CILIUM_PRE_raw - [0:0]
-A PREROUTING -m comment --comment "cilium-feeder: CILIUM_PRE_raw" -j CILIUM_PRE_raw
-A OUTPUT -m comment --comment "cilium-feeder: CILIUM_OUTPUT_raw" -j CILIUM_OUTPUT_raw
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CILIUM_POST_nat - [0:0]
:CILIUM_PRE_nat - [0:0]
-A PREROUTING -m comment --comment "cilium-feeder: CILIUM_PRE_nat" -j CILIUM_PRE_nat
-A POSTROUTING -m comment --comment "cilium-feeder: CILIUM_POST_nat" -j CILIUM_POST_nat
-A CILIUM_POST_nat -s 10.0.1.0/24 ! -d 10.0.0.0/8 ! -o cilium_+ -j MASQUERADE
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:CILIUM_FORWARD - [0:0]
:CILIUM_INPUT - [0:0]
-A INPUT -m comment --comment "cilium-feeder: CILIUM_INPUT" -j CILIUM_INPUT
-A FORWARD -m comment --comment "cilium-feeder: CILIUM_FORWARD" -j CILIUM_FORWARD
-A CILIUM_FORWARD -o cilium_host -j ACCEPT
COMMIT
"""
KUBE_ROUTER = """*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-ROUTER-FORWARD - [0:0]
:KUBE-ROUTER-INPUT - [0:0]
:KUBE-ROUTER-OUTPUT - [0:0]
-A INPUT -m comment --comment "kube-router netpol" -j KUBE-ROUTER-INPUT
-A FORWARD -m comment --comment "kube-router netpol" -j KUBE-ROUTER-FORWARD
-A OUTPUT -m comment --comment "kube-router netpol" -j KUBE-ROUTER-OUTPUT
COMMIT
"""
KUBE_ROUTER_PROXY = """*filter
:INPUT ACCEPT [0:0]
:KUBE-ROUTER-SERVICES - [0:0]
-A INPUT -m comment --comment "handle traffic to IPVS service IPs" -j KUBE-ROUTER-SERVICES
COMMIT
"""
ANTREA = """*nat
:POSTROUTING ACCEPT [0:0]
:ANTREA-POSTROUTING - [0:0]
-A POSTROUTING -m comment --comment "Antrea: jump to Antrea postrouting rules" -j ANTREA-POSTROUTING
-A ANTREA-POSTROUTING -s 10.10.0.0/24 ! -o antrea-gw0 -j MASQUERADE
COMMIT
*mangle
:PREROUTING ACCEPT [0:0]
:ANTREA-MANGLE - [0:0]
-A PREROUTING -m comment --comment "Antrea: jump to Antrea mangle rules" -j ANTREA-MANGLE
COMMIT
"""
ANTREA_NFT = """
table inet antrea {
  chain antrea-chain-ingress-rules { type filter hook prerouting priority filter; policy accept; }
}
"""


@pytest.mark.parametrize(
    ("rulesets", "level", "says"),
    [
        pytest.param([CILIUM], "ok", "Cilium's CNI rules (chain CILIUM_FORWARD, chain "
                     "CILIUM_INPUT, chain CILIUM_OUTPUT_raw, …): not a service proxy", id="cilium"),
        pytest.param([KUBE_ROUTER], "ok", "kube-router's CNI rules (chain KUBE-ROUTER-FORWARD, "
                     "chain KUBE-ROUTER-INPUT, chain KUBE-ROUTER-OUTPUT): not a", id="kube-router"),
        pytest.param([KUBE_ROUTER, KUBE_ROUTER_PROXY], "warn", "kube-router's service proxy "
                     "(chain KUBE-ROUTER-SERVICES): two service proxies", id="kube-router-proxy"),
        pytest.param([ANTREA, ANTREA_NFT], "ok", "Antrea's CNI rules (chain ANTREA-MANGLE, chain "
                     "ANTREA-POSTROUTING, table inet antrea): not a service proxy", id="antrea"),
    ],
)  # fmt: skip
def test_other_cnis_rules_are_not_another_service_proxy(
    make_netns: Callable[[str], str], rulesets: list[str], level: str, says: str
) -> None:
    ns = make_netns("pfcni")
    for ruleset in rulesets:
        if ruleset.lstrip().startswith("table"):
            run(ns, "nft", "-f", "-", stdin=ruleset)
        else:
            run(ns, "iptables-nft-restore", "--noflush", stdin=ruleset)
    proc = preflight(ns, "--api-server", "https://10.96.0.1", "--json")
    assert proc.returncode == 1, proc.stderr  # the ClusterIP: nothing else fails
    clash = [f for f in json.loads(proc.stdout)["findings"] if f["check"] == "clash"]
    assert (clash[0]["level"], clash[0]["text"].startswith(says)) == (level, True), clash


def test_kubeadm_config_conf_copied_out_of_its_configmap_is_reported(
    make_netns: Callable[[str], str], tmp_path: Path
) -> None:
    from tests.configs import KUBEADM_CONFIGMAP

    ns = make_netns("pfkubeadm")
    run(ns, "ip", "link", "set", "lo", "up")
    config = tmp_path / "config.conf"
    config.write_text(KUBEADM_CONFIGMAP)  # its kubeconfig path does not exist on this host
    proc = preflight(ns, "--config", str(config), "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a report, not exit 2
    api = [f for f in json.loads(proc.stdout)["findings"] if f["check"] == "api-server"]
    assert [f["level"] for f in api] == ["warn", "FAIL"]
    assert "/var/lib/kube-proxy/kubeconfig.conf does not exist on this host" in api[0]["text"]
    # An API server address that nothing answers: a FAIL, and the verdict says so.
    with netns.entered(ns):
        closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    proc = preflight(ns, "--config", str(config), "--api-server", f"https://127.0.0.1:{port}")
    assert proc.returncode == 1
    assert "FAIL  api-server  --api-server https://127.0.0.1:" in proc.stdout
    assert "unreachable from this node (no connection: Connection refused)" in proc.stdout
    assert proc.stdout.rstrip().endswith("the switch would break traffic: fix every FAIL first")
