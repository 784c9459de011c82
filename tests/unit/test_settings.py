"""The one configuration of ``nlproxy run``: defaults, then the KubeProxyConfiguration file,
then flags, each layer over the one before, into a typed ``Settings``."""

from __future__ import annotations

from dataclasses import fields
from ipaddress import ip_network
from pathlib import Path

import pytest

from nlproxy.cli import build_parser
from nlproxy.commands.run import settings
from nlproxy.config import DaemonConfig, Flags, Settings, build_settings
from nlproxy.conntrack.sysctl import ConntrackConfig
from nlproxy.errors import ConfigError
from nlproxy.proxy.config import ProxyConfig

FILE = """\
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
hostnameOverride: node-from-file
clusterCIDR: 10.244.0.0/16
healthzBindAddress: 0.0.0.0:20256
mode: nftables
nftables:
  masqueradeBit: 12
  syncPeriod: 45s
  minSyncPeriod: 250ms
conntrack:
  udpTimeout: 30s
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "kube-proxy.yaml"
    path.write_text(FILE)
    return path


def test_defaults_when_nothing_is_given() -> None:
    s = build_settings(Flags(node_name="n1"))
    assert s == Settings(daemon=DaemonConfig(node_name="n1"), proxy=ProxyConfig(node_name="n1"))


def test_node_name_defaults_to_the_environment_then_the_hostname(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NLPROXY_NODE_NAME", "from-env")
    assert build_settings(Flags()).proxy.node_name == "from-env"
    monkeypatch.delenv("NLPROXY_NODE_NAME")
    monkeypatch.setattr("socket.gethostname", lambda: "from-hostname")
    assert build_settings(Flags()).daemon.node_name == "from-hostname"


@pytest.mark.parametrize(
    ("given", "url"),
    [
        pytest.param("10.0.0.5", "https://10.0.0.5:443", id="host"),
        pytest.param("cp.example:6443", "https://cp.example:6443", id="host-port"),
        pytest.param("https://[fd00::5]:6443", "https://[fd00::5]:6443", id="ipv6-url"),
    ],
)
def test_api_server_from_the_flag_else_the_environment(
    monkeypatch: pytest.MonkeyPatch, given: str, url: str
) -> None:
    monkeypatch.delenv("NLPROXY_API_SERVER", raising=False)
    assert build_settings(Flags(node_name="n")).daemon.api_server is None
    monkeypatch.setenv("NLPROXY_API_SERVER", "")  # an optional ConfigMap key left empty
    assert build_settings(Flags(node_name="n")).daemon.api_server is None
    monkeypatch.setenv("NLPROXY_API_SERVER", given)
    assert build_settings(Flags(node_name="n")).daemon.api_server == url
    flag = build_settings(Flags(node_name="n", master="https://other:6443"))
    assert flag.daemon.api_server == "https://other:6443"
    monkeypatch.setenv("NLPROXY_API_SERVER", "https://")
    with pytest.raises(ConfigError, match="NLPROXY_API_SERVER"):
        build_settings(Flags(node_name="n"))


def test_the_file_overrides_the_defaults(config_file: Path) -> None:
    s = build_settings(Flags(config=config_file))
    assert (s.daemon.node_name, s.proxy.node_name) == ("node-from-file", "node-from-file")
    assert (s.daemon.sync_period, s.daemon.min_sync_period) == (45.0, 0.25)
    assert s.daemon.healthz_bind_address == "0.0.0.0:20256"
    assert s.daemon.metrics_bind_address == DaemonConfig().metrics_bind_address  # not in the file
    assert s.proxy.masquerade_bit == 12
    assert s.proxy.cluster_cidrs == (ip_network("10.244.0.0/16"),)
    assert s.daemon.conntrack.udp_timeout == 30
    assert s.daemon.conntrack.tcp_established_timeout == ConntrackConfig().tcp_established_timeout


def test_flags_override_the_file(config_file: Path) -> None:
    flags = Flags(
        config=config_file,
        node_name="node-from-flag",
        cluster_cidr="10.0.0.0/8",
        masquerade_bit=3,
        sync_period="5s",
        healthz_bind_address="",
        conntrack_udp_timeout="1m",
    )
    s = build_settings(flags)
    assert (s.daemon.node_name, s.proxy.node_name) == ("node-from-flag", "node-from-flag")
    assert s.daemon.sync_period == 5.0
    assert s.daemon.min_sync_period == 0.25  # the file's, no flag given
    assert s.daemon.healthz_bind_address is None  # an empty flag turns the server off
    assert s.proxy.masquerade_bit == 3
    assert s.proxy.cluster_cidrs == (ip_network("10.0.0.0/8"),)
    assert s.daemon.conntrack.udp_timeout == 60


def test_the_command_line_becomes_flags_and_run_options(config_file: Path) -> None:
    argv = ["--netns", "ns1", "run", "--config", str(config_file), "--sync-period", "5s",
            "--manifests", "/m", "--once", "--force", "--owned-table", "--conntrack-flush-tcp",
            "--exclude-unreachable-endpoints", "--replace-kube-proxy"]  # fmt: skip
    s = settings(build_parser().parse_args(argv))
    assert (s.daemon.node_name, s.daemon.sync_period) == ("node-from-file", 5.0)
    assert (s.manifests, s.netns) == (Path("/m"), "ns1")
    options = (s.once, s.force, s.owned_table, s.conntrack_flush_tcp,
               s.exclude_unreachable_endpoints, s.replace_kube_proxy)  # fmt: skip
    assert options == (True,) * 6


def test_every_flag_field_is_a_run_option() -> None:
    run = build_parser().parse_args(["run"])
    assert {f.name for f in fields(Flags)} <= set(vars(run))


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        pytest.param(Flags(masquerade_bit=32), "--masquerade-bit", id="masquerade-bit"),
        pytest.param(Flags(sync_period="soon"), "--sync-period", id="sync-period"),
        pytest.param(Flags(cluster_cidr="10.0.0.0/33"), "--cluster-cidr", id="cluster-cidr"),
        pytest.param(Flags(conntrack_min=-1), "--conntrack-min", id="conntrack-min"),
        pytest.param(Flags(consistent_hash_seed=-1), "--consistent-hash-seed", id="hash-seed"),
        pytest.param(Flags(proxy_mode="userspace"), "--proxy-mode", id="proxy-mode"),
        pytest.param(Flags(master="ftp://cp:6443"), "--master", id="master-scheme"),
        pytest.param(Flags(master="cp:70000"), "--master", id="master-port"),
    ],
)
def test_a_bad_flag_is_named(flags: Flags, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        build_settings(flags)


@pytest.mark.parametrize("mode", ["ipvs", "iptables"])
def test_proxy_modes_nlproxy_replaces_are_accepted_with_one_warning(mode: str) -> None:
    s = build_settings(Flags(proxy_mode=mode))
    assert [w for w in s.daemon.warnings if w.startswith(f"--proxy-mode '{mode}'")] == [
        s.daemon.warnings[0]
    ]
    assert "nlproxy cleanup --kube-proxy" in s.daemon.warnings[0]
