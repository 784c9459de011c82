"""KubeProxyConfiguration files: honoured fields, warnings for the rest, errors naming the field."""

from pathlib import Path

import pytest

from nlproxy.config import DaemonConfig, load_kube_proxy_config, parse_duration
from nlproxy.errors import ConfigError
from tests.configs import KUBEADM_CONFIGMAP


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "config.conf"
    p.write_text(text)
    return p


def test_kubeadm_configmap_works_unchanged(tmp_path: Path) -> None:
    cfg = load_kube_proxy_config(write(tmp_path, KUBEADM_CONFIGMAP))
    assert cfg.cluster_cidr == "10.244.0.0/16"
    assert cfg.kubeconfig == "/var/lib/kube-proxy/kubeconfig.conf"
    # 0s periods mean "default" in kube-proxy's files; ours stay.
    assert cfg.sync_period == DaemonConfig().sync_period
    assert cfg.warnings == ()


def test_unused_fields_are_named_once(tmp_path: Path) -> None:
    text = KUBEADM_CONFIGMAP.replace("enableProfiling: false", "enableProfiling: true")
    text = text.replace("  strictARP: false", "  strictARP: true")
    cfg = load_kube_proxy_config(write(tmp_path, text))
    assert cfg.warnings == (
        "enableProfiling is not used by nlproxy",
        "ipvs.strictARP is not used by nlproxy",
    )


def test_nftables_section_is_honoured(tmp_path: Path) -> None:
    text = KUBEADM_CONFIGMAP.replace(
        "nftables:\n  masqueradeAll: false\n  masqueradeBit: null\n  minSyncPeriod: 0s\n"
        "  syncPeriod: 0s",
        "nftables:\n  masqueradeBit: 12\n  minSyncPeriod: 250ms\n  syncPeriod: 1m30s",
    )
    cfg = load_kube_proxy_config(write(tmp_path, text))
    assert (cfg.masquerade_bit, cfg.min_sync_period, cfg.sync_period) == (12, 0.25, 90.0)


@pytest.mark.parametrize(
    ("replace", "message"),
    [
        pytest.param(
            ('mode: "nftables"', "mode: userspace"),
            "KubeProxyConfiguration: mode: 'userspace': nlproxy programs nftables; set mode: "
            "nftables (or leave it empty)",
            id="unknown-mode",
        ),
        pytest.param(
            (
                "  masqueradeBit: null\n  minSyncPeriod: 0s\n  syncPeriod: 0s\nnodePort",
                "  masqueradeBit: null\n  minSyncPeriod: soon\n  syncPeriod: 0s\nnodePort",
            ),
            "KubeProxyConfiguration: nftables.minSyncPeriod: 'soon' is not a duration",
            id="bad-duration",
        ),
        pytest.param(
            ('metricsBindAddress: ""', "metricsBindAddress: 127.0.0.1:70000"),
            "KubeProxyConfiguration metricsBindAddress: port 70000 is not in 0..65535",
            id="bind-port-range",
        ),
        pytest.param(
            ("bindAddress: 0.0.0.0", "bindAddress: node1"),
            "KubeProxyConfiguration: bindAddress: 'node1' is not an IP address",
            id="bind-address",
        ),
        pytest.param(
            ('detectLocalMode: ""', "detectLocalMode: PodCIDR"),
            "KubeProxyConfiguration: detectLocalMode: 'PodCIDR' is not one of ClusterCIDR, "
            "NodeCIDR, BridgeInterface, InterfaceNamePrefix",
            id="detect-local",
        ),
        pytest.param(
            (
                "  masqueradeAll: false\n  masqueradeBit: null",
                "  masqueradeAll: yes please\n  masqueradeBit: null",
            ),
            "KubeProxyConfiguration: nftables.masqueradeAll: 'yes please' is not true or false",
            id="masquerade-all-not-a-bool",
        ),
        pytest.param(
            ("oomScoreAdj: null", "oomScoreAdj: -1001"),
            "KubeProxyConfiguration oomScoreAdj: -1001 is not an integer in -1000..1000",
            id="oom-score-adj",
        ),
        pytest.param(
            ("nodePortAddresses: null", "nodePortAddresses: primary"),
            "KubeProxyConfiguration: nodePortAddresses: must be a list of strings",
            id="nodeport-addresses-not-a-list",
        ),
    ],
)
def test_invalid_value_names_the_field(
    tmp_path: Path, replace: tuple[str, str], message: str
) -> None:
    text = KUBEADM_CONFIGMAP.replace(*replace)
    assert text != KUBEADM_CONFIGMAP, "the replacement must change the file"
    with pytest.raises(ConfigError) as err:
        load_kube_proxy_config(write(tmp_path, text))
    assert str(err.value) == message


def test_wrong_kind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected kind KubeProxyConfiguration"):
        load_kube_proxy_config(write(tmp_path, "apiVersion: v1\nkind: ConfigMap\n"))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("100ms", 0.1), ("1m30s", 90.0), ("2h", 7200.0), ("1.5s", 1.5), ("0s", 0.0)],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "x") == pytest.approx(seconds)


KUBEADM_LOGGING = """logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
"""


def test_kubeadms_logging_defaults_are_quiet(tmp_path: Path) -> None:
    cfg = load_kube_proxy_config(write(tmp_path, KUBEADM_CONFIGMAP + KUBEADM_LOGGING))
    assert cfg.warnings == ()


def test_logging_and_feature_gates_are_named_not_ignored(tmp_path: Path) -> None:
    """A team that sets kube-proxy's verbosity, log format or a feature gate is told that
    nlproxy does not read them, and what does."""
    logging = KUBEADM_LOGGING.replace("verbosity: 0", "verbosity: 4").replace(
        "flushFrequency: 0", "flushFrequency: 0\n  format: json"
    )
    gates = "featureGates:\n  KubeProxyDrainingTerminatingNodes: true\n  AllAlpha: false\n"
    cfg = load_kube_proxy_config(write(tmp_path, KUBEADM_CONFIGMAP + logging + gates))
    hint = "nlproxy's --log-level (or -v) and --log-format set its logging"
    assert cfg.warnings == (
        "featureGates.KubeProxyDrainingTerminatingNodes is not used by nlproxy "
        "(nlproxy has no feature gates)",
        f"logging.format is not used by nlproxy ({hint})",
        f"logging.verbosity is not used by nlproxy ({hint})",
    )


def test_ipvs_mode_is_accepted_with_a_warning(tmp_path: Path) -> None:
    """An IPVS cluster's ConfigMap: nftables in IPVS's place, its scheduler and periods kept."""
    text = KUBEADM_CONFIGMAP.replace('mode: "nftables"', "mode: ipvs")
    text = text.replace('  scheduler: ""', "  scheduler: sh").replace(
        "  strictARP: false\n  syncPeriod: 0s", "  strictARP: false\n  syncPeriod: 45s"
    )
    cfg = load_kube_proxy_config(write(tmp_path, text))
    assert cfg.warnings[0].startswith("mode 'ipvs': nlproxy programs nftables in IPVS's place")
    assert "nlproxy cleanup --kube-proxy" in cfg.warnings[0]
    assert len(cfg.warnings) == 1
    assert cfg.sync_period == 45.0
    assert cfg.load_balancing == "consistent-hash"


def test_ipvs_periods_do_not_apply_in_nftables_mode(tmp_path: Path) -> None:
    text = KUBEADM_CONFIGMAP.replace("  strictARP: false\n  syncPeriod: 0s", "  syncPeriod: 45s")
    cfg = load_kube_proxy_config(write(tmp_path, text))
    assert cfg.sync_period == DaemonConfig().sync_period
    assert cfg.warnings == (
        "ipvs.syncPeriod is not used by nlproxy (mode nftables reads the nftables section)",
    )


@pytest.mark.parametrize(
    ("mode", "iptables", "nftables", "want"),
    [
        # An empty mode is kube-proxy's default, iptables: its section, as kube-proxy reads it.
        pytest.param('""', "true", "false", True, id="no-mode-iptables-section"),
        pytest.param('""', "false", "true", False, id="no-mode-not-the-nftables-section"),
        pytest.param("nftables", "false", "true", True, id="nftables"),
        pytest.param("nftables", "true", "false", False, id="nftables-reads-its-own"),
        pytest.param("iptables", "true", "false", True, id="iptables"),
        pytest.param("ipvs", "true", "false", True, id="ipvs-reads-iptables"),
        pytest.param("nftables", "false", "false", False, id="off"),
    ],
)
def test_masquerade_all_from_the_modes_section(
    tmp_path: Path, mode: str, iptables: str, nftables: str, want: bool
) -> None:
    text = KUBEADM_CONFIGMAP.replace('mode: "nftables"', f"mode: {mode}")
    head, sep, tail = text.partition(
        "iptables:\n  localhostNodePorts: null\n  masqueradeAll: false"
    )
    assert sep, "kubeadm's iptables section moved"
    text = head + sep.replace("false", iptables) + tail
    text = text.replace(
        "nftables:\n  masqueradeAll: false", f"nftables:\n  masqueradeAll: {nftables}"
    )
    cfg = load_kube_proxy_config(write(tmp_path, text))
    assert cfg.masquerade_all is want
    if not want and "true" in (iptables, nftables):  # set where this mode does not read it
        assert any("masqueradeAll is not used by nlproxy" in w for w in cfg.warnings)


def test_iptables_mode_is_accepted_with_one_warning(tmp_path: Path) -> None:
    cfg = load_kube_proxy_config(
        write(tmp_path, KUBEADM_CONFIGMAP.replace('mode: "nftables"', "mode: iptables"))
    )
    assert len(cfg.warnings) == 1
    assert cfg.warnings[0].startswith("mode 'iptables': nlproxy programs nftables")


@pytest.mark.parametrize(
    ("fields", "want"),
    [
        pytest.param("detectLocalMode: NodeCIDR", ("NodeCIDR", "", ""), id="node-cidr"),
        pytest.param(
            "detectLocalMode: BridgeInterface\ndetectLocal:\n  bridgeInterface: cni0",
            ("BridgeInterface", "cni0", ""),
            id="bridge",
        ),
        pytest.param(
            "detectLocalMode: InterfaceNamePrefix\ndetectLocal:\n  interfaceNamePrefix: veth",
            ("InterfaceNamePrefix", "", "veth"),
            id="prefix",
        ),
    ],
)
def test_detect_local_modes_are_read(
    tmp_path: Path, fields: str, want: tuple[str, str, str]
) -> None:
    text = KUBEADM_CONFIGMAP.replace('detectLocalMode: ""', fields)
    cfg = load_kube_proxy_config(write(tmp_path, text))
    got = (cfg.detect_local_mode, cfg.pod_bridge_interface, cfg.pod_interface_name_prefix)
    assert got == want
    assert cfg.warnings == ()


def test_client_rate_and_oom_score_are_read(tmp_path: Path) -> None:
    text = KUBEADM_CONFIGMAP.replace("burst: 0", "burst: 40").replace("qps: 0", "qps: 20.5")
    text = text.replace("oomScoreAdj: null", "oomScoreAdj: -999")
    cfg = load_kube_proxy_config(write(tmp_path, text))
    assert (cfg.kube_api_qps, cfg.kube_api_burst, cfg.oom_score_adj) == (20.5, 40, -999)
    assert cfg.warnings == ()
    default = load_kube_proxy_config(write(tmp_path, KUBEADM_CONFIGMAP))  # 0: the default
    assert (default.kube_api_qps, default.kube_api_burst) == (5.0, 10)
