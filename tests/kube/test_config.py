"""Client configuration and retry delays of the kube source."""

from __future__ import annotations

import random
from pathlib import Path

import kubernetes
import pytest
import yaml

from nlproxy.cluster import token_file
from nlproxy.cluster.kube import Backoff, api_client_from_config
from nlproxy.cluster.kube_client import Client
from nlproxy.errors import ConfigError
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import TOKEN, write_kubeconfig


def _nodes(client: Client) -> list[object]:
    """The cluster's Nodes through the client's own typed API, with the configuration (URL,
    TLS, credentials) that ``api_client_from_config`` loaded."""
    with kubernetes.client.ApiClient(client.configuration) as api:
        return list(kubernetes.client.CoreV1Api(api).list_node().items)


def test_kubeconfig_context_and_token(apiserver: ApiServer, tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "kubeconfig", apiserver)
    with api_client_from_config(str(path), context="test") as client:
        assert client.configuration.host == apiserver.url
        assert _nodes(client) == []


def test_server_overrides_the_kubeconfig_and_keeps_its_credentials(
    apiserver: ApiServer, tmp_path: Path
) -> None:
    # The kubeconfig names an address nothing answers on (a ClusterIP without rules); the
    # override names the server's own, and the kubeconfig's token is still sent.
    path = write_kubeconfig(tmp_path / "kubeconfig", apiserver)
    path.write_text(path.read_text().replace(apiserver.url, "http://192.0.2.1:443"))
    with api_client_from_config(str(path), server=apiserver.url) as client:
        assert client.configuration.host == apiserver.url
        assert _nodes(client) == []


@pytest.mark.parametrize("server", [False, True], ids=["own-server", "server-given"])
def test_a_colon_joined_kubeconfig_list_is_merged_with_or_without_a_server(
    apiserver: ApiServer, tmp_path: Path, server: bool
) -> None:
    """``a:b`` as the loader reads it (and kubectl's KUBECONFIG): the cluster and context in
    one file, the user in the other, a name missing here skipped. Given a server (``--master``
    for ``preflight`` and ``plan``), it replaces the merged cluster's, credentials kept."""
    first, second = tmp_path / "cluster.yaml", tmp_path / "users" / "user.yaml"
    write_kubeconfig(first, apiserver)
    doc = yaml.safe_load(first.read_text())
    del doc["users"]
    second.parent.mkdir()
    (second.parent / "token").write_text(f"{TOKEN}\n")  # named relative to its own file
    users = [{"name": "test", "user": {"tokenFile": "token"}}]
    if server:  # the kubeconfig's address answers nothing: only the override reaches it
        doc["clusters"][0]["cluster"]["server"] = "http://192.0.2.1:443"
    first.write_text(yaml.safe_dump(doc))
    second.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "users": users}))
    joined = f"{first}:{tmp_path / 'absent.yaml'}:{second}"
    override = apiserver.url if server else None
    with api_client_from_config(joined, server=override) as client:
        assert client.configuration.host == apiserver.url
        assert _nodes(client) == []  # the second file's token file found and read


def test_a_colon_joined_list_of_absent_files_is_a_config_error(tmp_path: Path) -> None:
    joined = f"{tmp_path / 'a'}:{tmp_path / 'b'}"
    with pytest.raises(ConfigError) as info:
        api_client_from_config(joined, server="https://192.0.2.1:6443")
    assert str(info.value).startswith(f"kubeconfig {joined}: ")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(None, "kubeconfig {path}: ", id="missing-file"),
        pytest.param("current-context: nowhere\n", "kubeconfig {path}: ", id="unknown-context"),
    ],
)
def test_bad_kubeconfig_is_a_config_error(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as info:
        api_client_from_config(str(path))
    assert str(info.value).startswith(message.format(path=path))


KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {{server: "https://127.0.0.1:6443", {ca}}}
users:
- name: u
  user: {{{user}}}
contexts:
- name: x
  context: {{cluster: c, user: u}}
current-context: x
"""


@pytest.mark.parametrize(
    ("ca", "user", "missing"),
    [
        pytest.param("insecure-skip-tls-verify: true", "tokenFile: {d}/token", "token", id="token"),
        pytest.param("certificate-authority: {d}/ca.crt", "token: abc", "ca.crt", id="ca"),
    ],
)
def test_a_missing_file_the_kubeconfig_names_is_named(
    tmp_path: Path, ca: str, user: str, missing: str
) -> None:
    """Not "kubeconfig X: No such file or directory", which reads as if X were missing."""
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG.format(ca=ca.format(d=tmp_path), user=user.format(d=tmp_path)))
    with pytest.raises(ConfigError) as info:
        api_client_from_config(str(path))
    assert str(info.value).startswith(f"kubeconfig {path}: ")
    assert str(tmp_path / missing) in str(info.value)


def test_no_kubeconfig_outside_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="not running in a pod"):
        api_client_from_config(None)


def test_backoff_grows_with_jitter_and_resets() -> None:
    backoff = Backoff(1.0, 8.0, rng=random.Random(7))
    delays = [backoff.next() for _ in range(6)]
    ceilings = [1, 2, 4, 8, 8, 8]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert len(set(delays)) == len(delays)  # jittered, not a fixed ladder
    backoff.reset()
    assert 0.5 <= backoff.next() <= 1.0


def _config_file(path: Path, apiserver: ApiServer, name: str, **extra: object) -> Path:
    """A kubeconfig whose context, cluster and user are all ``name``, its user reading the
    ``tokenFile`` ``name``.token beside it."""
    (path.parent / f"{name}.token").write_text(f"{name}-token\n")
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": apiserver.url}}],
        "users": [{"name": name, "user": {"tokenFile": f"{name}.token"}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        **extra,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("server", [False, True], ids=["own-server", "server-given"])
def test_in_a_kubeconfig_list_the_last_current_context_is_the_one_whose_token_is_sent(
    apiserver: ApiServer, tmp_path: Path, server: bool
) -> None:
    """The loader's merger lets each file's ``current-context`` replace the one before (the
    last file that sets it wins); the token file re-read is that context's user's, never the
    first file's, whose token belongs to someone else."""
    first = _config_file(tmp_path / "a.yaml", apiserver, "a", **{"current-context": "a"})
    second = _config_file(tmp_path / "b.yaml", apiserver, "b", **{"current-context": "b"})
    apiserver.token = "b-token"
    override = apiserver.url if server else None
    with api_client_from_config(f"{first}:{second}", server=override) as client:
        assert client.credentials == f"token file {tmp_path / 'b.token'}"
        assert _nodes(client) == []


@pytest.mark.parametrize(
    "provider",
    [
        pytest.param({"name": "some-sso"}, id="unknown-provider"),
        pytest.param({"name": "azure", "config": {"access-token": "x"}}, id="azure"),
        pytest.param({"config": {}}, id="no-name"),
        pytest.param({"name": "oidc"}, id="oidc-without-config"),
        pytest.param({"name": "oidc", "config": {"id-token": "not-a-jwt"}}, id="oidc-no-jwt"),
    ],
)
def test_a_token_file_beside_an_auth_provider_the_loader_passes_over_is_read_again(
    apiserver: ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, provider: object
) -> None:
    """The loader takes a gcp ``auth-provider``, and an oidc one holding a JWT; any other
    falls through to the ``tokenFile``, which is then read again as the kubelet rewrites it."""
    monkeypatch.setattr(token_file, "TOKEN_FILE_SECONDS", 0.0)  # read at every request
    path = _config_file(tmp_path / "kubeconfig", apiserver, "p", **{"current-context": "p"})
    doc = yaml.safe_load(path.read_text())
    doc["users"][0]["user"]["auth-provider"] = provider
    path.write_text(yaml.safe_dump(doc))
    (tmp_path / "p.token").write_text("p-token")  # as the loader could send it unread again
    apiserver.token = "p-token"
    with api_client_from_config(str(path)) as client:
        assert _nodes(client) == []
        (tmp_path / "p.token").write_text("rotated\n")
        apiserver.token = "rotated"
        assert _nodes(client) == []


@pytest.mark.parametrize("server", [False, True], ids=["own-server", "server-given"])
def test_a_kubeconfig_under_home_is_found_with_or_without_a_server(
    apiserver: ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: bool
) -> None:
    """``~/...`` (a ``--kubeconfig=~/...`` the shell left alone) is the home directory's, as
    the loader expands it, also when a server (``--master``, ``--api-server``) replaces the
    kubeconfig's; its ``tokenFile`` resolves beside it."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".kube").mkdir()
    _config_file(tmp_path / ".kube" / "config", apiserver, "h", **{"current-context": "h"})
    apiserver.token = "h-token"
    override = apiserver.url if server else None
    with api_client_from_config("~/.kube/config", server=override) as client:
        assert client.credentials == f"token file {tmp_path / '.kube' / 'h.token'}"
        assert _nodes(client) == []
