"""A ``:``-joined kubeconfig list given to ``run`` (with ``--master`` or without): kube-proxy's
``--kubeconfig`` names one file (client-go's explicit path; it reads no ``KUBECONFIG`` list), and
refuses a list as a file that does not exist; so does ``run``, in one line naming the flag, exit
status 2. (``preflight`` and ``plan``, which take a kubeconfig as ``kubectl`` does, merge the
list, with a server given or not: ``tests/kube/test_config.py``.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from nlproxy.cli import main

CLUSTER = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://192.0.2.10:6443"}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""
USER = "apiVersion: v1\nkind: Config\nusers: [{name: u, user: {token: t}}]\n"
LIST = "No such file or directory (one file; a ':'-joined list is not merged)"


@pytest.mark.parametrize("master", [None, "https://192.0.2.1:6443"], ids=["alone", "master"])
def test_run_refuses_a_kubeconfig_list_in_one_line_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], master: str | None
) -> None:
    (tmp_path / "cluster").write_text(CLUSTER)
    (tmp_path / "user").write_text(USER)
    joined = f"{tmp_path / 'cluster'}:{tmp_path / 'user'}"
    argv = ["run", "--kubeconfig", joined, "--hostname-override", "n1"]
    if master is not None:
        argv += ["--master", master]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"nlproxy: --kubeconfig: {joined}: {LIST}"]


@pytest.mark.parametrize("master", [None, "https://192.0.2.1:6443"], ids=["alone", "master"])
def test_a_kubeconfig_list_in_the_config_file_is_refused_not_taken_for_a_missing_file(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    master: str | None,
) -> None:
    """kube-proxy reads ``clientConnection.kubeconfig`` as one path too. A file that is absent
    falls back to the in-cluster configuration (kubeadm's ConfigMap names a path the
    DaemonSet may not mount); a ``:``-joined list is no such path but a mistake: one line
    naming the field, status 2, never the in-cluster fallback."""
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")  # in a pod: a fallback exists
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    (tmp_path / "cluster").write_text(CLUSTER)
    (tmp_path / "user").write_text(USER)
    joined = f"{tmp_path / 'cluster'}:{tmp_path / 'user'}"
    config = tmp_path / "config.conf"
    config.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
        f"clientConnection:\n  kubeconfig: {joined}\n"
    )
    argv = ["run", "--config", str(config), "--hostname-override", "n1"]
    if master is not None:
        argv += ["--master", master]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"nlproxy: clientConnection.kubeconfig: {joined}: {LIST}"]
