"""RouteWatcher: rtnetlink notifications from a real namespace wake the inspector."""

from __future__ import annotations

import pathlib
from collections.abc import Callable

import pytest
import trio

from nlproxy.errors import ConfigError
from nlproxy.inspect.watch import RouteWatcher
from tests.kernel.inspect_bed import ip

MakeNetns = Callable[[str], str]
QUIET_S = 0.3  # how long "nothing relevant happened" is watched for
WAKE_S = 10.0  # upper bound for a notification that must come


@pytest.fixture
def node(make_netns: MakeNetns) -> str:
    ns = make_netns("watch")
    ip(ns, "link", "add", "vethw0", "type", "veth", "peer", "name", "vethw1")
    ip(ns, "link", "set", "vethw0", "up")
    ip(ns, "link", "set", "vethw1", "up")
    ip(ns, "addr", "add", "10.9.0.1/24", "dev", "vethw0")
    return ns


def test_link_down_wakes(node: str) -> None:
    with RouteWatcher(node) as w:
        assert not w.wait_for_change(QUIET_S)
        ip(node, "link", "set", "vethw1", "down")
        assert w.wait_for_change(WAKE_S)


def test_route_change_wakes(node: str) -> None:
    with RouteWatcher(node) as w:
        ip(node, "route", "add", "10.244.3.0/24", "via", "10.9.0.2")
        assert w.wait_for_change(WAKE_S)
        ip(node, "route", "del", "10.244.3.0/24")
        assert w.wait_for_change(WAKE_S)


def test_only_failed_neighbours_wake(node: str) -> None:
    with RouteWatcher(node) as w:
        ip(node, "neigh", "add", "10.9.0.7", "dev", "vethw0", "lladdr", "02:00:00:00:00:07")
        assert not w.wait_for_change(QUIET_S), "a new healthy neighbour is not a change"
        ip(node, "neigh", "replace", "10.9.0.7", "dev", "vethw0", "nud", "failed")
        assert w.wait_for_change(WAKE_S), "becoming FAILED is a change"
        ip(node, "neigh", "replace", "10.9.0.7", "dev", "vethw0", "lladdr", "02:00:00:00:00:07")
        assert w.wait_for_change(WAKE_S), "leaving FAILED is a change"
        ip(node, "neigh", "del", "10.9.0.7", "dev", "vethw0")
        assert w.wait_for_change(WAKE_S), "a deleted neighbour is a change"


def test_other_namespaces_are_not_seen(node: str, make_netns: MakeNetns) -> None:
    other = make_netns("watch-other")
    with RouteWatcher(node) as w:
        ip(other, "link", "set", "lo", "down")
        assert not w.wait_for_change(QUIET_S)


async def test_changed_in_trio(node: str) -> None:
    with RouteWatcher(node) as w:
        async with trio.open_nursery() as nursery:

            async def waiter() -> None:
                with trio.fail_after(WAKE_S):
                    await w.changed()

            nursery.start_soon(waiter)
            await trio.to_thread.run_sync(ip, node, "link", "set", "vethw0", "down")


def test_overrun_counts_as_change(node: str, tmp_path: pathlib.Path) -> None:
    batch = tmp_path / "routes"
    batch.write_text(
        "".join(f"route add 10.{250 + i // 250}.{i % 250}.0/24 via 10.9.0.2\n" for i in range(500))
    )
    with RouteWatcher(node, rcvbuf=1) as w:  # the kernel's minimum: notifications get lost
        ip(node, "-batch", str(batch))
        assert w.wait_for_change(WAKE_S)
        assert not w.wait_for_change(QUIET_S), "one wake-up drains everything queued"


def test_missing_namespace_names_it() -> None:
    with pytest.raises(ConfigError, match="netns nlp-does-not-exist"):
        RouteWatcher("nlp-does-not-exist")
