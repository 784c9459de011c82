"""Probes are answered however many addresses hold idle connections: the shape that made
``/livez`` answer 9 of 20 probes (more client addresses than the connection budget, one idle
connection each, opened again as soon as it is dropped) leaves every probe from a new address
answered; and a local user holding the metrics port from many 127.0.0.0/8 addresses does not
starve a scraper, from loopback or from elsewhere."""

from __future__ import annotations

import os
import resource
import socket
from pathlib import Path

from nlproxy.demo.testbed import Testbed
from nlproxy.netlink import netns
from nlproxy.serve.budget import MAX_PER_CLIENT, DescriptorBudget
from tests.kernel import topo
from tests.kernel.daemon import Daemon, objects, publish, wait_until
from tests.kernel.holders import Holders

testbed = topo.testbed

LIMIT = 256
"""The daemon's descriptor limit: a connection budget of a couple of hundred."""
HOLDERS = 400
"""Client addresses holding one idle connection each: more than the budget."""
PREFIX = "10.99"
"""Addresses the test adds on the node's loopback (all of ``10.99.0.0/16`` is local then)."""


def probe(ns: str, source: str, dst: tuple[str, int], path: str) -> int:
    """One GET of ``path`` from ``source``; its status, 0 when refused or dropped."""
    with netns.entered(ns):
        s = socket.socket()
    try:
        s.settimeout(20)  # generous: the machine is shared
        s.bind((source, 0))
        s.connect(dst)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    except OSError:
        return 0
    finally:
        s.close()
    head = data.split(b"\r\n", 1)[0].split()
    return int(head[1]) if len(head) > 1 else 0


def test_probes_from_new_addresses_are_answered_while_every_slot_is_held(
    testbed: Testbed, tmp_path: Path
) -> None:
    ns = testbed.node.netns
    topo.sh(ns, "ip", "addr", "add", f"{PREFIX}.0.1/16", "dev", "lo")
    budget = DescriptorBudget(limit=LIMIT)
    assert budget.total < HOLDERS
    d = publish(tmp_path / "m", objects(testbed, ["pod-a"]))
    proc = Daemon(testbed, d)
    resource.prlimit(proc.proc.pid, resource.RLIMIT_NOFILE, (LIMIT, LIMIT))
    try:
        proc.wait_ready(timeout=60)
        livez = ("127.0.0.1", proc.healthz)
        sources = [f"{PREFIX}.{1 + i // 250}.{1 + i % 250}" for i in range(HOLDERS)]
        with Holders(ns, sources, livez) as held:
            wait_until(lambda: held.rounds >= 3, 10, "the holders' connections open")
            codes = [probe(ns, f"{PREFIX}.200.{1 + n}", livez, "/livez") for n in range(20)]
            assert codes == [200] * 20
            # The kubelet probing from the node's loopback, likewise.
            codes = [probe(ns, "127.0.0.1", livez, "/livez") for _ in range(20)]
            assert codes == [200] * 20
        assert proc.proc.poll() is None
    finally:
        proc.kill()


def test_many_loopback_addresses_do_not_hold_the_metrics_port(
    testbed: Testbed, tmp_path: Path
) -> None:
    ns = testbed.node.netns
    topo.sh(ns, "ip", "addr", "add", f"{PREFIX}.0.1/16", "dev", "lo")
    d = publish(tmp_path / "m", objects(testbed, ["pod-a"]))
    proc = Daemon(testbed, d)
    resource.prlimit(proc.proc.pid, resource.RLIMIT_NOFILE, (LIMIT, LIMIT))
    try:
        proc.wait_ready(timeout=60)
        metrics = ("127.0.0.1", proc.metrics)
        before = len(os.listdir(f"/proc/{proc.proc.pid}/fd"))
        local = [f"127.1.{i // 250}.{1 + i % 250}" for i in range(HOLDERS)]
        with Holders(ns, local, metrics) as held:
            wait_until(lambda: held.rounds >= 3, 10, "the local user's connections open")
            for n in range(10):
                assert probe(ns, f"{PREFIX}.200.{1 + n}", metrics, "/metrics") == 200
                assert probe(ns, "127.0.0.1", metrics, "/metrics") == 200
            # One client's share, not the budget: the local user holds at most its cap (and
            # a few more for the instant between a connection's accept and its eviction).
            fds = len(os.listdir(f"/proc/{proc.proc.pid}/fd"))
            assert fds < before + MAX_PER_CLIENT + 8, f"{fds} descriptors, {before} before"
        assert proc.proc.poll() is None
    finally:
        proc.kill()
