"""The periodic verify reads the tables back only when something may have changed them unseen.

The drift watch looks at the namespace's generation id a few times a second; when every
transaction since its last look is nlproxy's own, no foreign change can have slipped past, and
the verify costs one GETGEN request instead of a read-back of every element. Another process's
transaction is read back once, whatever table it touched (without joining NFNLGRP_NFTABLES the
daemon cannot tell which: docs/ruleset.md), and the verifies are quiet again after it; a change
to nlproxy's table is read back and repaired. Once a verify is quiet and nothing happens, the
loop rests: no more verifies until something does, ``/healthz`` vouched for when asked.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import trio
import trio.testing

from nlproxy.demo.testbed import Testbed
from nlproxy.nft.monitor import NftMonitor
from tests.kernel import topo
from tests.kernel.daemon import VIP_A, answered_by, daemon, nft, objects, publish, wait_until

testbed = topo.testbed


def _verifies(proc: Any, read_back: str) -> float:
    key = f'nlproxy_verifies_total{{read_back="{read_back}"}}'
    for line in proc.get(proc.metrics, "/metrics")[1].splitlines():
        if line.startswith(key):
            return float(line.split()[1])
    return 0.0


def test_idle_verifies_skip_the_read_back_and_an_idle_loop_rests(
    testbed: Testbed, tmp_path: Path
) -> None:
    d = publish(tmp_path / "m", objects(testbed, ["pod-a"]))
    with daemon(testbed, d, "--sync-period", "300ms") as proc:
        wait_until(lambda: _verifies(proc, "false") >= 1, 10.0, "a quiet verify")
        time.sleep(3.0)  # ten periods: the loop rests after the first verify that is quiet
        assert _verifies(proc, "false") <= 2  # (a stray sync would bring one more)
        assert _verifies(proc, "true") == 0
        status, body = proc.get(proc.healthz, "/healthz")
        assert status == 200, body
        updated = datetime.fromisoformat(json.loads(body)["lastUpdated"])
        assert datetime.now(UTC) - updated < timedelta(seconds=2)  # vouched for when asked
        # Another table's transaction: one read-back, which finds nothing to repair.
        nft(testbed, "add", "table", "ip", "someone-else")
        wait_until(lambda: _verifies(proc, "true") >= 1, 10.0, "a read-back after it")
        skipped = _verifies(proc, "false")
        wait_until(lambda: _verifies(proc, "false") > skipped, 10.0, "quiet again")
        assert _verifies(proc, "true") == 1
        assert not proc.events("drift.repaired")
        # A change to nlproxy's own table is a drift: read back and repaired.
        nft(testbed, "delete", "table", "ip", "nlproxy")
        wait_until(lambda: _verifies(proc, "true") >= 2, 10.0, "a read-back after the drift")
        wait_until(lambda: answered_by(testbed, VIP_A, 3) == {"pod-a"}, 5.0, "repaired")


async def test_unprocessed_notifications_are_not_quiet(
    make_netns: Callable[[str], str],
) -> None:
    """The guard itself: a transaction whose notification the monitor has not processed yet
    (queued, or lost) leaves the kernel's generation ahead, so a verify reads back."""
    ns = make_netns("vq")
    monitor = NftMonitor("nlproxy", netns_name=ns)
    assert monitor.saw_every_commit()
    cmd = ["ip", "netns", "exec", ns, "nft", "add", "table", "ip", "t"]
    await trio.run_process(cmd)
    assert not monitor.saw_every_commit(), "a queued notification was taken for processed"
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(monitor.run, lambda drift: None)
            # The queued notification is processed at once; then the generations agree.
            await trio.testing.wait_all_tasks_blocked()
            assert monitor.saw_every_commit()
            nursery.cancel_scope.cancel()
