"""Fixtures for the VM integration tests: SSH into the Vagrant VMs, run probes, edit manifests.

The tests run on the host with the project's .venv python and drive the VMs that
`vagrant up` made from the repository's Vagrantfile (`make vm-test` does both). They talk to
the VMs only over SSH, using `vagrant ssh-config`; they never start or destroy VMs. A VM that is
not running is a failure naming it, never a skip.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import cluster
import pytest

REPO = Path(__file__).resolve().parent.parent
VMS = ("node1", "node2", "client")
LIB = "/usr/local/lib/nlproxy-vm"
MANIFESTS = "/etc/nlproxy/manifests"
T = TypeVar("T")


class VmError(AssertionError):
    """A command in a VM failed; names the VM, the command and what it printed."""


@dataclass(frozen=True, slots=True)
class Vms:
    """SSH access to the test VMs through an ssh_config that `vagrant ssh-config` wrote."""

    ssh_config: Path

    def ssh_argv(self, vm: str, command: str) -> list[str]:
        return ["ssh", "-F", str(self.ssh_config), "-o", "ConnectTimeout=10", vm, command]

    def run(
        self, vm: str, command: str, *, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Run a shell command in vm (as the vagrant user; use sudo inside for root)."""
        argv = self.ssh_argv(vm, command)
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise VmError(f"{vm}: {command!r} did not finish in {timeout:.0f} s") from exc
        if check and proc.returncode != 0:
            raise VmError(
                f"{vm}: {command!r} exited {proc.returncode}\n"
                f"stdout: {proc.stdout.strip()}\nstderr: {proc.stderr.strip()}"
            )
        return proc

    def out(self, vm: str, command: str) -> str:
        return self.run(vm, command).stdout.strip()

    def probe(
        self, vm: str, mode: str, target: str, port: int = 0, *, count: int = 1, pod: str = ""
    ) -> list[dict[str, Any]]:
        """Run probe.py in vm (inside pod's namespace if given); its JSON lines, parsed."""
        cmd = f"python3 {LIB}/probe.py {mode} {shlex.quote(target)} {port} --count {count}"
        if pod:
            cmd = f"sudo ip netns exec {shlex.quote(pod)} {cmd}"
        return [json.loads(line) for line in self.out(vm, cmd).splitlines()]

    def popen(self, vm: str, command: str) -> subprocess.Popen[str]:
        """Start a long-running command in vm with pipes to its stdin and stdout."""
        return subprocess.Popen(
            self.ssh_argv(vm, command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def main_pid(self, vm: str, unit: str = "nlproxy.service") -> int:
        return int(self.out(vm, f"systemctl show -p MainPID --value {unit}"))

    def journal(self, vm: str, *match: str, since: str = "") -> list[dict[str, Any]]:
        """nlproxy's journal lines (only its processes' output) as JSON, those logged after since
        (a timestamp from clock()) if given."""
        text = self.out(
            vm,
            "sudo journalctl -q --no-pager -o cat _SYSTEMD_UNIT=nlproxy.service "
            + " ".join(shlex.quote(m) for m in match),
        )
        lines = []
        for line in text.splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError as exc:
                raise VmError(f"{vm}: nlproxy logged a line that is not JSON: {line!r}") from exc
        return [line for line in lines if line.get("timestamp", "") > since]

    def clock(self, vm: str) -> str:
        """vm's time, formatted as nlproxy's log timestamps are, so the two compare as strings.
        (Journal cursors do not work here: they may name another journal file.)"""
        return self.out(vm, "date -u +%Y-%m-%dT%H:%M:%S.%6NZ")

    def write_manifests(self, without: frozenset[str] = frozenset()) -> None:
        """Rewrite both nodes' manifests (each file atomically), leaving out the pods in without."""
        arg = f" --without {shlex.quote(','.join(sorted(without)))}" if without else ""
        for n in cluster.nodes():
            self.run(
                n.name, f"sudo python3 /vagrant/vm-tests/cluster.py manifests {MANIFESTS}{arg}"
            )


def wait_for(what: str, check: Callable[[], T | None], deadline: float = 60.0) -> T:
    """Poll check until it returns something other than None/False; fail naming what never came."""
    end = time.monotonic() + deadline
    last: Exception | None = None
    while time.monotonic() < end:
        try:
            result = check()
        except (VmError, ValueError) as exc:
            result, last = None, exc
        if result is not None and result is not False:
            return result
        time.sleep(1.0)
    pytest.fail(f"{what}: not reached within {deadline:.0f} s (last error: {last})")


def _vagrant(*args: str) -> str:
    try:
        proc = subprocess.run(
            ["vagrant", *args], cwd=REPO, capture_output=True, text=True, timeout=300
        )
    except FileNotFoundError:
        pytest.fail("vagrant is not installed (make vm-test installs it)")
    if proc.returncode != 0:
        pytest.fail(f"vagrant {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


@pytest.fixture(scope="session")
def vms() -> Iterator[Vms]:
    status = _vagrant("status", "--machine-readable")
    states = {
        f[1]: f[3] for f in (line.split(",") for line in status.splitlines()) if f[2:3] == ["state"]
    }
    down = [vm for vm in VMS if states.get(vm) != "running"]
    if down:
        pytest.fail(f"VMs not running: {', '.join(down)} ({states}); run `make vm-test`")
    with tempfile.TemporaryDirectory(prefix="nlproxy-vm-") as tmp:
        cfg = Path(tmp) / "ssh_config"
        cfg.write_text(_vagrant("ssh-config", *VMS))
        yield Vms(cfg)


@pytest.fixture
def restore_manifests(vms: Vms) -> Iterator[None]:
    """Put the full manifests back after a test that edits them, and wait until every web pod
    answers through node1 again."""
    yield
    vms.write_manifests()
    want = {p for p, _, _ in cluster.endpoints(cluster.WEB)}
    wait_for(
        "every web pod answering again after restoring the manifests",
        lambda: want <= pods_answering(vms, "client", "tcp", cluster.WEB.cluster_ip, 80, 40),
    )


def pods_answering(
    vms: Vms, vm: str, mode: str, target: str, port: int, count: int, pod: str = ""
) -> set[str]:
    """The pods that answered a probe (failures are left out)."""
    return {r["pod"] for r in vms.probe(vm, mode, target, port, count=count, pod=pod) if r["ok"]}
