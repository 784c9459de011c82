"""``nlproxy preflight``'s checks, one finding at a time, over facts given by hand. The node
side (leftovers made by the real tools, the command's exit status) is
tests/kernel/test_preflight.py."""

from __future__ import annotations

import os
from ipaddress import ip_address, ip_network
from pathlib import Path

import pytest

from nlproxy.inspect.foreign import ForeignTable, Leftovers
from nlproxy.inspect.ipvs import IpvsLeftovers, VirtualServer
from nlproxy.operate import preflight as pf
from nlproxy.operate import preflight_api as pfa
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
    f = pfa.api_server(server, "kubeconfig k:", CIDRS, in_cluster_host=host)
    assert (f.level, why in f.text) == (level, True), f.text


def test_api_server_unreachable_or_none_is_a_failure_and_the_verdict_says_so() -> None:
    f = pfa.api_server("https://192.168.1.5:6443", "--api-server", CIDRS, reachable="no connection")
    assert f.level is Level.FAIL
    assert "unreachable from this node (no connection)" in f.text
    assert pf.render([f]).endswith("the switch would break traffic: fix every FAIL first")
    assert pfa.api_server(None, "", CIDRS).level is Level.FAIL


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


def test_cni_rules_are_told_apart_from_another_service_proxy() -> None:
    findings = pf.clash(
        [("ip", "nat"), ("inet", "antrea")],
        ["CILIUM_PRE_nat", "KUBE-SERVICES", "KUBE-ROUTER-INPUT", "ANTREA-POSTROUTING"],
    )
    assert [(f.level, f.text.split(":")[0]) for f in findings] == [
        (Level.OK, "Antrea's CNI rules (chain ANTREA-POSTROUTING, table inet antrea)"),
        (Level.OK, "Cilium's CNI rules (chain CILIUM_PRE_nat)"),
        (Level.OK, "kube-router's CNI rules (chain KUBE-ROUTER-INPUT)"),
    ]
    assert "antreaProxy.proxyAll: false" in findings[0].text
    (f,) = pf.clash([], ["KUBE-ROUTER-SERVICES", "KUBE-ROUTER-INPUT"])
    assert f.level is Level.WARN
    assert f.text.startswith("kube-router's service proxy (chain KUBE-ROUTER-SERVICES)")
    assert "--run-service-proxy=false" in f.text
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
    assert pfa.kubeconfig_server(str(path)) == "https://10.96.0.1"


def _changes(text: str, **kw: object) -> list[tuple[Level, str]]:
    import yaml

    from nlproxy.config import load_kube_proxy_config

    doc = yaml.safe_load(text)
    path = Path(kw.pop("tmp")) / "c.yaml"  # type: ignore[arg-type]
    path.write_text(text)
    cfg = load_kube_proxy_config(path)
    return [(f.level, f.text) for f in pf.changes(doc, cfg, **kw)]  # type: ignore[arg-type]


HEAD = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"


@pytest.mark.parametrize("scheduler", ["lc", "wlc", "sed", "nq", "wrr", "dh"])
def test_an_ipvs_scheduler_without_an_equivalent_is_named(tmp_path: Path, scheduler: str) -> None:
    (level, text), npa = _changes(
        HEAD + f"mode: ipvs\nipvs: {{scheduler: {scheduler}}}\n", tmp=tmp_path
    )
    assert level is Level.WARN
    assert text.startswith(f"ipvs.scheduler {scheduler!r}: nlproxy has no equivalent")
    assert "chosen at random" in text
    assert npa[1].startswith("nodePortAddresses unset: kube-proxy's ipvs mode serves NodePorts")


@pytest.mark.parametrize(
    ("scheduler", "nlproxy"), [("rr", "round-robin"), ("sh", "consistent-hash"),
                               ("mh", "consistent-hash")],
)  # fmt: skip
def test_an_ipvs_scheduler_with_an_equivalent_is_ok(
    tmp_path: Path, scheduler: str, nlproxy: str
) -> None:
    text = HEAD + f"mode: ipvs\nipvs: {{scheduler: {scheduler}}}\nnodePortAddresses: [primary]\n"
    assert _changes(text, tmp=tmp_path) == [
        (Level.OK, f"ipvs.scheduler {scheduler}: nlproxy balances {nlproxy}, its equivalent")
    ]


def test_ipvs_default_scheduler_is_round_robin_and_nlproxys_is_not(tmp_path: Path) -> None:
    ((level, text), _) = _changes(HEAD + "mode: ipvs\n", tmp=tmp_path)
    assert (level, text.startswith("ipvs.scheduler unset: IPVS's default is rr")) == (
        Level.WARN,
        True,
    )


def test_iptables_mode_localhost_and_every_address_node_ports(tmp_path: Path) -> None:
    found = _changes(HEAD + "mode: iptables\n", tmp=tmp_path)
    assert [t.split(":")[0] for _, t in found] == [
        "NodePorts on 127.0.0.1",
        "nodePortAddresses unset",
    ]
    assert all(level is Level.WARN for level, _ in found)
    off = (
        HEAD
        + "mode: iptables\niptables: {localhostNodePorts: false}\nnodePortAddresses: [10.0.0.0/8]\n"
    )
    assert _changes(off, tmp=tmp_path) == [
        (Level.OK, "no setting of iptables mode changes behaviour")
    ]
    loop = HEAD + "mode: iptables\nnodePortAddresses: [127.0.0.0/8, 10.0.0.0/8]\n"
    assert [t.split(":")[0] for _, t in _changes(loop, tmp=tmp_path)] == ["NodePorts on 127.0.0.1"]
    # nftables mode (nlproxy's) changes none of these
    assert _changes(HEAD + "mode: nftables\n", tmp=tmp_path)[0][0] is Level.OK


def test_without_a_config_the_mode_comes_from_the_leftovers() -> None:
    iptables = Leftovers(
        tables=(
            ForeignTable(family="ip", table="nat", mode="iptables-nft", chains=("KUBE-SERVICES",)),
        )
    )
    texts = [f.text for f in pf.changes({}, None, found=iptables, route_localnet=1)]
    assert [t.split(" (")[0].split(":")[0] for t in texts] == [
        "NodePorts on 127.0.0.1",
        "nodePortAddresses unset",
    ]
    texts = [f.text for f in pf.changes({}, None, found=iptables, route_localnet=0)]
    assert [t.split(" (")[0] for t in texts] == ["nodePortAddresses unset"]
    assert "no --config: kube-proxy's default assumed" in texts[0]
    ipvs = Leftovers(ipvs=IpvsLeftovers(ipsets=("KUBE-CLUSTER-IP",)))
    texts = [f.text for f in pf.changes({}, None, found=ipvs)]
    assert texts[0].startswith("IPVS mode, scheduler unknown: give --config")
    assert pf.changes({}, None)[0].level is Level.OK


@pytest.mark.parametrize(
    ("exc", "why"),
    [
        pytest.param(OSError(2, "No such file or directory"), "No such file or directory",
                     id="errno"),
        pytest.param(OSError(2, "No such file or directory", "/proc/x"),
                     "/proc/x: No such file or directory", id="errno-and-file"),
        pytest.param(PermissionError(1, "Operation not permitted"),
                     "Operation not permitted (it reads the kernel's state: run preflight as "
                     "root)", id="not-root"),
        pytest.param(ValueError("bad"), "bad", id="other"),
    ],
)  # fmt: skip
def test_a_check_that_cannot_look_is_a_finding(exc: Exception, why: str) -> None:
    """Said as the system says it: never Python's ``[Errno N]``."""

    def broken() -> list[pf.Finding]:
        raise exc

    assert pf.checked("kernel", broken) == [
        pf.Finding("kernel", Level.FAIL, f"could not be checked: {why}")
    ]


def test_api_server_found_as_run_finds_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.conf"
    config.write_text(KUBEADM_CONFIGMAP)  # names /var/lib/kube-proxy/kubeconfig.conf
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("NLPROXY_API_SERVER", "192.168.1.5:6443")
    at = pfa.resolve_api_server(str(config), None, None)
    server, source, notes = at.server, at.source, at.notes
    assert at.kubeconfig is None  # run's fall-back: in-cluster credentials
    assert (server, source) == ("https://192.168.1.5:6443", "NLPROXY_API_SERVER")
    assert [n.level for n in notes] == [Level.WARN]
    assert "does not exist on this host: run uses the in-cluster configuration" in notes[0].text
    # --api-server (run's --master) wins over the environment, as in run
    at = pfa.resolve_api_server(str(config), None, "https://10.0.0.1")
    assert (at.server, at.source) == ("https://10.0.0.1:443", "--api-server")
    # neither: a finding, not an exit
    monkeypatch.delenv("NLPROXY_API_SERVER")
    findings = pfa.api_server_findings(str(config), None, None, None, CIDRS)
    assert [f.level for f in findings] == [Level.WARN, Level.FAIL]
    assert findings[1].text.startswith("no API server address")
    monkeypatch.setenv("NLPROXY_API_SERVER", "https://x:99999")
    (bad,) = pfa.api_server_findings(None, None, None, None, CIDRS)
    assert (bad.level, bad.text.startswith("NLPROXY_API_SERVER:")) == (Level.FAIL, True)


@pytest.mark.parametrize("kind", ["missing", "directory", "fifo", "not-utf-8"])
def test_a_config_file_run_refuses_is_refused_in_runs_words(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    """``--config`` is read as ``run`` reads it: never Python's ``[Errno N] ...: '...'``, and a
    FIFO is refused, not opened (the open would wait for a writer)."""
    from nlproxy.cli import main

    monkeypatch.delenv("NLPROXY_API_SERVER", raising=False)
    path = tmp_path / "config.conf"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "not-utf-8":
        path.write_bytes(b"\xff\xfe: x\n")
    assert main(["run", "--config", str(path), "--hostname-override", "n1"]) == 2
    (refusal,) = capsys.readouterr().err.splitlines()
    assert refusal.startswith(f"nlproxy: config {path}: ")
    assert main(["preflight", "--config", str(path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [x for x in lines if x.startswith("FAIL  config")] == [
        f"FAIL  config      refused: {refusal.removeprefix('nlproxy: ')}"
    ]
    assert not [x for x in lines if "Errno" in x]
