"""A cold start's own notifications overrun the drift monitor's socket (at 10k Services its one
batch is hundreds of thousands of them): the loop checks the lost generations against its own
commits and reads nothing back. Another process's write afterwards is read back and repaired,
which shows the same wiring does read back when it must."""

from __future__ import annotations

import socket
from collections.abc import Callable

import structlog.testing
import trio
from prometheus_client import CollectorRegistry

from nlproxy.cluster.model import Change
from nlproxy.netlink.nlsock import SO_RCVBUFFORCE
from nlproxy.nft.monitor import NftMonitor
from nlproxy.proxy.naming import TABLE
from nlproxy.serve.health import HealthState
from nlproxy.serve.metrics import Metrics
from nlproxy.sync.kernel import real as real_kernel
from nlproxy.sync.loop import SyncLoop
from nlproxy.sync.syncer import Syncer
from tests.kube.conftest import eventually
from tests.netns import sh
from tests.unit.builders import endpoint, eps_slice, service, upsert
from tests.unit.incremental import CONFIG, state_with_node

SERVICES = 400
BOUND = 90.0  # seconds: generous, for a loaded machine


async def test_a_cold_starts_own_lost_notifications_read_nothing_back(
    make_netns: Callable[[str], str],
) -> None:
    ns = make_netns("nlc")
    changes: list[Change] = []
    for i in range(SERVICES):
        name = f"web{i}"
        changes.append(upsert(service("a", name, f"172.30.{i // 250}.{i % 250 + 1}")))
        ips = [f"10.0.{i // 100}.{i % 100 * 2 + k + 1}" for k in range(2)]
        changes.append(upsert(eps_slice("a", name, [endpoint(ip) for ip in ips])))
    syncer = Syncer(CONFIG, real_kernel(ns))
    metrics = Metrics(CollectorRegistry())
    loop = SyncLoop(
        state_with_node(),
        syncer,
        health=HealthState(grace_seconds=120),
        metrics=metrics,
        min_interval=0.1,
        sync_period=3600.0,
        # Syncs on the event loop: the monitor reads nothing while the first one commits, so
        # its socket overruns every time (in a worker thread, as in the daemon, that takes a
        # batch large enough to outrun the reader: 10k Services do, bench/bench_daemon.py).
        in_thread=False,
    )
    monitor = NftMonitor(TABLE, netns_name=ns)
    # Far smaller than the first batch's notifications: the kernel drops most of them.
    monitor.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 4096)
    send, recv = trio.open_memory_channel[list[Change]](4)

    def events(name: str, logs: list[dict[str, object]]) -> list[dict[str, object]]:
        return [e for e in logs if e["event"] == name]

    def read_backs() -> float:
        labels = {"read_back": "true"}
        return metrics.registry.get_sample_value("nlproxy_verifies_total", labels) or 0.0

    try:
        with structlog.testing.capture_logs() as logs:
            async with trio.open_nursery() as nursery:
                await nursery.start(monitor.run, loop.request_verify)
                await send.send(changes)
                await nursery.start(loop.run, recv)
                await eventually(lambda: bool(events("drift.notifications_lost", logs)), BOUND)
                await trio.sleep(1.0)  # a read-back it caused would have begun by now
                lost = events("drift.notifications_lost", logs)
                assert [e["own"] for e in lost] == [True] * len(lost)
                assert events("verify.read_back", logs) == []
                assert read_backs() == 0
                assert events("sync.applied", logs)[0]["ops"] > SERVICES * 4

                # Another writer: read back and repaired.
                await trio.to_thread.run_sync(
                    lambda: sh("nft", "add", "chain", "ip", TABLE, "intruder", ns=ns)
                )
                await eventually(lambda: bool(events("drift.repaired", logs)), BOUND)
                assert read_backs() == 1
                nursery.cancel_scope.cancel()
    finally:
        syncer.close()
    assert "intruder" not in sh("nft", "list", "table", "ip", TABLE, ns=ns)
