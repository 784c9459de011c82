"""``run``, ``plan`` and ``preflight`` given a kubeconfig whose user has an ``auth-provider``
the client's loader cannot use: one line naming the file and the user, status 2 for ``run`` and
``plan`` (a configuration error; with ``--master`` too), a ``FAIL`` finding for ``preflight``
(whose findings are its output, status 1): never a traceback nor an internal error. Each
command runs in a namespace of its own, against the in-repo API server listening there. (Every
shape, and those the loader passes over: ``tests/kube/test_auth_provider_refused.py``.)"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nlproxy.cli import main
from nlproxy.netlink import netns
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import NODE, TOKEN
from tests.kube.test_auth_provider_refused import EXPIRED, closed_port, write_user
from tests.netns import sh

SHAPES = [
    pytest.param(
        {"name": "oidc", "config": {"client-id": "k", "idp-issuer-url": "https://127.0.0.1:1"}},
        "auth-provider oidc: config has no id-token",
        id="oidc-without-id-token",
    ),
    pytest.param(
        {"name": "oidc", "config": {"id-token": 5}},
        "auth-provider oidc: id-token is not a string",
        id="oidc-id-token-a-number",
    ),
    pytest.param(
        {"name": "oidc", "config": {"id-token": EXPIRED}},
        "auth-provider oidc: id-token expired, and could not be refreshed (no idp-issuer-url)",
        id="oidc-expired",
    ),
    pytest.param(
        {"name": "gcp"},
        "auth-provider gcp: no access-token, and none could be had (",
        id="gcp-without-config",
    ),
]


@pytest.fixture
def node(make_netns: Callable[[str], str]) -> Iterator[tuple[str, ApiServer]]:
    """A namespace with the API server listening on its loopback."""
    ns = make_netns("authprov")
    sh("ip", "link", "set", "lo", "up", ns=ns)
    server = ApiServer(token=TOKEN)
    with netns.entered(ns):
        server.start()
    try:
        yield ns, server
    finally:
        server.stop()


def nlproxy(ns: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nlproxy", "--netns", ns, *argv],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _said(path: Path, says: str) -> Callable[[str], bool]:
    return lambda line: line.startswith(f"kubeconfig {path}: user u: {says}")


@pytest.mark.parametrize("master", [False, True], ids=["own-server", "master"])
@pytest.mark.parametrize(("provider", "says"), SHAPES)
def test_run_and_plan_say_it_in_one_line_and_exit_2(
    node: tuple[str, ApiServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    provider: Any,
    says: str,
    master: bool,
) -> None:
    ns, server = node
    own = f"https://127.0.0.1:{closed_port()}" if master else server.url
    path = write_user(tmp_path / "kubeconfig", own, provider)
    given = ["--master", server.url] if master else []
    run = nlproxy(ns, "run", "--kubeconfig", str(path), "--hostname-override", NODE,
                  "--healthz-bind-address", "127.0.0.1:0",
                  "--metrics-bind-address", "127.0.0.1:0", *given)  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    assert "internal error" not in run.stderr
    last = run.stderr.splitlines()[-1]
    assert _said(path, says)(last.removeprefix("nlproxy: ")), last
    status = main(["--netns", ns, "plan", "--kubeconfig", str(path), "--node-name", NODE, *given])
    err = capsys.readouterr().err
    assert status == 2
    assert len(err.splitlines()) == 1, err
    assert _said(path, says)(err.removeprefix("nlproxy: "))


@pytest.mark.parametrize(("provider", "says"), SHAPES)
def test_preflight_says_it_in_one_fail_line(
    node: tuple[str, ApiServer], tmp_path: Path, provider: Any, says: str
) -> None:
    ns, server = node
    path = write_user(tmp_path / "kubeconfig", server.url, provider)
    proc = nlproxy(ns, "preflight", "--kubeconfig", str(path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert f"ok    api-server  kubeconfig {path}: {server.url}" in proc.stdout
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("FAIL  access")]
    assert _said(path, says)(line.removeprefix("FAIL  access      credentials: ")), line
