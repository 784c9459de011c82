"""kube-proxy's conntrack section: its defaults and meaning (unset: default, 0: leave alone),
from a KubeProxyConfiguration and from kube-proxy's flags, and the shipped sysctl.d file."""

from __future__ import annotations

from pathlib import Path

from nlproxy.cli import build_parser
from nlproxy.commands.run import settings
from nlproxy.config import load_kube_proxy_config
from nlproxy.conntrack.sysctl import ConntrackConfig
from tests.configs import EXAMPLE, KUBEADM_CONFIGMAP, ROOT


def test_defaults_are_kube_proxys() -> None:
    assert ConntrackConfig().wanted(cpus=2) == {
        "nf_conntrack_max": 131072,  # max(32768 x 2, 131072)
        "nf_conntrack_tcp_timeout_established": 86400,
        "nf_conntrack_tcp_timeout_close_wait": 3600,
    }
    assert ConntrackConfig().wanted(cpus=8)["nf_conntrack_max"] == 262144


def test_kubeadms_nulls_take_the_defaults_and_zero_leaves_alone(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(KUBEADM_CONFIGMAP)
    assert load_kube_proxy_config(path).conntrack == ConntrackConfig()
    path.write_text(
        KUBEADM_CONFIGMAP.replace("  maxPerCore: null", "  maxPerCore: 0").replace(
            "  tcpCloseWaitTimeout: null", "  tcpCloseWaitTimeout: 30m"
        )
    )
    wanted = load_kube_proxy_config(path).conntrack.wanted(cpus=2)
    assert "nf_conntrack_max" not in wanted
    assert wanted["nf_conntrack_tcp_timeout_close_wait"] == 1800


def test_the_full_example_and_kube_proxys_flags() -> None:
    ct = load_kube_proxy_config(EXAMPLE).conntrack
    assert (ct.max_per_core, ct.min, ct.tcp_be_liberal) == (32768, 131072, False)
    args = build_parser().parse_args(
        ["run", "--manifests", "/x", "--conntrack-tcp-be-liberal",
         "--conntrack-udp-timeout", "30s", "--conntrack-min", "0", "--conntrack-max-per-core", "0"]
    )  # fmt: skip
    wanted = settings(args).daemon.conntrack.wanted(cpus=2)
    assert wanted["nf_conntrack_tcp_be_liberal"] == 1
    assert wanted["nf_conntrack_udp_timeout"] == 30
    assert "nf_conntrack_max" not in wanted


def test_the_shipped_sysctl_file_holds_the_defaults() -> None:
    text = (ROOT / "deploy/sysctl/90-nlproxy-conntrack.conf").read_text()
    shipped = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            shipped[key.strip().removeprefix("net.netfilter.")] = int(value)
    # The table size is never in it: a sysctl.d value is applied as is, at every boot, and
    # would lower a larger table; nlproxy (run --init-only) only ever raises it.
    wanted = ConntrackConfig().wanted(cpus=1)
    assert "nf_conntrack_max" in wanted
    del wanted["nf_conntrack_max"]
    assert shipped == wanted


def test_what_may_not_be_set_is_one_line_naming_each_sysctl() -> None:
    from nlproxy.conntrack.sysctl import Outcome

    outcome = Outcome(
        set={},
        kept={},
        refused={
            "nf_conntrack_max": (131072, "Permission denied"),
            "nf_conntrack_tcp_timeout_close_wait": (3600, "Permission denied"),
        },
    )
    assert outcome.advice() == (
        "set these sysctls (`nlproxy run --init-only` as root does, once per boot; the "
        "DaemonSet's init container and the systemd unit run it): "
        "net.netfilter.nf_conntrack_max=131072, "
        "net.netfilter.nf_conntrack_tcp_timeout_close_wait=3600"
    )
