"""Where ``run`` finds the API server, by one rule (``config.api_source``), which ``run``'s
start-up check, the daemon and ``preflight`` all use: each case gives the three the same
kubeconfig, address and verdict on the in-cluster fallback."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from nlproxy.commands.run import check_start
from nlproxy.config import DaemonConfig, Flags, build_settings
from nlproxy.config.api_source import NO_CREDENTIALS, api_source
from nlproxy.errors import ConfigError
from nlproxy.operate.preflight_api import resolve_api_server

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://192.0.2.10:6443"}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
users: [{name: u, user: {token: t}}]
"""
CONFIG = """\
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {path}
"""


@pytest.fixture
def kubeconfig(tmp_path: Path) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    return str(path)


@pytest.mark.parametrize(
    ("given", "from_file", "exists", "pod", "master", "want_kubeconfig", "fallback"),
    [
        pytest.param(True, False, True, False, None, True, False, id="kubeconfig-flag"),
        pytest.param(True, True, True, True, None, True, False, id="file-kubeconfig"),
        pytest.param(True, True, False, True, None, False, True, id="file-kubeconfig-missing"),
        pytest.param(
            True, True, False, True, "https://192.0.2.1:443", False, False, id="missing-with-master"
        ),
        pytest.param(False, False, False, True, None, False, True, id="in-cluster"),
        pytest.param(False, False, False, True, "https://192.0.2.1:443", False, False, id="master"),
    ],
)
def test_run_and_preflight_find_the_same_api_server(
    monkeypatch: pytest.MonkeyPatch,
    kubeconfig: str,
    tmp_path: Path,
    given: bool,
    from_file: bool,
    exists: bool,
    pod: bool,
    master: str | None,
    want_kubeconfig: bool,
    fallback: bool,
) -> None:
    monkeypatch.delenv("NLPROXY_API_SERVER", raising=False)
    if pod:
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    else:
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = (kubeconfig if exists else str(tmp_path / "absent")) if given else None
    cfg = DaemonConfig(kubeconfig=path, kubeconfig_from_file=from_file, api_server=master)
    at = api_source(cfg)
    assert (at.kubeconfig is not None) == want_kubeconfig
    assert at.fallback is fallback
    assert at.no_credentials == ""
    assert bool(at.skipped) is (given and not exists)
    # run's start-up check keeps the same kubeconfig (None: in-cluster) ...
    s = build_settings(Flags(node_name="n", once=True))
    checked = check_start(replace(s, daemon=cfg))
    assert checked.daemon.kubeconfig == at.kubeconfig
    # ... and preflight reads the same one, or the same in-cluster address.
    config = None
    if from_file:  # the KubeProxyConfiguration naming the kubeconfig, given as --config
        config = tmp_path / "config.conf"
        config.write_text(CONFIG.format(path=path))
    flag = path if given and not from_file else None
    found = resolve_api_server(str(config) if config else None, flag, master)
    assert found.kubeconfig == at.kubeconfig
    assert found.override == at.api_server
    if master:
        assert found.server == master
    elif want_kubeconfig:
        assert found.server == "https://192.0.2.10:6443"
    else:
        assert found.server == "https://10.96.0.1:443"
        assert found.source == "in-cluster"


def test_no_credentials_outside_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("NLPROXY_API_SERVER", raising=False)
    at = api_source(DaemonConfig())
    assert at.no_credentials == NO_CREDENTIALS
    s = build_settings(Flags(node_name="n", once=True))
    with pytest.raises(ConfigError, match="not running in a pod"):
        check_start(s)
    found = resolve_api_server(None, None, None)
    assert found.server is None
    assert found.no_credentials == NO_CREDENTIALS
