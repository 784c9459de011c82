"""Fixtures for the kube source tests: the in-repo API server and a real ``kubernetes`` client."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml

from nlproxy.cluster.kube import KubeSource, api_client_from_config
from nlproxy.cluster.model import Change, Replace
from tests.kube.apiserver import ApiServer

TOKEN = "kube-test-token"
NODE = "node-a"


@pytest.fixture
def apiserver() -> Iterator[ApiServer]:
    server = ApiServer(token=TOKEN)
    server.start()
    yield server
    server.stop()


def write_kubeconfig(path: Path, server: ApiServer, token: str = TOKEN) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server.url}}],
        "users": [{"name": "test", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def api_client(apiserver: ApiServer, tmp_path: Path) -> Iterator[Any]:
    client = api_client_from_config(str(write_kubeconfig(tmp_path / "kubeconfig", apiserver)))
    yield client
    client.close()


class Feed:
    """What the source sent, batch by batch, with waits bounded by ``fail_after``."""

    def __init__(self, receive: trio.MemoryReceiveChannel[Sequence[Change]]) -> None:
        self.receive = receive
        self.batches: list[Sequence[Change]] = []

    async def batch(self, within: float = 10) -> Sequence[Change]:
        with trio.fail_after(within):
            batch = await self.receive.receive()
        self.batches.append(batch)
        return batch

    async def until(self, pred: Callable[[Change], bool], within: float = 10) -> list[Change]:
        """Changes received up to and including the first one matching ``pred``."""
        seen: list[Change] = []
        with trio.fail_after(within):
            while True:
                for change in await self.batch():
                    seen.append(change)
                    if pred(change):
                        return seen

    async def nothing_for(self, seconds: float) -> None:
        with trio.move_on_after(seconds):
            batch = await self.receive.receive()
            raise AssertionError(f"expected no changes, got {batch}")

    def replaces(self, seen: Sequence[Change]) -> list[Replace]:
        return [c for c in seen if isinstance(c, Replace)]


async def start_source(
    nursery: trio.Nursery, client: Any, **kwargs: Any
) -> tuple[Feed, KubeSource]:
    """Start a source; returns once its initial batch was sent (that batch is read here)."""
    send, receive = trio.open_memory_channel[Sequence[Change]](1000)
    options = {"node_name": NODE, "backoff_initial": 0.05, "backoff_max": 0.3, **kwargs}
    source = KubeSource(client, **options)
    with trio.fail_after(60):
        await nursery.start(source.run, send)
    feed = Feed(receive)
    await feed.batch()
    return feed, source


async def eventually(pred: Callable[[], bool], within: float = 10) -> None:
    """Wait for a condition on the (threaded) server's state."""
    with trio.fail_after(within):
        while True:
            if pred():
                return
            await trio.sleep(0.01)
