"""What the loader's own failures say: the real cause, not a gcp provider that had a token to
send; never a section it dumps (a user's keys and tokens are in it); and names the loader
matches as YAML typed them (a number, ``on``) still match. Against the in-repo API server where
a file loads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from nlproxy.cluster.kube import api_client_from_config
from nlproxy.errors import ConfigError
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import TOKEN

SECRET = "PRIVATEKEYSECRET"


def kubeconfig(path: Path, server: str, user: dict[str, Any], **cluster: Any) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, **cluster}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def gcp(**config: Any) -> dict[str, Any]:
    return {"auth-provider": {"name": "gcp", "config": config}}


LATER = (datetime.now(UTC) + timedelta(days=3650)).strftime("%Y-%m-%dT%H:%M:%SZ")


def assert_the_missing_ca_is_named(tmp_path: Path, user: dict[str, Any]) -> None:
    """A kubeconfig for ``user`` whose cluster names a CA file that is not there: the refusal
    names that file, not the user's auth-provider."""
    missing = tmp_path / "nonexistent-ca.crt"
    path = kubeconfig(
        tmp_path / "kc", "https://127.0.0.1:1", user, **{"certificate-authority": str(missing)}
    )
    with pytest.raises(ConfigError) as info:
        api_client_from_config(str(path))
    assert str(info.value) == f"kubeconfig {path}: {missing}: No such file or directory"


def test_a_gcp_user_with_a_token_to_send_is_not_blamed_for_a_missing_ca(tmp_path: Path) -> None:
    assert_the_missing_ca_is_named(tmp_path, gcp(**{"access-token": "t", "expiry": LATER}))


def test_a_gcp_user_with_a_token_to_send_loads(apiserver: ApiServer, tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "kc", apiserver.url, gcp(**{"access-token": TOKEN}))
    with (
        api_client_from_config(str(path)) as client,
        kubernetes.client.ApiClient(client.configuration) as api,
    ):
        assert kubernetes.client.CoreV1Api(api).list_node().items == []


def test_a_gcp_cmd_path_that_fails_is_named_not_google_auth(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "kc", "https://127.0.0.1:1", gcp(**{"cmd-path": "/bin/false"}))
    with pytest.raises(ConfigError) as info:
        api_client_from_config(str(path))
    said = str(info.value)
    assert said.startswith(
        f"kubeconfig {path}: user u: auth-provider gcp: no access-token, and none could be had"
        " from cmd-path (ConfigException: cmd-path: process returned 1"
    )
    assert "google-auth" not in said
    assert "\n" not in said


@pytest.mark.parametrize(
    "user",
    [
        pytest.param({"token": None, "client-key-data": SECRET}, id="token-null"),
        pytest.param(
            {"client-certificate-data": None, "client-key-data": SECRET}, id="cert-data-null"
        ),
    ],
)
def test_a_key_the_loader_expected_is_named_and_no_section_is_shown(
    tmp_path: Path, user: dict[str, Any]
) -> None:
    path = kubeconfig(tmp_path / "kc", "https://127.0.0.1:1", user)
    with pytest.raises(ConfigError) as info:
        api_client_from_config(str(path))
    said = str(info.value)
    assert said.startswith(f"kubeconfig {path}: ")
    assert "is missing or empty" in said
    assert SECRET not in said
    assert "{" not in said
    assert "\n" not in said


def test_names_yaml_reads_as_a_number_or_a_boolean_match_as_the_loader_matches_them(
    apiserver: ApiServer, tmp_path: Path
) -> None:
    text = f"""apiVersion: v1
kind: Config
clusters:
- name: on
  cluster: {{server: "{apiserver.url}"}}
users:
- name: 7
  user: {{token: {TOKEN}}}
contexts:
- name: 1
  context: {{cluster: on, user: 7}}
current-context: 1
"""
    path = tmp_path / "kc"
    path.write_text(text)
    with (
        api_client_from_config(str(path)) as client,
        kubernetes.client.ApiClient(client.configuration) as api,
    ):
        assert kubernetes.client.CoreV1Api(api).list_node().items == []


def test_a_gcp_token_refreshed_then_another_failure_names_that_failure(tmp_path: Path) -> None:
    """A legacy GKE user: an expired token and a ``cmd-path`` that gives a new one. The
    refresh works; the missing CA after it is what failed."""
    helper = tmp_path / "gcloud"
    helper.write_text(
        "#!/bin/sh\necho '"
        '{"credential": {"access_token": "t", "token_expiry": "2099-01-01T00:00:00Z"}}'
        "'\n"
    )
    helper.chmod(0o755)
    user = gcp(**{"access-token": "old", "expiry": "2020-01-01T00:00:00Z", "cmd-path": str(helper)})
    assert_the_missing_ca_is_named(tmp_path, user)


def test_an_expiry_the_loader_reads_is_read_so(tmp_path: Path) -> None:
    """Lowercase ``t`` and ``z`` are RFC 3339 as the loader reads it: the token is sent, and
    the missing CA is what failed."""
    later = LATER.replace("T", "t").replace("Z", "z")
    assert_the_missing_ca_is_named(tmp_path, gcp(**{"access-token": "t", "expiry": later}))


def test_an_exec_plugin_missing_a_key_keeps_its_name(tmp_path: Path) -> None:
    user = {"exec": {"apiVersion": None, "command": "true"}, "client-key-data": SECRET}
    path = kubeconfig(tmp_path / "kc", "https://127.0.0.1:1", user)
    with pytest.raises(ConfigError) as info:
        api_client_from_config(str(path))
    said = str(info.value)
    assert said.startswith(f"kubeconfig {path}: exec plugin")
    assert said.endswith("apiVersion is missing or empty")
    assert SECRET not in said


def test_a_cluster_named_empty_loads(apiserver: ApiServer, tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "kc", apiserver.url, {"token": TOKEN})
    doc = yaml.safe_load(path.read_text())
    doc["clusters"][0]["name"] = ""
    doc["contexts"][0]["context"]["cluster"] = ""
    path.write_text(yaml.safe_dump(doc))
    with (
        api_client_from_config(str(path)) as client,
        kubernetes.client.ApiClient(client.configuration) as api,
    ):
        assert kubernetes.client.CoreV1Api(api).list_node().items == []
