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


def test_every_finding_on_a_kube_proxy_node(kube_proxy_node: str) -> None:
    ns = kube_proxy_node
    proc = preflight(ns, "--api-server", "https://10.96.0.1:443", "--json")
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["breaks_traffic"] is True
    by = {}
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
    assert by["clash"][0][0] == "warn"
    assert "Cilium's rules (chain CILIUM_PRE_nat)" in by["clash"][0][1]
    assert by["conntrack"]  # differences or "already match": read either way

    # The control plane's own address, answering: nothing breaks (leftovers are warnings).
    with netns.entered(ns):
        listener = socket.create_server(("127.0.0.1", 0))
    with listener:
        port = listener.getsockname()[1]
        ok = preflight(ns, "--api-server", f"https://127.0.0.1:{port}")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "ok    api-server  --api-server https://127.0.0.1:" in ok.stdout
    assert "not a ClusterIP (connected)" in ok.stdout
    assert ok.stdout.rstrip().endswith("nothing stops the switch (docs/migrating.md)")
    # Read only: every leftover is still there.
    again = preflight(ns, "--api-server", f"https://127.0.0.1:{port}", "--json")
    assert again.stdout.count("kube-proxy") >= 3


def test_a_refused_configuration_breaks_the_switch(kube_proxy_node: str, tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
        "mode: userspace\n"
    )
    proc = preflight(kube_proxy_node, "--config", str(path), "--api-server", "https://1.2.3.4")
    assert proc.returncode == 1
    assert "FAIL  config      refused: KubeProxyConfiguration: mode: 'userspace'" in proc.stdout
