"""Starting nlproxy as a platform team does: the configurations they have start, and every
mistake that can be found before the first sync is one line and exit 2, never a traceback;
Ctrl-C and a closed pipe end quietly. The real ``nlproxy`` console script, as a child process."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from nlproxy.demo.testbed import Testbed
from nlproxy.netlink import netns
from tests.configs import EXAMPLE, KUBEADM_CONFIGMAP, shipped_config
from tests.kernel import topo
from tests.kernel.daemon import VIP_A, answered_by, objects

testbed = topo.testbed
NLPROXY = [sys.executable, "-m", "nlproxy"]


def nlproxy(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    return subprocess.run(
        [*NLPROXY, *args], capture_output=True, text=True, timeout=timeout, check=False, env=env
    )


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize("which", ["shipped", "kubeadm", "example"])
def test_the_configurations_teams_have_start(testbed: Testbed, tmp_path: Path, which: str) -> None:
    if which == "shipped":
        config = shipped_config(tmp_path)
    elif which == "kubeadm":
        config = tmp_path / "config.conf"
        config.write_text(KUBEADM_CONFIGMAP)
    else:
        config = EXAMPLE
    d = topo.write_manifests(tmp_path / "m", objects(testbed, ["pod-a"]))
    proc = nlproxy(
        "--netns", testbed.node.netns, "run", "--config", str(config), "--manifests", str(d),
        "--node-name", testbed.node.name, "--once",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert answered_by(testbed, VIP_A, 3) == {"pod-a"}


def test_mistakes_before_the_first_sync_are_one_line(
    make_netns: Callable[[str], str], tmp_path: Path
) -> None:
    ns = make_netns("stc")
    bad_mode = (
        tmp_path / "kernelspace.conf"
    )  # ipvs is accepted (with a warning) since IPVS's deprecation
    bad_mode.write_text(KUBEADM_CONFIGMAP.replace('mode: "nftables"', "mode: kernelspace"))
    unreadable = tmp_path / "kubeconfig"
    unreadable.mkdir()
    with netns.entered(ns):  # taken where the daemon would listen
        taken = socket.socket()
    with taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        cases = {
            "--kubeconfig": ["run", "--kubeconfig", "/nonexistent/kubeconfig", "--node-name", "n"],
            "--kubeconfig ": ["run", "--kubeconfig", str(unreadable), "--node-name", "n"],
            "not running in a pod": ["run", "--node-name", "n"],
            "--manifests": ["run", "--manifests", "/nonexistent", "--node-name", "n"],
            "mode": ["run", "--config", str(bad_mode), "--manifests", str(tmp_path)],
            "--proxy-mode": ["run", "--proxy-mode", "userspace", "--manifests", str(tmp_path)],
            "--metrics-bind-address": [
                "run", "--manifests", str(tmp_path), "--metrics-bind-address", busy,
            ],
            "--healthz-bind-address": [
                "run", "--manifests", str(tmp_path), "--healthz-bind-address", "0.0.0.0:70000",
            ],
        }  # fmt: skip
        for named, args in cases.items():
            proc = nlproxy("--netns", ns, *args)
            assert proc.returncode == 2, (named, proc.stderr)
            assert named.strip() in one_line(proc), (named, proc.stderr)


def test_kube_proxys_flags_and_global_flags_after_the_command(
    testbed: Testbed, tmp_path: Path
) -> None:
    d = topo.write_manifests(tmp_path / "m", objects(testbed, ["pod-a"]))
    proc = nlproxy(
        "run", "--manifests", str(d), "--hostname-override", testbed.node.name, "--once",
        "--proxy-mode", "nftables", "--netns", testbed.node.netns, "--log-level", "warning",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "sync.applied" not in proc.stderr  # --log-level after the command took effect
    assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
    verbose = nlproxy(
        "run", "--manifests", str(d), "--node-name", testbed.node.name, "--once",
        "--netns", testbed.node.netns, "-v", "2",
    )  # fmt: skip
    assert verbose.returncode == 0, verbose.stderr
    assert "sync.applied" in verbose.stderr  # kube-proxy's usual -v 2 is info
    cleaned = nlproxy("run", "--cleanup", "--netns", testbed.node.netns)
    assert cleaned.returncode == 0, cleaned.stderr
    assert "removed: ip nlproxy" in cleaned.stdout


def test_ctrl_c_and_a_closed_pipe_end_quietly(testbed: Testbed, tmp_path: Path) -> None:
    d = topo.write_manifests(tmp_path / "m", objects(testbed, ["pod-a"]))
    assert topo.run_once(testbed, d) == 0
    # A closed stdout: `nlproxy rules | head -1`.
    reader = subprocess.Popen(
        [*NLPROXY, "--netns", testbed.node.netns, "rules"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert reader.stdout is not None
    reader.stdout.readline()
    reader.stdout.close()
    assert reader.stderr is not None
    err = reader.stderr.read()
    reader.stderr.close()
    assert reader.wait(timeout=30) in (0, 141)
    assert "Traceback" not in err
    assert "Broken pipe" not in err
    # Ctrl-C to a running daemon: 130, nothing but its log lines.
    daemon = subprocess.Popen(
        [*NLPROXY, "--netns", testbed.node.netns, "--log-format", "json", "run",
         "--manifests", str(d), "--node-name", testbed.node.name,
         "--healthz-bind-address", "127.0.0.1:0", "--metrics-bind-address", ""],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    first = stderr_until(daemon, lambda line: "sync.applied" in line)
    daemon.send_signal(signal.SIGINT)
    _, rest = daemon.communicate(timeout=30)
    err = first + rest
    assert daemon.returncode in (0, 130), err
    assert "Traceback" not in err
    assert "KeyboardInterrupt" not in err
    for line in err.splitlines():
        assert yaml.safe_load(line), line  # every line is a JSON log event


def stderr_until(
    proc: subprocess.Popen[str], found: Callable[[str], bool], bound: float = 120
) -> str:
    """What ``proc`` wrote to stderr up to and including the first line ``found`` accepts;
    waits for it as long as a loaded machine may need (``bound`` seconds), read from the raw
    descriptor so that the rest is left to ``communicate``."""
    assert proc.stderr is not None
    fd, buf = proc.stderr.fileno(), b""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if select.select([fd], [], [], 0.5)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            buf += chunk
            text = buf.decode(errors="replace")
            lines = text.split("\n")
            if any(found(line) for line in lines[:-1]):
                return text
    raise AssertionError(f"no such line within {bound:.0f} s; stderr: {buf!r}")


UNREACHABLE_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "http://127.0.0.1:1"}
contexts:
- name: c
  context: {cluster: c, user: u}
current-context: c
users:
- name: u
  user: {token: x}
"""


def test_json_logs_are_one_object_per_line_with_a_start_up_line(
    make_netns: Callable[[str], str], tmp_path: Path
) -> None:
    """An API server that refuses connections is said once, as JSON (no urllib3 retry
    warnings: the client makes no retries of its own; the standard library's records are
    rendered as JSON too, tests/unit/test_log.py), and the daemon's first line says what it
    runs with."""
    import json

    ns = make_netns("stj")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE_KUBECONFIG)
    daemon = subprocess.Popen(
        [*NLPROXY, "--netns", ns, "--log-format", "json", "run", "--node-name", "n1",
         "--kubeconfig", str(kubeconfig), "--cluster-cidr", "10.244.0.0/16",
         "--healthz-bind-address", "127.0.0.1:0", "--metrics-bind-address", ""],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    first = stderr_until(daemon, lambda line: '"source.api_unreachable"' in line)
    daemon.send_signal(signal.SIGTERM)
    _, rest = daemon.communicate(timeout=30)
    err = first + rest
    events = [json.loads(line) for line in err.splitlines()]  # every line parses
    start = events[0]
    assert start["event"] == "daemon.starting"
    assert start["node"] == "n1"
    assert start["cluster_cidrs"] == ["10.244.0.0/16"]
    assert start["source"] == f"kubeconfig {kubeconfig}"
    assert start["version"]
    assert "Retrying" not in err


def test_health_and_metrics_listen_before_the_first_sync(
    make_netns: Callable[[str], str], tmp_path: Path
) -> None:
    """An API server that does not answer keeps the first list from finishing: the daemon is
    listening all the same, not ready on /healthz, alive on /livez, and /metrics answers."""

    from tests.kernel.daemon import http_get, two_free_ports

    ns = make_netns("sth")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE_KUBECONFIG)
    healthz, metrics = two_free_ports()
    daemon = subprocess.Popen(
        [*NLPROXY, "--netns", ns, "--log-format", "json", "run", "--node-name", "n1",
         "--kubeconfig", str(kubeconfig),
         "--healthz-bind-address", f"127.0.0.1:{healthz}",
         "--metrics-bind-address", f"127.0.0.1:{metrics}"],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def status(port: int, path: str) -> int:
        try:
            return http_get(ns, port, path)[0]
        except OSError:
            return 0

    try:
        deadline = time.monotonic() + 15
        while status(healthz, "/livez") != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert status(healthz, "/livez") == 200
        assert status(healthz, "/healthz") == 503
        assert status(metrics, "/metrics") == 200
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)


def test_an_ipvs_configuration_programs_nftables_with_a_warning(
    make_netns: Callable[[str], str], tmp_path: Path
) -> None:
    """An IPVS cluster's ConfigMap starts nlproxy: nftables in IPVS's place, one warning."""
    ns = make_netns("stipvs")
    conf = tmp_path / "ipvs.conf"
    conf.write_text(KUBEADM_CONFIGMAP.replace('mode: "nftables"', "mode: ipvs"))
    manifests = tmp_path / "m"
    manifests.mkdir()
    proc = nlproxy(
        "--netns", ns, "run", "--config", str(conf), "--manifests", str(manifests), "--once",
        "--node-name", "n1",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "mode 'ipvs': nlproxy programs nftables in IPVS's place" in proc.stderr
    listed = subprocess.run(
        ["ip", "netns", "exec", ns, "nft", "list", "tables"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout  # fmt: skip
    assert "table ip nlproxy" in listed
