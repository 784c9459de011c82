"""One nlproxy per network namespace: a second daemon, or a ``run --once`` beside a daemon, is
refused with the first's pid (exit 2); ``--force`` lets a one-off run through; the lock dies
with its holder; other namespaces are not affected; an unprivileged process can neither take
the lock nor make a refused start hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from nlproxy.daemon.nslock import NamespaceLock
from nlproxy.demo.testbed import Testbed
from nlproxy.errors import ConfigError
from tests.kernel import topo
from tests.kernel.daemon import VIP_A, answered_by, daemon, objects, publish

testbed = topo.testbed


def _nlproxy(tb: Testbed, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "nlproxy", "--netns", tb.node.netns, "run", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def test_a_second_proxy_is_refused_with_the_first_ones_pid(
    testbed: Testbed, tmp_path: Path
) -> None:
    d = publish(tmp_path / "m", objects(testbed, ["pod-a"]))
    with daemon(testbed, d) as first:
        args = ("--manifests", str(d), "--node-name", testbed.node.name)
        second = _nlproxy(testbed, *args, "--healthz-bind-address", "127.0.0.1:0")
        assert second.returncode == 2, second.stderr
        assert f"nlproxy (pid {first.proc.pid}) already programs it" in second.stderr
        assert "Traceback" not in second.stderr
        once = _nlproxy(testbed, *args, "--once")
        assert once.returncode == 2, once.stderr
        assert f"pid {first.proc.pid}" in once.stderr
        forced = _nlproxy(testbed, *args, "--once", "--force")
        assert forced.returncode == 0, forced.stderr
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        # The lock dies with its holder, even by SIGKILL: a new daemon may start at once.
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(timeout=10)
    with daemon(testbed, d):
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}


SQUAT = """
import socket, sys, time
held = []
for name in (b"\\0nlproxy/proxy-lock", b"\\0nlproxy/proxy-lock/1.0", b"\\0nlproxy/proxy-lockx"):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(name)
    s.listen(0)
    held.append(s)
    for _ in range(3):  # a full backlog: a blocking connect() to it would never return
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.setblocking(False)
        try:
            c.connect(name)
        except BlockingIOError:
            pass
        held.append(c)
print("ready", flush=True)
time.sleep(600)
"""


def test_an_unprivileged_squatter_cannot_keep_nlproxy_out(testbed: Testbed, tmp_path: Path) -> None:
    d = publish(tmp_path / "m", objects(testbed, ["pod-a"]))
    tmp_path.chmod(0o755)
    squat = [
        *("ip", "netns", "exec", testbed.node.netns),
        *("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"),
        *(sys.executable, "-c", SQUAT),
    ]
    with subprocess.Popen(squat, stdout=subprocess.PIPE, text=True) as squatter:
        try:
            assert squatter.stdout is not None
            assert squatter.stdout.readline() == "ready\n"
            args = ("--manifests", str(d), "--node-name", testbed.node.name)
            once = _nlproxy(testbed, *args, "--once")
            assert once.returncode == 0, once.stderr
            assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
            with daemon(testbed, d) as first:
                # Refused starts leave nothing behind that makes the next one block: each of
                # many exits 2 (the run's 60 s timeout would fail a hang) naming the holder.
                for _ in range(6):
                    again = _nlproxy(testbed, *args, "--once")
                    assert again.returncode == 2, again.stderr
                    assert f"nlproxy (pid {first.proc.pid}) already programs it" in again.stderr
        finally:
            squatter.kill()


def test_the_lock_is_per_namespace(make_netns: Callable[[str], str]) -> None:
    a, b = make_netns("lka"), make_netns("lkb")
    first = NamespaceLock(a)
    try:
        NamespaceLock(b).release()  # another namespace: free
        with pytest.raises(ConfigError, match=rf"pid {os.getpid()}\) already programs it"):
            NamespaceLock(a)
    finally:
        first.release()
    NamespaceLock(a).release()  # released: free again


ROOT_SQUAT = """
import socket, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.setsockopt(socket.SOL_SOCKET, 33, 1 << 30)  # SO_RCVBUFFORCE: needs CAP_NET_ADMIN
except PermissionError:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 30)  # as far as rmem_max allows
else:
    raise SystemExit("a process without capabilities forced its buffer")
s.bind(b"\\0nlproxy/proxy-lock/1.0")
s.listen(16)
print("ready", flush=True)
time.sleep(600)
"""


def test_root_without_capabilities_can_neither_hold_nor_take_the_lock(
    testbed: Testbed, tmp_path: Path
) -> None:
    """uid 0 with every capability dropped (a host-network container as root with
    ``drop: [ALL]``): its socket under the lock's prefix does not keep nlproxy out, and an
    nlproxy started so is refused, naming the capability."""
    d = publish(tmp_path / "m", objects(testbed, ["pod-a"]))
    no_caps = [
        *("ip", "netns", "exec", testbed.node.netns, "setpriv"),
        *("--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all"),
    ]
    with subprocess.Popen(
        [*no_caps, sys.executable, "-c", ROOT_SQUAT], stdout=subprocess.PIPE, text=True
    ) as squatter:
        try:
            assert squatter.stdout is not None
            assert squatter.stdout.readline() == "ready\n"
            args = ("--manifests", str(d), "--node-name", testbed.node.name)
            once = _nlproxy(testbed, *args, "--once")
            assert once.returncode == 0, once.stderr
            assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
            with daemon(testbed, d) as first:
                # The real holder still keeps a second one out, naming itself, not the squatter.
                again = _nlproxy(testbed, *args, "--once")
                assert again.returncode == 2, again.stderr
                assert f"nlproxy (pid {first.proc.pid}) already programs it" in again.stderr
        finally:
            squatter.kill()
    powerless = subprocess.run(
        [*no_caps, sys.executable, "-m", "nlproxy", "run", *args, "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert powerless.returncode == 1, powerless.stderr
    assert "needs CAP_NET_ADMIN" in powerless.stderr
    assert "Traceback" not in powerless.stderr
