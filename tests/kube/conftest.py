"""Fixtures for the kube source tests: the in-repo API server and a real ``kubernetes`` client."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml

from nlproxy.cluster.kube import KubeSource, api_client_from_config
from nlproxy.cluster.model import Change, Replace, Upsert
from tests.kube.apiserver import ApiServer
from tests.objects import endpoint, endpoint_slice, node, service, service_cidr

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

    async def batch(self, within: float = 60) -> Sequence[Change]:
        with trio.fail_after(within):
            batch = await self.receive.receive()
        self.batches.append(batch)
        return batch

    async def until(self, pred: Callable[[Change], bool], within: float = 60) -> list[Change]:
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


async def eventually(pred: Callable[[], bool], within: float = 60) -> None:
    """Wait for a condition on the (threaded) server's state."""
    with trio.fail_after(within):
        while True:
            if pred():
                return
            await trio.sleep(0.01)


# -- helpers the kube tests share -----------------------------------------------------------


def by_kind(batch: Sequence[Change]) -> dict[str, Replace]:
    """The Replace of each kind in an initial batch (which holds nothing else)."""
    replaces = {c.kind: c for c in batch if isinstance(c, Replace)}
    assert len(replaces) == len(batch), batch
    return replaces


def names(replace: Replace) -> set[str]:
    """The object names a Replace lists."""
    return {c.ref.name for c in replace.changes}


def is_upsert_of(name: str, kind: str = "Service") -> Any:
    """A predicate: the change is an Upsert of that object."""
    return lambda c: isinstance(c, Upsert) and c.ref.kind == kind and c.ref.name == name


def populate(apiserver: ApiServer, services: int = 3) -> None:
    """``services`` Services with a slice each, this node and another, one ServiceCIDR."""
    for i in range(services):
        apiserver.store.put("services", service(f"svc-{i}", cluster_ip=f"10.96.0.{i + 1}"))
        apiserver.store.put(
            "endpointslices",
            endpoint_slice(f"svc-{i}", [endpoint("10.0.0.1", "node-a")], name=f"svc-{i}-abc"),
        )
    apiserver.store.put("nodes", node(NODE))
    apiserver.store.put("nodes", node("node-b", ip="192.0.2.2"))
    apiserver.store.put("servicecidrs", service_cidr("kubernetes"))
