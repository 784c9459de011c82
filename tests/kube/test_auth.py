"""Credentials that change while the source runs: an exec credential plugin whose token rotates.

The ``kubernetes`` package runs the plugin (as ``kubectl`` would) and runs it again when its token
expires; the in-repo API server accepts only the current token. After a rotation the source's
next requests must carry the new token, or it would stop seeing the cluster until restarted.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
import yaml

from nlproxy.cluster import token_file
from nlproxy.cluster.kube import KubeSource, api_client_from_config
from nlproxy.cluster.kube_client import in_cluster_loading
from nlproxy.cluster.model import Change, Replace
from nlproxy.errors import ConfigError
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import NODE, eventually, is_upsert_of, populate, start_source
from tests.kube.tls import make_pki
from tests.objects import service

# The plugin: prints an ExecCredential with the token in TOKEN_FILE, expiring at once (so the
# client runs it again before each request), and counts its runs.
PLUGIN = """
import datetime, json, pathlib, sys
state = pathlib.Path(sys.argv[1])
with (state / "runs").open("a") as runs:
    print("run", file=runs)
now = datetime.datetime.now(datetime.timezone.utc)
print(json.dumps({
    "apiVersion": "client.authentication.k8s.io/v1",
    "kind": "ExecCredential",
    "status": {
        "token": (state / "token").read_text().strip(),
        "expirationTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    },
}))
"""


def _in_cluster(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ca: Path, port: int, token_text: str
) -> Path:
    """A pod's view of the API server at 127.0.0.1:``port``: its service account token file
    (holding ``token_text``, returned) and CA, and the service environment."""
    token = tmp_path / "token"
    token.write_text(token_text)
    incluster = in_cluster_loading()
    monkeypatch.setattr(incluster, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster, "SERVICE_CERT_FILENAME", str(ca))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(port))
    return token


def exec_kubeconfig(tmp: Path, server: ApiServer) -> tuple[Path, Path]:
    """A kubeconfig whose user runs the plugin; returns it and the plugin's state directory."""
    state = tmp / "plugin"
    state.mkdir()
    (tmp / "plugin.py").write_text(PLUGIN)
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(tmp / "plugin.py"), str(state)],
            "interactiveMode": "Never",
        }
    }
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server.url}}],
        "users": [{"name": "test", "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "current-context": "test",
    }
    path = tmp / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path, state


def plugin_runs(state: Path) -> int:
    return len((state / "runs").read_text().splitlines())


def client_with(tmp: Path, server: ApiServer, handed: str, accepted: str) -> tuple[Any, Path]:
    """A populated server accepting ``accepted``, and a client whose plugin hands ``handed``."""
    populate(server)
    path, state = exec_kubeconfig(tmp, server)
    (state / "token").write_text(handed)
    server.token = accepted
    return api_client_from_config(str(path)), state


async def test_exec_plugin_token_rotation_is_followed(
    apiserver: ApiServer, tmp_path: Path, nursery: trio.Nursery
) -> None:
    client, state = client_with(tmp_path, apiserver, "token-1", "token-1")
    try:
        feed, _ = await start_source(nursery, client)
        runs = plugin_runs(state)
        assert runs >= 1
        # Rotate: the server accepts only the new token from now on, and drops the open
        # watches (as a real API server does when a token is revoked).
        (state / "token").write_text("token-2")
        apiserver.token = "token-2"
        apiserver.drop_connections()
        apiserver.store.put("services", service("after-rotation", cluster_ip="10.96.1.9"))
        await feed.until(is_upsert_of("after-rotation"), within=20)
        assert plugin_runs(state) > runs
    finally:
        client.close()


async def test_a_rejected_token_is_retried_not_fatal(
    apiserver: ApiServer, tmp_path: Path, nursery: trio.Nursery
) -> None:
    client, state = client_with(tmp_path, apiserver, "stale", "fresh")
    send, receive = trio.open_memory_channel[Sequence[Change]](100)
    source = KubeSource(client, node_name=NODE, backoff_initial=0.05, backoff_max=0.3)
    try:
        nursery.start_soon(source.run, send)
        # Refused, backed off, tried again: not given up. Waited for, not timed: on a loaded
        # machine the second try can come well after the backoff's 0.05 s.
        await eventually(
            lambda: sum(1 for p, _ in apiserver.requests if p == "/api/v1/services") >= 2
        )
        with pytest.raises(trio.WouldBlock):
            receive.receive_nowait()  # and nothing was made up meanwhile
        # The credential is renewed (the plugin now hands out the accepted token): the
        # source lists the cluster without a restart.
        (state / "token").write_text("fresh")
        with trio.fail_after(20):
            batch = await receive.receive()
        kinds = {c.kind for c in batch if isinstance(c, Replace)}
        assert kinds == {"Service", "EndpointSlice", "Node", "ServiceCIDR"}
    finally:
        client.close()


async def test_an_in_cluster_token_file_empty_at_a_refresh_keeps_the_last_token_and_says_so(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kubelet rewrites the service account token; a refresh that finds the file empty
    (or gone) is said once, naming the file, and the last token is sent meanwhile: the source
    goes on following the server, which still takes it, and says when the token is renewed."""
    pki = make_pki(tmp_path / "pki", "127.0.0.1")
    server = ApiServer(token="pod-token", tls=pki.server_context())
    server.start()
    try:
        populate(server)
        token = _in_cluster(monkeypatch, tmp_path, pki.ca, server.port, "pod-token")
        monkeypatch.setattr(token_file, "TOKEN_FILE_SECONDS", 0.0)  # read at every request
        client = api_client_from_config(None)
        try:
            with structlog.testing.capture_logs() as logs:
                feed, _ = await start_source(nursery, client)
                token.write_text("")  # mid-rotation
                server.drop_connections()  # the watches ask again, with a refresh each
                failed = f"token file {token}: not renewed: token file {token} exists but is empty"

                def said(event: str) -> Callable[[], bool]:
                    return lambda: any(e["event"] == event for e in list(logs))

                await eventually(said("source.credentials_not_renewed"))
                server.store.put("services", service("meanwhile", cluster_ip="10.96.1.8"))
                await feed.until(is_upsert_of("meanwhile"), within=30)
                token.write_text("pod-token")
                server.drop_connections()
                await eventually(said("source.credentials_renewed"))
                server.store.put("services", service("after-refresh", cluster_ip="10.96.1.9"))
                await feed.until(is_upsert_of("after-refresh"), within=30)
            lines = [e for e in logs if e["event"] == "source.credentials_not_renewed"]
            assert [(e["error"], e["log_level"]) for e in lines] == [(failed, "warning")]
            errors = ("source.watch_error", "source.list_error")
            assert not [e for e in logs if e["event"] in errors]
        finally:
            client.close()
    finally:
        server.stop()


async def test_a_kubeconfig_token_file_rewritten_by_the_kubelet_is_followed(
    apiserver: ApiServer, tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kubeadm's kube-proxy kubeconfig names the pod's projected token as ``tokenFile`` (a
    path relative to the kubeconfig resolves beside it); the kubelet rewrites the file before
    the token expires. The source sends the new token, trimmed, without a restart."""
    monkeypatch.setattr(token_file, "TOKEN_FILE_SECONDS", 0.0)  # read at every request
    populate(apiserver)
    (tmp_path / "token").write_text("token-1\n")
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": apiserver.url}}],
        "users": [{"name": "test", "user": {"tokenFile": "token"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "current-context": "test",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    apiserver.token = "token-1"
    client = api_client_from_config(str(path))
    try:
        feed, _ = await start_source(nursery, client)
        (tmp_path / "token").write_text("token-2\n")
        apiserver.token = "token-2"
        apiserver.drop_connections()
        apiserver.store.put("services", service("after-rotation", cluster_ip="10.96.1.9"))
        await feed.until(is_upsert_of("after-rotation"), within=30)
    finally:
        client.close()


async def test_an_in_cluster_token_file_ending_in_a_newline_is_sent_trimmed(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service account token written with a trailing newline (by hand, or by a tool that
    ends its files so) is sent trimmed, as a kubeconfig's ``tokenFile`` is: a newline in the
    header is refused by the HTTP library before any request leaves ("Invalid header value")."""
    pki = make_pki(tmp_path / "pki", "127.0.0.1")
    server = ApiServer(token="pod-token", tls=pki.server_context())
    server.start()
    try:
        populate(server)
        token = _in_cluster(monkeypatch, tmp_path, pki.ca, server.port, "pod-token\n")
        client = api_client_from_config(None)
        try:
            feed, _ = await start_source(nursery, client)
            server.store.put("services", service("listed", cluster_ip="10.96.1.7"))
            await feed.until(is_upsert_of("listed"), within=30)
            # Renewed from the file at its refresh, trimmed all the same.
            token.write_text("pod-token-2\n")
            server.token = "pod-token-2"
            monkeypatch.setattr(token_file, "TOKEN_FILE_SECONDS", 0.0)
            server.drop_connections()
            server.store.put("services", service("renewed", cluster_ip="10.96.1.8"))
            await feed.until(is_upsert_of("renewed"), within=30)
        finally:
            client.close()
    finally:
        server.stop()


async def test_a_failing_exec_plugin_is_said_once_naming_the_user_not_on_the_root_logger(
    apiserver: ApiServer,
    tmp_path: Path,
    nursery: trio.Nursery,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client catches an exec plugin's failure and logs it on the root logger, at every
    request whose token has expired (here: all of them), and sends the last token. It is said
    once instead, as nlproxy's own warning naming the kubeconfig user and the plugin, and its
    end is said when the plugin works again."""
    client, state = client_with(tmp_path, apiserver, "token-1", "token-1")
    try:
        with structlog.testing.capture_logs() as logs:
            feed, _ = await start_source(nursery, client)
            runs = plugin_runs(state)
            (state / "token").unlink()  # the plugin fails from now on (FileNotFoundError)
            apiserver.drop_connections()  # the watches ask again, each running the plugin
            await eventually(lambda: plugin_runs(state) >= runs + 4)  # a watch of each kind
            apiserver.store.put("services", service("meanwhile", cluster_ip="10.96.1.8"))
            await feed.until(is_upsert_of("meanwhile"), within=30)  # the last token still goes
            (state / "token").write_text("token-1")
            apiserver.drop_connections()
            await eventually(lambda: any(e["event"] == "source.credentials_renewed" for e in logs))
        failed = [e for e in logs if e["event"] == "source.credentials_not_renewed"]
        assert len(failed) == 1, failed
        error = failed[0]["error"]
        assert "kubeconfig user test" in error
        assert f"exec plugin {sys.executable}" in error
        assert "exit code 1" in error or "returned 1" in error
        assert not [r for r in caplog.records if r.name == "root"]
    finally:
        client.close()


def test_an_exec_plugin_failing_at_start_is_a_config_error_naming_it(
    apiserver: ApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without a token from the start there is nothing to send: one error naming the
    kubeconfig, its user and the plugin (exit 2 for ``run``), not a root-logger line."""
    path, _ = exec_kubeconfig(tmp_path, apiserver)  # no token file: the plugin fails
    with pytest.raises(ConfigError) as info:
        api_client_from_config(str(path))
    error = str(info.value)
    assert error.startswith(
        f"kubeconfig {path}: exec plugin {sys.executable} of kubeconfig user test: "
    )
    assert "FileNotFoundError" in error
    assert "\n" not in error
    assert not [r for r in caplog.records if r.name == "root"]
