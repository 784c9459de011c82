"""``nlproxy preflight``'s checks, one finding at a time, over facts given by hand. The node
side (leftovers made by the real tools, the command's exit status) is
tests/kernel/test_preflight.py."""

from __future__ import annotations

from ipaddress import ip_address, ip_network
from pathlib import Path

import pytest

from nlproxy.inspect.foreign import ForeignTable, Leftovers
from nlproxy.inspect.ipvs import IpvsLeftovers, VirtualServer
from nlproxy.operate import preflight as pf
from nlproxy.operate.preflight import Level
from tests.configs import KUBEADM_CONFIGMAP

CIDRS = (ip_network("10.96.0.0/12"),)


def test_leftovers_of_every_mode_are_named_with_what_removes_them() -> None:
    found = Leftovers(
        tables=(
            ForeignTable(family="ip", table="kube-proxy", mode="nftables", chains=()),
            ForeignTable(family="ip", table="filter", mode="iptables-nft",
                         chains=("KUBE-IPVS-FILTER",)),
        ),
        ipvs=IpvsLeftovers(
            ipsets=("KUBE-CLUSTER-IP",),
            virtual_servers=(
                VirtualServer(family=2, protocol=6, address=ip_address("10.96.0.1"), port=443),
            ),
        ),
    )  # fmt: skip
    findings = pf.leftovers(found, ["ip nat"])
    texts = [f.text for f in findings]
    assert [f.level for f in findings] == [Level.WARN] * 5
    assert texts[0].startswith("table ip kube-proxy (kube-proxy, nftables mode): remove after")
    assert "'nlproxy cleanup --kube-proxy'" in texts[0]
    assert texts[2].startswith("1 IPVS virtual servers")
    assert texts[4].startswith("iptables-legacy tables loaded (ip nat)")
    assert pf.leftovers(Leftovers(), []) == [
        pf.Finding("leftovers", Level.OK, "no kube-proxy rules of any mode")
    ]


@pytest.mark.parametrize(
    ("server", "host", "level", "why"),
    [
        pytest.param("https://10.96.0.1:443", None, Level.FAIL, "in the service CIDR", id="cip"),
        pytest.param("https://10.0.0.9:443", "10.0.0.9", Level.FAIL, "KUBERNETES_SERVICE_HOST",
                     id="in-cluster-host"),
        pytest.param("https://kubernetes.default.svc:443", None, Level.FAIL, "a Service name",
                     id="service-name"),
        pytest.param("https://192.168.1.5:6443", "10.96.0.1", Level.OK, "not a ClusterIP",
                     id="control-plane-address"),
        pytest.param("https://cp.example:6443", None, Level.OK, "not a ClusterIP", id="dns-name"),
    ],
)  # fmt: skip
def test_api_server_must_be_reachable_without_a_cluster_ip(
    server: str, host: str | None, level: Level, why: str
) -> None:
    f = pf.api_server(server, "kubeconfig k:", CIDRS, in_cluster_host=host)
    assert (f.level, why in f.text) == (level, True), f.text


def test_api_server_unreachable_is_a_warning_and_none_is_a_failure() -> None:
    f = pf.api_server("https://192.168.1.5:6443", "--api-server", CIDRS, reachable="no connection")
    assert f.level is Level.WARN
    assert pf.api_server(None, "", CIDRS).level is Level.FAIL


def test_conntrack_differences_say_raised_or_lowered() -> None:
    wanted = {"nf_conntrack_max": 131072, "nf_conntrack_tcp_timeout_established": 86400,
              "nf_conntrack_tcp_timeout_close_wait": 3600}  # fmt: skip
    current = {"nf_conntrack_max": 262144, "nf_conntrack_tcp_timeout_established": 432000,
               "nf_conntrack_tcp_timeout_close_wait": None}  # fmt: skip
    texts = [f.text for f in pf.conntrack(wanted, current)]
    assert texts == [
        "net.netfilter.nf_conntrack_tcp_timeout_close_wait: unreadable",
        "net.netfilter.nf_conntrack_tcp_timeout_established: the node has 432000, nlproxy "
        "would set 86400 (lowered; set the conntrack section to keep the node's value)",
    ]  # a larger table is kept: never lowered
    assert pf.conntrack({"nf_conntrack_max": 5}, {"nf_conntrack_max": 5})[0].level is Level.OK


def test_config_translated_honoured_warned_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(KUBEADM_CONFIGMAP.replace("  strictARP: false", "  strictARP: true"))
    _, findings, cfg = pf.read_config(path)
    assert cfg is not None
    assert findings[0].level is Level.OK
    assert "clientConnection.kubeconfig" in findings[0].text
    assert findings[1:] == [
        pf.Finding("config", Level.WARN, "ipvs.strictARP is not used by nlproxy")
    ]
    path.write_text(KUBEADM_CONFIGMAP.replace('mode: "nftables"', "mode: userspace"))
    _, findings, cfg = pf.read_config(path)
    assert cfg is None
    assert [f.level for f in findings] == [Level.FAIL]
    assert "mode: 'userspace'" in findings[0].text


def test_kernel_without_nftables_fails() -> None:
    assert pf.kernel("6.1.0", None)[0].level is Level.OK
    (f,) = pf.kernel("4.9.0", "Protocol not supported")
    assert (f.level, f.text) == (
        Level.FAIL,
        "4.9.0: nftables does not answer: Protocol not supported",
    )


def test_another_service_proxy_is_a_clash() -> None:
    findings = pf.clash([("ip", "nat"), ("inet", "cilium-ct")], ["CILIUM_PRE_nat", "KUBE-SERVICES"])
    assert [f.level for f in findings] == [Level.WARN]
    assert findings[0].text.startswith(
        "Cilium's rules (chain CILIUM_PRE_nat, table inet cilium-ct)"
    )
    assert pf.clash([("ip", "nat")], ["KUBE-SERVICES"])[0].level is Level.OK


def test_render_ends_with_the_verdict() -> None:
    ok = [pf.Finding("kernel", Level.OK, "x")]
    assert pf.render(ok).endswith("nothing stops the switch (docs/migrating.md)")
    bad = [*ok, pf.Finding("api-server", Level.FAIL, "y")]
    assert pf.failed(bad)
    assert pf.render(bad).splitlines()[1] == "FAIL  api-server  y"


def test_kubeconfig_server_of_the_current_context(tmp_path: Path) -> None:
    path = tmp_path / "kc"
    path.write_text(
        "clusters:\n- name: a\n  cluster: {server: 'https://1.2.3.4:6443'}\n"
        "- name: b\n  cluster: {server: 'https://10.96.0.1'}\n"
        "contexts:\n- name: x\n  context: {cluster: b}\ncurrent-context: x\n"
    )
    assert pf.kubeconfig_server(str(path)) == "https://10.96.0.1"
