"""A kubeconfig user whose ``auth-provider`` the client's loader takes but cannot use (an oidc
one without an ``id-token`` or with a malformed one, a gcp one with no token to send) is a
configuration error naming the file and the user, however the loader fails on it (its own
``ConfigException`` with a dump of the user's section, a ``KeyError``, a ``TypeError``, a JSON
error, a connection error while refreshing): never an internal error. The shapes the loader
passes over (azure, an unknown name, no name, oidc without ``config`` or without a JWT) leave
the user's ``token`` in use, against the in-repo API server. (The commands that load a
kubeconfig say the same through the command line: ``tests/kernel/test_auth_provider_cli.py``.)
"""

from __future__ import annotations

import base64
import json
import socket
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from nlproxy.cluster.kube import api_client_from_config
from nlproxy.errors import ConfigError
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import TOKEN


def jwt(claims: object) -> str:
    """A token shaped as a JWT (the loader reads its payload, never its signature)."""
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"e30.{body}.c2ln"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return int(sock.getsockname()[1])


EXPIRED = jwt({"exp": 1})
NOT_JSON = "e30." + base64.urlsafe_b64encode(b"not json").decode().rstrip("=") + ".c2ln"

REFUSED = [
    pytest.param(
        {"name": "oidc", "config": {"client-id": "k"}},
        "auth-provider oidc: config has no id-token",
        id="oidc-without-id-token",
    ),
    pytest.param(
        {"name": "oidc", "config": {"id-token": 5}},
        "auth-provider oidc: id-token is not a string",
        id="oidc-id-token-a-number",
    ),
    pytest.param(
        {"name": "oidc", "config": "id-token"},
        "auth-provider oidc: config is not a mapping",
        id="oidc-config-a-string",
    ),
    pytest.param(
        {"name": "oidc", "config": None},
        "auth-provider oidc: config is not a mapping",
        id="oidc-config-empty",
    ),
    pytest.param(
        {"name": "oidc", "config": {"id-token": NOT_JSON}},
        "auth-provider oidc: id-token is not a JWT (its payload is no JSON object)",
        id="oidc-payload-not-json",
    ),
    pytest.param(
        {"name": "oidc", "config": {"id-token": jwt([1])}},
        "auth-provider oidc: id-token is not a JWT (its payload is no JSON object)",
        id="oidc-payload-a-list",
    ),
    pytest.param(
        {"name": "oidc", "config": {"id-token": jwt({"exp": "soon"})}},
        "auth-provider oidc: id-token: exp 'soon' is not a number",
        id="oidc-exp-not-a-number",
    ),
    pytest.param(
        {"name": "oidc", "config": {"id-token": EXPIRED}},
        "auth-provider oidc: id-token expired, and could not be refreshed (no idp-issuer-url)",
        id="oidc-expired-without-issuer",
    ),
    pytest.param(
        {
            "name": "oidc",
            "config": {
                "id-token": EXPIRED,
                "idp-issuer-url": "https://127.0.0.1:{port}",
                "client-id": "k",
                "refresh-token": "r",
            },
        },
        "auth-provider oidc: id-token expired, and could not be refreshed (MaxRetryError: ",
        id="oidc-expired-issuer-unreachable",
    ),
    pytest.param(
        {"name": "gcp"},
        "auth-provider gcp: no access-token, and none could be had (",
        id="gcp-without-config",
    ),
    pytest.param(
        {"name": "gcp", "config": {"access-token": "x", "expiry": "soon"}},
        "auth-provider gcp: expiry 'soon' is not an RFC 3339 time",
        id="gcp-expiry-not-a-time",
    ),
    pytest.param(None, "auth-provider: not a mapping", id="auth-provider-empty"),
]

PASSED_OVER = [
    pytest.param({"name": "azure", "config": {"access-token": "x"}}, id="azure"),
    pytest.param({"name": "some-sso", "config": {}}, id="unknown-name"),
    pytest.param({"config": {"id-token": 5}}, id="no-name"),
    pytest.param({"name": "oidc"}, id="oidc-without-config"),
    pytest.param({"name": "oidc", "config": {"id-token": "not-a-jwt"}}, id="oidc-not-a-jwt"),
    pytest.param("oidc", id="a-string"),
]


def write_user(path: Path, server: str, provider: Any, *, port: int = 0) -> Path:
    """A kubeconfig whose user ``u`` has ``provider`` and the API server's token."""
    if isinstance(provider, dict) and isinstance(provider.get("config"), dict):
        config = provider["config"]
        provider = {**provider, "config": {k: str(v).format(port=port) if k == "idp-issuer-url"
                                           else v for k, v in config.items()}}  # fmt: skip
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": TOKEN, "auth-provider": provider}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("override", [False, True], ids=["own-server", "server-given"])
@pytest.mark.parametrize(("provider", "says"), REFUSED)
def test_a_provider_the_loader_cannot_use_is_a_config_error_naming_file_and_user(
    tmp_path: Path, provider: Any, says: str, override: bool
) -> None:
    port = closed_port()
    server = f"https://127.0.0.1:{closed_port()}"
    path = write_user(tmp_path / "kubeconfig", server, provider, port=port)
    with pytest.raises(ConfigError) as info:
        api_client_from_config(str(path), server=server if override else None)
    assert str(info.value).startswith(f"kubeconfig {path}: user u: {says}")
    assert "\n" not in str(info.value)


def test_in_a_list_the_file_defining_the_user_is_named(tmp_path: Path) -> None:
    cluster = write_user(tmp_path / "cluster", "https://127.0.0.1:1", "ignored")
    doc = yaml.safe_load(cluster.read_text())
    users = doc.pop("users")
    cluster.write_text(yaml.safe_dump(doc))
    users[0]["user"]["auth-provider"] = {"name": "oidc", "config": {}}
    (tmp_path / "users").write_text(yaml.safe_dump({"users": users}))
    with pytest.raises(ConfigError) as info:
        api_client_from_config(f"{cluster}:{tmp_path / 'users'}")
    said = f"kubeconfig {tmp_path / 'users'}: user u: auth-provider oidc: config has no id-token"
    assert str(info.value) == said


@pytest.mark.parametrize("provider", PASSED_OVER)
def test_a_provider_the_loader_passes_over_leaves_the_token(
    apiserver: ApiServer, tmp_path: Path, provider: Any
) -> None:
    path = write_user(tmp_path / "kubeconfig", apiserver.url, provider)
    with (
        api_client_from_config(str(path)) as client,
        kubernetes.client.ApiClient(client.configuration) as api,
    ):
        assert kubernetes.client.CoreV1Api(api).list_node().items == []  # the token accepted
