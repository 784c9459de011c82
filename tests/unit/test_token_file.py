"""A kubeconfig user's ``tokenFile`` (``cluster/token_file.py``): which file is read again,
and how a read that fails leaves the token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from nlproxy.cluster import token_file
from nlproxy.cluster.kube_client import ConfigException, Configuration
from nlproxy.cluster.token_file import TokenFileRefresh, exec_plugin_of, token_file_of

# An oidc id-token shaped as a JWT (header.payload.signature, base64url): the loader takes it.
OIDC = {"id-token": "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ1In0.c2ln"}


def kubeconfig(tmp_path: Path, users: dict[str, dict[str, Any]], current: str) -> str:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://192.0.2.1:6443"}}],
        "users": [{"name": name, "user": user} for name, user in users.items()],
        "contexts": [{"name": name, "context": {"cluster": "c", "user": name}} for name in users],
        "current-context": current,
    }
    path = tmp_path / "conf" / "kubeconfig"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_the_token_file_is_the_current_or_named_contexts_users_resolved_beside_it(
    tmp_path: Path,
) -> None:
    """As the loader picks the user's credentials: a ``tokenFile`` comes before ``exec``, an
    ``auth-provider`` the loader takes (gcp; oidc with a JWT) before it; with ``token`` too,
    the file wins, as kube-proxy's client reads it."""
    users = {
        "relative": {"tokenFile": "token"},
        "absolute": {"tokenFile": "/var/run/secrets/token"},
        "both": {"tokenFile": "token", "token": "inline"},
        "plugin": {"tokenFile": "token", "exec": {"command": "x"}},
        "inline": {"token": "abc"},
        "gcp": {"tokenFile": "token", "auth-provider": {"name": "gcp"}},
        "oidc": {"tokenFile": "token", "auth-provider": {"name": "oidc", "config": OIDC}},
        "passed-over": {"tokenFile": "token", "auth-provider": {"name": "oidc"}},
    }
    path = kubeconfig(tmp_path, users, "relative")
    beside = str(tmp_path / "conf" / "token")
    assert token_file_of(path, None) == beside
    assert token_file_of(path, "absolute") == "/var/run/secrets/token"
    assert token_file_of(path, "both") == beside
    assert token_file_of(path, "plugin") == beside
    assert token_file_of(path, "passed-over") == beside  # an oidc provider without a token
    for name in ("inline", "gcp", "oidc", "missing"):
        assert token_file_of(path, name) is None


def test_the_kubeconfig_is_read_as_the_loader_reads_it_home_and_several_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``~`` is the home directory; ``a:b`` merges both, the first definition of a name
    winning, each user's file resolved beside the file that defines it; a file that cannot be
    read is skipped."""
    monkeypatch.setenv("HOME", str(tmp_path))
    first = kubeconfig(tmp_path, {"one": {"token": "x"}}, "two")
    second = tmp_path / "other" / "kubeconfig"
    second.parent.mkdir()
    doc = {
        "users": [{"name": "two", "user": {"tokenFile": "token"}}],
        "contexts": [{"name": "two", "context": {"cluster": "c", "user": "two"}}],
    }
    second.write_text(yaml.safe_dump(doc))
    merged = f"~/conf/kubeconfig:{tmp_path}/missing:{second}"
    assert token_file_of(merged, None) == str(tmp_path / "other" / "token")
    assert token_file_of(merged, "one") is None
    assert first == str(tmp_path / "conf" / "kubeconfig")


def test_a_read_that_fails_keeps_the_last_token_and_the_next_reads_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(token_file, "TOKEN_FILE_SECONDS", 0.0)
    file = tmp_path / "token"
    file.write_text("one\n")
    cfg = Configuration()
    refresh = TokenFileRefresh(str(file))
    refresh(cfg)
    assert cfg.api_key["BearerToken"] == "Bearer one"
    file.write_text("")
    with pytest.raises(ConfigException, match="exists but is empty"):
        refresh(cfg)
    assert cfg.api_key["BearerToken"] == "Bearer one"
    file.unlink()
    with pytest.raises(FileNotFoundError):
        refresh(cfg)
    file.write_text(" two ")
    refresh(cfg)
    assert cfg.api_key["BearerToken"] == "Bearer two"


def test_the_file_is_read_again_only_once_its_period_has_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(token_file, "TOKEN_FILE_SECONDS", 1e9)  # a period that never ends here
    file = tmp_path / "token"
    file.write_text("one")
    cfg = Configuration()
    refresh = TokenFileRefresh(str(file))
    refresh(cfg)
    file.write_text("two")
    refresh(cfg)  # within the period of the first read
    assert cfg.api_key["BearerToken"] == "Bearer one"


def test_in_a_list_the_last_current_context_wins_and_the_first_user_of_a_name(
    tmp_path: Path,
) -> None:
    """As ``KubeConfigMerger`` merges: each file's ``current-context`` replaces the one
    before; a user named again in a later file is the first file's."""
    first = kubeconfig(tmp_path, {"a": {"tokenFile": "a"}, "b": {"tokenFile": "b"}}, "a")
    later = tmp_path / "later" / "kubeconfig"
    later.parent.mkdir()
    doc = {"users": [{"name": "b", "user": {"tokenFile": "other"}}], "current-context": "b"}
    later.write_text(yaml.safe_dump(doc))
    assert token_file_of(f"{first}:{later}", None) == str(tmp_path / "conf" / "b")
    assert token_file_of(f"{later}:{first}", None) == str(tmp_path / "conf" / "a")


def test_the_exec_plugin_is_named_only_when_the_loader_runs_it(tmp_path: Path) -> None:
    """A failing plugin is said naming it; a user whose ``token``, ``tokenFile`` or taken
    ``auth-provider`` comes first never runs it, so it is not named."""
    plugin = {"command": "get-token"}
    users = {
        "exec": {"exec": plugin},
        "file-first": {"tokenFile": "token", "exec": plugin},
        "token-first": {"token": "t", "exec": plugin},
        "gcp-first": {"auth-provider": {"name": "gcp"}, "exec": plugin},
        "passed-over": {"auth-provider": {"name": "some-sso"}, "exec": plugin},
    }
    path = kubeconfig(tmp_path, users, "exec")
    named = {name: exec_plugin_of(path, name) for name in users}
    assert named == {
        "exec": "exec plugin get-token of kubeconfig user exec",
        "file-first": None,
        "token-first": None,
        "gcp-first": None,
        "passed-over": "exec plugin get-token of kubeconfig user passed-over",
    }
