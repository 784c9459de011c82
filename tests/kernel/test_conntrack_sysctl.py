"""The daemon sets kube-proxy's conntrack sysctls in the node's namespace at start-up, and what
it may not set is one warning naming what to set. Upstream's "should set TCP CLOSE_WAIT
timeout" ported: a connection whose client closed its side sits in CLOSE_WAIT with the timeout
nlproxy set."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import daemon, objects, publish, wait_until
from tests.netns import sh

testbed = topo.testbed
HOLD_PORT = 9911
VIP = "10.96.0.88"

# A server that accepts and keeps every connection open, never closing its side.
HOLDER = f"""
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {HOLD_PORT})); s.listen(8)
held = []
while True:
    c, _ = s.accept(); held.append(c)
"""


def _sysctl(ns: str, name: str) -> int:
    return int(sh("sysctl", "-n", f"net.netfilter.{name}", ns=ns))


def _holding(tb: Testbed) -> list[Any]:
    b = tb.pod("pod-b")
    ports = [{"name": "hold", "port": 80, "targetPort": HOLD_PORT}]
    eps = [topo.endpoint(str(b.ipv4), tb.node.name)]
    return [
        *objects(tb, ["pod-a"]),
        topo.service("hold", VIP, ports),
        topo.endpoint_slice("hold", eps, [{"name": "hold", "port": HOLD_PORT}]),
    ]


def test_close_wait_timeout_is_set_and_applies(testbed: Testbed, tmp_path: Path) -> None:
    node = testbed.node.netns
    sh("sysctl", "-w", "net.netfilter.nf_conntrack_tcp_timeout_close_wait=60", ns=node)
    config = tmp_path / "config.conf"
    config.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
        "conntrack:\n  tcpCloseWaitTimeout: 30m\n  tcpEstablishedTimeout: 12h\n"
    )
    holder = subprocess.Popen(
        ["ip", "netns", "exec", testbed.pod("pod-b").netns, sys.executable, "-c", HOLDER]
    )
    try:
        d = publish(tmp_path / "m", _holding(testbed))
        with daemon(testbed, d, "--config", str(config)) as proc:
            assert _sysctl(node, "nf_conntrack_tcp_timeout_close_wait") == 1800
            assert _sysctl(node, "nf_conntrack_tcp_timeout_established") == 43200
            (event,) = proc.events("conntrack.sysctls_set")
            assert event["sysctls"]["nf_conntrack_tcp_timeout_close_wait"] == 1800
            # The client closes its side through the Service; the server keeps its own open.
            client = subprocess.Popen(
                ["ip", "netns", "exec", testbed.pod("pod-a").netns, sys.executable, "-c",
                 f"import socket, time; s = socket.create_connection(({VIP!r}, 80), 3); "
                 "s.shutdown(socket.SHUT_WR); time.sleep(30)"],
            )  # fmt: skip
            try:

                def close_wait() -> list[str]:
                    out = sh("conntrack", "-L", "-p", "tcp", "--orig-dst", VIP, ns=node,
                             check=False)  # fmt: skip
                    return [line for line in out.splitlines() if "CLOSE_WAIT" in line]

                wait_until(lambda: bool(close_wait()), 5.0, "a flow in CLOSE_WAIT")
                timeout = int(close_wait()[0].split()[2])
                assert 1700 < timeout <= 1800, close_wait()
            finally:
                client.kill()
                client.wait()
    finally:
        holder.kill()
        holder.wait()
