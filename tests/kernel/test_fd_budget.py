"""Descriptors: idle connections from many client addresses cannot take the daemon's last file
descriptors. The HTTP servers share one connection budget sized from the descriptor limit, and a
repair that meets EMFILE anyway is tried again: the daemon stays alive and its table comes back.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import (
    VIP_A,
    Daemon,
    answered_by,
    daemon,
    nft,
    objects,
    publish,
    wait_until,
)
from tests.kernel.holders import Holders

testbed = topo.testbed

LIMIT = 96
"""The daemon's descriptor limit in this test (soft and hard): what the connections could
exhaust."""


def _loopback_clients(clients: int, per_client: int) -> list[str]:
    """``per_client`` slots for each of ``clients`` loopback addresses (127.0.1.2 on)."""
    return [
        f"127.0.{1 + c // 250}.{2 + c % 250}" for c in range(clients) for _ in range(per_client)
    ]


def _livez(proc: Daemon) -> bool:
    try:
        return proc.get(proc.healthz, "/livez")[0] == 200
    except OSError:
        return False


def test_idle_connections_cannot_starve_a_repair(testbed: Testbed, tmp_path: Path) -> None:
    d = publish(tmp_path / "m", objects(testbed, ["pod-a"]))
    with daemon(testbed, d) as proc:
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        used = len(os.listdir(f"/proc/{proc.proc.pid}/fd"))
        assert used < LIMIT // 2, f"the daemon holds {used} descriptors already"
        resource.prlimit(proc.proc.pid, resource.RLIMIT_NOFILE, (LIMIT, LIMIT))
        with Holders(testbed.node.netns, _loopback_clients(12, 16), ("127.0.0.1", proc.healthz)):
            # Someone deletes the table while the connections are held: the repair needs
            # descriptors (netlink sockets) and must get them, or try again until it does.
            nft(testbed, "delete", "table", "ip", "nlproxy")

            def repaired() -> bool:
                assert proc.proc.poll() is None, f"daemon exited: {proc.lines[-5:]}"
                return answered_by(testbed, VIP_A, 1) == {"pod-a"}

            wait_until(repaired, 60, "the table repaired")
            # A client of its own (the kubelet's probe) still gets answers.
            wait_until(lambda: _livez(proc), 30, "/livez answered")
        assert proc.proc.poll() is None
