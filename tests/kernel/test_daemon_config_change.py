"""A running daemon's ``--config`` file edited the way a ConfigMap volume changes (the ``..data``
symlink swapped to a new directory): an invalid file is named in one error line and the daemon
runs on; a valid one that flips ``masqueradeAll`` is logged setting by setting and applied in
place (the same process; the source an endpoint sees changes, ``/configz`` shows it, and a
connection to an unchanged Service opened before the change still carries data); a changed
bind address, which cannot change in place, ends the daemon with status 1, rules in place.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from nlproxy.demo.testbed import Testbed
from nlproxy.netlink import netns
from tests.kernel import topo
from tests.kernel.daemon import Daemon, free_port, wait_until
from tests.kernel.topo import PORTS, SLICE_PORTS, answers, ask
from tests.netns import sh

testbed = topo.testbed

VIP = "10.96.0.10"
KEEP_VIP = "10.96.0.11"
KEEP_PORT = 9100
EXIT_CONFIG_CHANGED = 1

CONFIG = """apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
healthzBindAddress: 127.0.0.1:{healthz}
metricsBindAddress: 127.0.0.1:{metrics}
nftables:
  masqueradeAll: {masquerade_all}
conntrack:
  tcpCloseWaitTimeout: {close_wait}
"""
CLOSE_WAIT = "nf_conntrack_tcp_timeout_close_wait"


class ConfigMapVolume:
    """A directory laid out as the kubelet mounts a ConfigMap: ``config.conf`` ->
    ``..data/config.conf``, ``..data`` -> ``..<version>``; :meth:`publish` swaps ``..data``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        self.version = 0
        (root / "config.conf").symlink_to("..data/config.conf")

    @property
    def path(self) -> Path:
        return self.root / "config.conf"

    def publish(self, text: str) -> None:
        self.version += 1
        new = self.root / f"..2026_11_28_{self.version}"
        new.mkdir()
        (new / "config.conf").write_text(text)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(new.name)
        os.replace(tmp, self.root / "..data")  # the atomic swap the kubelet makes


class EchoAll:
    """A TCP server in a pod's namespace echoing every line of every connection until closed
    (the test bed's echo servers answer one line per connection)."""

    def __init__(self, ns: str, port: int) -> None:
        with netns.entered(ns):
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", port))
        self.sock.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


@pytest.fixture
def keep_server(testbed: Testbed) -> Iterator[EchoAll]:
    server = EchoAll(testbed.pod("pod-b").netns, KEEP_PORT)
    yield server
    server.close()


def _objects(tb: Testbed) -> list[dict[str, object]]:
    r = tb.pod("pod-r")
    b = tb.pod("pod-b")
    keep_ports = ({"name": "tcp", "port": KEEP_PORT, "targetPort": KEEP_PORT, "protocol": "TCP"},)
    return [
        tb.node_manifest(),
        topo.service("web", VIP, PORTS),
        topo.endpoint_slice("web", [topo.endpoint(str(r.ipv4), r.node)], SLICE_PORTS),
        topo.service("keep", KEEP_VIP, keep_ports),
        topo.endpoint_slice(
            "keep",
            [topo.endpoint(str(b.ipv4), b.node)],
            ({"name": "tcp", "port": KEEP_PORT, "protocol": "TCP"},),
        ),
    ]


def _sysctl(ns: str, name: str) -> int:
    return int(sh("sysctl", "-n", f"net.netfilter.{name}", ns=ns))


def _round_trip(conn: socket.socket, data: bytes) -> bytes:
    conn.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = conn.recv(4096)
        if not chunk:
            break
        got += chunk
    return got


def test_config_change_is_applied_in_place_and_a_bind_address_restarts(
    testbed: Testbed, tmp_path: Path, keep_server: EchoAll
) -> None:
    manifests = topo.write_manifests(tmp_path / "manifests", _objects(testbed))
    volume = ConfigMapVolume(tmp_path / "config")
    ports = {"healthz": free_port(), "metrics": free_port(), "close_wait": "1h"}
    volume.publish(CONFIG.format(masquerade_all="false", **ports))
    a = testbed.pod("pod-a")
    seen_from = {"pod-r": {str(a.ipv4)}}
    masqueraded = {"pod-r": {str(testbed.node.ipv4)}}

    proc = Daemon(
        testbed, manifests, "--config", str(volume.path), ports=(ports["healthz"], ports["metrics"])
    )
    conn = None
    try:
        proc.wait_ready()
        pid = proc.proc.pid
        assert answers(ask("tcp", a.netns, VIP, 80)) == seen_from
        with netns.entered(a.netns):
            conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        conn.settimeout(10)
        conn.connect((KEEP_VIP, KEEP_PORT))
        assert _round_trip(conn, b"before\n") == b"before\n"

        # An invalid file: one error line naming it and why; the daemon runs on.
        volume.publish("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: Nope\n")
        wait_until(lambda: proc.events("config.invalid"), 10, "the invalid file is reported")
        (invalid,) = proc.events("config.invalid")
        assert not proc.events("config.polled")  # told by the kernel, not looked for
        assert invalid["file"] == str(volume.path)
        assert "expected kind KubeProxyConfiguration" in invalid["error"], invalid
        assert "current settings are kept" in invalid["error"], invalid
        assert proc.proc.poll() is None
        assert proc.get(proc.healthz, "/healthz")[0] == 200
        assert answers(ask("tcp", a.netns, VIP, 80)) == seen_from

        # A valid file flipping masqueradeAll: logged and applied by the running process.
        volume.publish(CONFIG.format(masquerade_all="true", **ports))
        wait_until(lambda: proc.events("config.applied"), 20, "the change is applied")
        wait_until(
            lambda: answers(ask("tcp", a.netns, VIP, 80, n=4)) == masqueraded,
            20,
            "the running daemon masquerades",
        )
        assert proc.proc.poll() is None
        assert proc.proc.pid == pid
        assert not proc.events("daemon.restarting")
        changed = {e["setting"]: (e["old"], e["new"]) for e in proc.events("config.changed")}
        # The one setting, named once (the planner's copy of it is not named again).
        assert changed == {"daemon.masquerade_all": (False, True)}, changed
        status, body = proc.get(proc.metrics, "/configz")
        assert status == 200
        assert json.loads(body)["kubeproxy.config.k8s.io"]["nftables"]["masqueradeAll"] is True
        # Opened before the change, to a Service the change left alone.
        assert _round_trip(conn, b"after\n") == b"after\n"

        # A conntrack setting: written to the node's sysctls by the running daemon.
        assert _sysctl(testbed.node.netns, CLOSE_WAIT) == 3600
        ports["close_wait"] = "7m"
        volume.publish(CONFIG.format(masquerade_all="true", **ports))
        wait_until(
            lambda: _sysctl(testbed.node.netns, CLOSE_WAIT) == 420, 20, "the sysctl is written"
        )
        wait_until(lambda: len(proc.events("config.applied")) == 2, 20, "the change is applied")
        assert proc.proc.poll() is None
        configz = json.loads(proc.get(proc.metrics, "/configz")[1])["kubeproxy.config.k8s.io"]
        assert configz["conntrack"]["tcpCloseWaitTimeout"] == "7m0s"
        assert _round_trip(conn, b"again\n") == b"again\n"

        # A bind address cannot change in place: logged, then the daemon exits for a restart.
        moved = {**ports, "healthz": free_port()}
        volume.publish(CONFIG.format(masquerade_all="true", **moved))
        wait_until(lambda: proc.proc.poll() is not None, 20, "the daemon exits on the change")
        assert proc.proc.returncode == EXIT_CONFIG_CHANGED, proc.lines[-5:]
    finally:
        proc.kill()
        if conn is not None:
            conn.close()
    (restarting,) = proc.events("daemon.restarting")
    assert restarting["settings"] == ["daemon.healthz_bind_address"]
    assert restarting["exit_status"] == EXIT_CONFIG_CHANGED
    # The rules stay while no daemon runs: the applied setting still carries traffic.
    assert answers(ask("tcp", a.netns, VIP, 80)) == masqueraded
