"""Notifications the kernel could not queue (ENOBUFS) are a drift by an unknown writer: the
monitor cannot tell what changed, only which generations the lost ones may belong to, so the
daemon verifies everything unless those were all its own commits."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import trio

from nlproxy.netlink.nlsock import SO_RCVBUFFORCE
from nlproxy.nft.monitor import Drift, NftMonitor


async def test_an_overrun_receive_buffer_is_reported_as_a_drift(
    make_netns: Callable[[str], str], tmp_path: Path
) -> None:
    ns = make_netns("nlq")
    monitor = NftMonitor("nlproxy", netns_name=ns)
    before = monitor.detector.generation
    assert before is not None
    # A buffer far smaller than the burst below: the kernel drops notifications.
    monitor.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 4096)
    elements = ", ".join(f"10.0.{i // 250}.{i % 250 + 1}" for i in range(2000))
    script = tmp_path / "burst.nft"
    script.write_text(
        f"table ip nlproxy {{\n  set s {{ type ipv4_addr; elements = {{ {elements} }} }}\n}}\n"
    )
    await trio.run_process(["ip", "netns", "exec", ns, "nft", "-f", str(script)])
    drifts: list[Drift] = []
    lost = trio.Event()

    def on_drift(drift: Drift) -> None:
        drifts.append(drift)
        if drift.comm == "(notifications lost)":
            lost.set()

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(monitor.run, on_drift)
            await lost.wait()
            nursery.cancel_scope.cancel()
    # The one transaction since the monitor started: the generation after its first one.
    assert drifts[0] == Drift(0, "(notifications lost)", 0, lost=(before, before + 1))
