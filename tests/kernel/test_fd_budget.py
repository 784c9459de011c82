"""Descriptors: idle connections from many client addresses cannot take the daemon's last file
descriptors. The HTTP servers share one connection budget sized from the descriptor limit, and a
repair that meets EMFILE anyway is tried again: the daemon stays alive and its table comes back.
"""

from __future__ import annotations

import os
import resource
import socket
import threading
from pathlib import Path

from nlproxy.demo.testbed import Testbed
from nlproxy.netlink import netns
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

testbed = topo.testbed

LIMIT = 96
"""The daemon's descriptor limit in this test (soft and hard): what the connections could
exhaust."""


class _Hold:
    """Idle connections to ``127.0.0.1:port`` from ``clients`` loopback addresses, each opened
    again as soon as the server drops it (an attacker's loop), until the block ends."""

    def __init__(self, ns: str, port: int, clients: int, per_client: int) -> None:
        self.ns, self.port = ns, port
        self.slots: list[tuple[str, socket.socket | None]] = [
            (f"127.0.{1 + c // 250}.{2 + c % 250}", None)
            for c in range(clients)
            for _ in range(per_client)
        ]
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Hold:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(timeout=30)
        for _, s in self.slots:
            if s is not None:
                s.close()

    def _connect(self, source: str) -> socket.socket | None:
        with netns.entered(self.ns):
            s = socket.socket()
        s.setblocking(False)
        try:
            s.bind((source, 0))
            s.connect_ex(("127.0.0.1", self.port))
        except OSError:
            s.close()
            return None
        return s

    def _run(self) -> None:
        while not self.done.is_set():
            for i, (source, s) in enumerate(self.slots):
                if s is not None:
                    try:
                        if s.recv(1) == b"":
                            raise ConnectionResetError
                    except BlockingIOError:
                        continue  # still held
                    except OSError:
                        pass
                    s.close()
                self.slots[i] = (source, self._connect(source))
            self.done.wait(0.05)


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
        with _Hold(testbed.node.netns, proc.healthz, clients=12, per_client=16):
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
