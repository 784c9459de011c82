"""An API server address (``--master``, ``preflight --api-server``, ``NLPROXY_API_SERVER``) that
is no URL is one line naming the flag, status 2 for ``run`` and a ``FAIL`` for ``preflight``
in the same words: never an internal error (an unclosed ``[`` of an IPv6 address made
``urlsplit`` itself raise)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nlproxy.cli import main

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
users: [{name: u, user: {token: t}}]
current-context: x
"""


@pytest.mark.parametrize(
    ("given", "why"),
    [
        pytest.param("http://[::1", "Invalid IPv6 URL", id="unclosed-ipv6"),
        pytest.param("[::1", "Invalid IPv6 URL", id="bare-unclosed-ipv6"),
        pytest.param("https://[::1]:99999", "Port out of range 0-65535", id="port"),
        pytest.param("ftp://x", "is not https://HOST[:PORT]", id="scheme"),
    ],
)
def test_a_bad_api_server_address_is_one_line_naming_the_flag(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    given: str,
    why: str,
) -> None:
    monkeypatch.delenv("NLPROXY_API_SERVER", raising=False)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    argv = ["run", "--kubeconfig", str(kubeconfig), "--master", given, "--hostname-override", "n1"]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"nlproxy: --master: {given!r}")
    assert why in line
    assert main(["preflight", "--kubeconfig", str(kubeconfig), "--api-server", given]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [x for x in lines if " api-server " in x] == [
        f"FAIL  api-server  {line.removeprefix('nlproxy: ')}"
    ]
