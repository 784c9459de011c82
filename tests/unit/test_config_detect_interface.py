"""The interface detect-local modes from kube-proxy's flags and file: accepted, handed to the
planner with their interface, and an interface no name can match refused naming the flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from nlproxy.cli import build_parser
from nlproxy.commands.run import settings
from nlproxy.errors import ConfigError
from nlproxy.proxy.config import DetectLocal, ProxyConfig

FILE = """\
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
detectLocalMode: {mode}
detectLocal:
  bridgeInterface: {bridge}
  interfaceNamePrefix: {prefix}
"""


def _proxy(argv: list[str]) -> ProxyConfig:
    return settings(build_parser().parse_args(["run", "--node-name", "n1", *argv])).proxy


@pytest.mark.parametrize(
    ("argv", "mode", "interface"),
    [
        pytest.param(["--detect-local-mode", "BridgeInterface", "--pod-bridge-interface", "cbr0"],
                     DetectLocal.BRIDGE_INTERFACE, "cbr0", id="bridge-flags"),
        pytest.param(["--detect-local-mode", "InterfaceNamePrefix",
                      "--pod-interface-name-prefix", "veth"],
                     DetectLocal.INTERFACE_NAME_PREFIX, "veth", id="prefix-flags"),
    ],
)  # fmt: skip
def test_flags(argv: list[str], mode: DetectLocal, interface: str) -> None:
    proxy = _proxy(argv)
    assert (proxy.detect_local, proxy.pod_interface) == (mode, interface)


@pytest.mark.parametrize(
    ("mode", "interface"),
    [("BridgeInterface", "cni0"), ("InterfaceNamePrefix", "cali")],
)
def test_file(tmp_path: Path, mode: str, interface: str) -> None:
    path = tmp_path / "kube-proxy.conf"
    path.write_text(FILE.format(mode=mode, bridge="cni0", prefix="cali"))
    proxy = _proxy(["--config", str(path)])
    assert (proxy.detect_local, proxy.pod_interface) == (DetectLocal(mode), interface)


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "kube-proxy.conf"
    path.write_text(FILE.format(mode="BridgeInterface", bridge="cni0", prefix="''"))
    proxy = _proxy(["--config", str(path), "--detect-local-mode", "InterfaceNamePrefix",
                    "--pod-interface-name-prefix", "veth"])  # fmt: skip
    assert (proxy.detect_local, proxy.pod_interface) == (DetectLocal.INTERFACE_NAME_PREFIX, "veth")


@pytest.mark.parametrize(
    ("argv", "flag", "why"),
    [
        pytest.param(["--detect-local-mode", "BridgeInterface"], "--pod-bridge-interface",
                     "must be given", id="bridge-missing"),
        pytest.param(["--detect-local-mode", "InterfaceNamePrefix"],
                     "--pod-interface-name-prefix", "must be given", id="prefix-missing"),
        pytest.param(["--detect-local-mode", "BridgeInterface", "--pod-bridge-interface",
                      "a" * 16], "--pod-bridge-interface", "longer than 15 bytes", id="too-long"),
        pytest.param(["--detect-local-mode", "InterfaceNamePrefix",
                      "--pod-interface-name-prefix", "veth*"], "--pod-interface-name-prefix",
                     "no '\\*' in a name", id="star"),
        pytest.param(["--detect-local-mode", "BridgeInterface", "--pod-bridge-interface",
                      "br 0"], "--pod-bridge-interface", "not an interface name", id="space"),
    ],
)  # fmt: skip
def test_refused_naming_the_flag(argv: list[str], flag: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as info:
        _proxy(argv)
    assert str(info.value).startswith(flag), str(info.value)
