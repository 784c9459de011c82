"""The configuration files a platform team starts nlproxy with: the shipped ConfigMap, kubeadm's
kube-proxy ConfigMap and kube-proxy's full example all load, list- and map-valued fields
included; kube-proxy's address spellings are read as kube-proxy reads them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nlproxy.config import bind_address, load_kube_proxy_config
from nlproxy.errors import ConfigError
from tests.configs import EXAMPLE, KUBEADM_CONFIGMAP, ROOT, SHIPPED, shipped_config


def test_the_shipped_configmap_loads(tmp_path: Path) -> None:
    cfg = load_kube_proxy_config(shipped_config(tmp_path))
    assert cfg.nodeport_addresses == "primary"  # a list in the file
    assert cfg.healthz_bind_address == "0.0.0.0:10256"
    assert cfg.warnings == ()


def test_kube_proxys_full_example_loads_and_names_what_it_does_not_use(tmp_path: Path) -> None:
    cfg = load_kube_proxy_config(EXAMPLE)
    assert (cfg.cluster_cidr, cfg.min_sync_period, cfg.sync_period) == ("10.244.0.0/16", 1, 30)
    assert "ipvs.excludeCIDRs is not used by nlproxy" in cfg.warnings  # a list: named, no crash
    assert "featureGates" not in " ".join(cfg.warnings)  # a map, quietly accepted


@pytest.mark.parametrize(
    ("field", "value", "want"),
    [
        pytest.param("metricsBindAddress", '""', "127.0.0.1:10249", id="metrics-empty-is-default"),
        pytest.param("metricsBindAddress", "0.0.0.0", "0.0.0.0:10249", id="metrics-host-only"),
        pytest.param("healthzBindAddress", "'::'", "[::]:10256", id="healthz-v6-host-only"),
        pytest.param("healthzBindAddress", "10.0.0.1:9999", "10.0.0.1:9999", id="healthz-full"),
    ],
)
def test_bind_addresses_as_kube_proxy_reads_them(
    tmp_path: Path, field: str, value: str, want: str
) -> None:
    text = KUBEADM_CONFIGMAP.replace(f'{field}: ""', f"{field}: {value}")
    path = tmp_path / "c.yaml"
    path.write_text(text)
    cfg = load_kube_proxy_config(path)
    got = cfg.metrics_bind_address if field.startswith("metrics") else cfg.healthz_bind_address
    assert got == want


def test_an_empty_flag_turns_a_server_off() -> None:
    assert bind_address("", 10249, "--metrics-bind-address") is None


@pytest.mark.parametrize("bad", ["localhost:80", "1.2.3.4:x", ":99999", "1.2.3.4"[:-1] + "x"])
def test_bad_bind_addresses_are_named(bad: str) -> None:
    with pytest.raises(ConfigError, match="--metrics-bind-address"):
        bind_address(bad, 10249, "--metrics-bind-address")


def test_bind_address_names_the_node_ip(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(KUBEADM_CONFIGMAP.replace("bindAddress: 0.0.0.0", "bindAddress: 192.0.2.7"))
    assert load_kube_proxy_config(path).node_ip == "192.0.2.7"


def test_the_license_is_apache_2_and_the_package_says_so() -> None:
    import tomllib

    assert "Apache License" in (ROOT / "LICENSE").read_text().splitlines()[1]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]


def test_the_daemonset_reads_the_shipped_configmap_and_can_mount_kubeadms(tmp_path: Path) -> None:
    docs = {
        d["kind"]: d
        for d in yaml.safe_load_all((ROOT / "deploy/kubernetes/daemonset.yaml").read_text())
    }
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    config = container["command"][container["command"].index("--config") + 1]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    directory, key = config.rsplit("/", 1)
    assert volumes[mounts[directory]]["configMap"]["name"] == "nlproxy"
    assert key in yaml.safe_load(SHIPPED.read_text())["data"]
    kubeadm = volumes[mounts["/var/lib/kube-proxy"]]["configMap"]
    assert kubeadm == {"name": "kube-proxy", "optional": True}
    # The API server's own address: kubeadm's kubeconfig.conf, where that volume shows it ...
    shipped = load_kube_proxy_config(shipped_config(tmp_path))
    assert shipped.kubeconfig == "/var/lib/kube-proxy/kubeconfig.conf"
    assert shipped.kubeconfig_from_file  # absent: in-cluster, with a warning
    # ... or the ConfigMap's api-server key, through the environment, optional.
    [api] = [e for e in container["env"] if e["name"] == "NLPROXY_API_SERVER"]
    ref = api["valueFrom"]["configMapKeyRef"]
    assert (ref["name"], ref["optional"]) == ("nlproxy", True)
    assert ref["key"] in yaml.safe_load(SHIPPED.read_text())["data"]


def test_kubeadms_kubeconfig_path_falls_back_to_in_cluster_when_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from nlproxy.commands.run import check_start
    from nlproxy.config import Settings
    from nlproxy.proxy.config import ProxyConfig

    path = tmp_path / "c.yaml"
    path.write_text(KUBEADM_CONFIGMAP)  # names /var/lib/kube-proxy/kubeconfig.conf
    cfg = load_kube_proxy_config(path)
    s = Settings(daemon=cfg, proxy=ProxyConfig(node_name="n1"), once=True)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    assert check_start(s).daemon.kubeconfig is None
    assert "clientConnection.kubeconfig /var/lib/kube-proxy/kubeconfig.conf does not exist" in (
        capsys.readouterr().err
    )
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(ConfigError, match="not running in a pod"):
        check_start(s)


def test_in_cluster_without_an_api_server_address_is_warned_about(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dataclasses import replace

    from nlproxy.commands.run import check_start
    from nlproxy.config import DaemonConfig, Settings
    from nlproxy.proxy.config import ProxyConfig

    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    s = Settings(daemon=DaemonConfig(node_name="n1"), proxy=ProxyConfig(node_name="n1"), once=True)
    check_start(s)
    err = capsys.readouterr().err
    assert "reaching the API server at https://10.96.0.1:443 (KUBERNETES_SERVICE_HOST)" in err
    assert "NLPROXY_API_SERVER" in err
    check_start(replace(s, daemon=replace(s.daemon, api_server="https://192.0.2.10:6443")))
    assert capsys.readouterr().err == ""


REAL_WORLD = ROOT / "tests/data/config/real-world"


@pytest.mark.parametrize(
    ("name", "masquerade_all", "detect", "warnings"),
    [
        pytest.param("iptables.conf", False, "ClusterCIDR", 1, id="iptables"),
        pytest.param("iptables-masquerade-all.conf", True, "ClusterCIDR", 0, id="masq-all"),
        pytest.param("ipvs.conf", False, "ClusterCIDR", 1, id="ipvs"),
        pytest.param("node-cidr.conf", False, "NodeCIDR", 0, id="node-cidr"),
        pytest.param("bridge-interface.conf", False, "BridgeInterface", 1, id="bridge"),
    ],
)
def test_real_world_configurations_load(
    name: str, masquerade_all: bool, detect: str, warnings: int
) -> None:
    """The files the kernel tests start nlproxy with (tests/kernel/test_kube_proxy_configs.py),
    read: the mode's warning is the only one."""
    cfg = load_kube_proxy_config(REAL_WORLD / name)
    assert (cfg.masquerade_all, cfg.detect_local_mode) == (masquerade_all, detect)
    assert len(cfg.warnings) == warnings, cfg.warnings
