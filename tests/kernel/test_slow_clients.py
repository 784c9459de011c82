"""Slow clients cannot exhaust the daemon: 400 connections that never finish their request,
all from one pod-like address, leave /healthz answering, syncs going on, and the daemon's
descriptors bounded (the servers hold at most 16 connections per client address, and drop a
request not sent within 5 s)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from nlproxy.demo.testbed import Testbed
from nlproxy.netlink import netns
from nlproxy.serve.budget import MAX_PER_CLIENT
from tests.kernel import topo
from tests.kernel.daemon import (
    VIP_A,
    answered_by,
    daemon,
    http_get,
    objects,
    publish,
    wait_until,
)

testbed = topo.testbed
ATTACKERS = 400


def test_slow_clients_do_not_exhaust_the_daemon(testbed: Testbed, tmp_path: Path) -> None:
    d = publish(tmp_path / "m", objects(testbed, ["pod-a"]))
    with daemon(testbed, d) as proc:
        held: list[socket.socket] = []
        try:
            for _ in range(ATTACKERS):
                with netns.entered(testbed.node.netns):  # where the daemon listens
                    s = socket.socket()
                s.bind(("127.0.0.2", 0))  # one client address, not the prober's
                s.settimeout(2)
                try:
                    s.connect(("127.0.0.1", proc.healthz))
                    s.sendall(b"GET /healthz HTTP/1.1\r\n")  # and never the end of the headers
                except OSError:
                    s.close()
                    continue
                held.append(s)
            assert http_get(testbed.node.netns, proc.healthz, "/healthz", timeout=5)[0] == 200
            fds = len(os.listdir(f"/proc/{proc.proc.pid}/fd"))
            assert fds < MAX_PER_CLIENT + 64, f"{fds} descriptors open in the daemon"
            publish(d, objects(testbed, ["pod-b"]))  # syncs go on
            wait_until(lambda: answered_by(testbed, VIP_A, 3) == {"pod-b"}, 5.0, "change synced")
        finally:
            for s in held:
                s.close()
        assert proc.proc.poll() is None
