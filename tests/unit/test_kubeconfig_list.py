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
    assert err.splitlines() == [f"nlproxy: --kubeconfig: {joined}: No such file or directory"]
