"""A token that cannot go into an HTTP header: ``http.client`` refuses a header value with a
line break or a character outside latin-1 (``ValueError``) before anything is sent.

The loader sends a kubeconfig's inline ``token`` as it is (a ``token: |`` block scalar ends in
a newline), so the ``Authorization`` value is trimmed; what is still not a header value is the
source's API error naming the header (never the token), retried as any other."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import structlog
import trio

from nlproxy.cluster import token_file
from nlproxy.cluster.kube import KubeSource, api_client_from_config
from nlproxy.cluster.model import Change, Replace
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import NODE, eventually, populate, start_source

KINDS = {"Service", "EndpointSlice", "Node", "ServiceCIDR"}


def _kubeconfig(path: Path, server: ApiServer, user: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: '{server.url}'}}}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
        f"users:\n- name: u\n  user:\n{user}"
    )
    return path


async def test_an_inline_block_scalar_token_is_sent_trimmed(
    apiserver: ApiServer, tmp_path: Path, nursery: trio.Nursery
) -> None:
    populate(apiserver)
    apiserver.token = "inline-token"
    path = _kubeconfig(tmp_path / "kubeconfig", apiserver, "    token: |\n      inline-token\n")
    with api_client_from_config(str(path)) as client:
        feed, _ = await start_source(nursery, client)
        assert {c.kind for c in feed.batches[0] if isinstance(c, Replace)} == KINDS


async def test_a_token_no_header_can_carry_is_an_api_error_retried_without_the_token(
    apiserver: ApiServer, tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(token_file, "TOKEN_FILE_SECONDS", 0.0)  # read at every request
    populate(apiserver)
    apiserver.token = "good-token"
    secret = "s3cr\u20acttoken"  # the euro sign is not latin-1
    (tmp_path / "token").write_text(secret, encoding="utf-8")
    path = _kubeconfig(tmp_path / "kubeconfig", apiserver, "    tokenFile: token\n")
    send, receive = trio.open_memory_channel[Sequence[Change]](100)
    with (
        api_client_from_config(str(path)) as client,
        structlog.testing.capture_logs() as logs,
    ):
        source = KubeSource(client, node_name=NODE, backoff_initial=0.05, backoff_max=0.3)
        nursery.start_soon(source.run, send)

        def errors() -> list[str]:
            return [str(e["error"]) for e in list(logs) if e["event"] == "source.list_error"]

        await eventually(lambda: len(errors()) >= 2)  # said, backed off, tried again
        assert all(secret not in str(e) and "s3cr" not in str(e) for e in list(logs))
        assert f"token file {tmp_path / 'token'}" in errors()[0]
        assert "Authorization header" in errors()[0]
        (tmp_path / "token").write_text("good-token\n")
        with trio.fail_after(30):
            batch = await receive.receive()
        assert {c.kind for c in batch if isinstance(c, Replace)} == KINDS
