"""The systemd unit's sandbox leaves the daemon working: the .deb's ``nlproxy run`` (its
/opt/nlproxy, on Debian's python3.11 as the unit runs it) under the unit's own
system call filter (its ``SystemCallFilter=`` lines, ``ProtectClock=``'s and
``MemoryDenyWriteExecute=``'s denials, ``SystemCallErrorNumber=``, with systemd's groups resolved
by ``systemd-analyze syscall-filter``), its ``UMask=``, ``NoNewPrivileges=`` and its two
capabilities as an unprivileged user, programs a test bed's node: it serves /healthz and
/metrics, and a Service answers through its rules. ``systemd-analyze security`` rates the unit.

This machine's PID 1 is not systemd, so the unit cannot be started as a unit here (the VM suite,
``vm-tests/``, does that); what systemd would apply is applied by hand, from the unit's text,
with libseccomp's Python binding (Debian's python3-seccomp).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from nlproxy.demo.echo import Result, tcp_request
from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import http_get, two_free_ports
from tests.kernel.test_capabilities import manifests, readable_tmp
from tests.packaging.conftest import ROOT

testbed = topo.testbed
_ = readable_tmp  # a fixture

UNIT = ROOT / "deploy/systemd/nlproxy.service"
VIP = "10.96.0.40"
NOBODY = "65534"

# Installs the filter, sets the umask, then becomes the daemon (argv[3:]). Debian's python3 runs
# it: python3-seccomp is built for it.
APPLY = r"""
import errno, json, os, sys
import seccomp
allowed, denied_errno, umask = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3], 8)
f = seccomp.SyscallFilter(defaction=seccomp.ERRNO(getattr(errno, denied_errno)))
# MemoryDenyWriteExecute=yes, as systemd enforces it: no mapping both writable and executable,
# no page made executable later; the rest of mmap and mprotect is allowed.
W, X = 0x2, 0x4
guarded = {"mmap": [0, W, X], "mprotect": [0], "pkey_mprotect": [0]}
for name in allowed:
    try:
        if name not in guarded:
            f.add_rule(seccomp.ALLOW, name)
    except (RuntimeError, ValueError, OSError):
        pass  # not a system call of this architecture
for name, ok in guarded.items():
    if name in allowed:
        mask = W | X if name == "mmap" else X
        for value in ok:
            f.add_rule(seccomp.ALLOW, name, seccomp.Arg(2, seccomp.MASKED_EQ, mask, value))
os.umask(umask)
f.load()
os.execv(sys.argv[4], sys.argv[4:])
"""


def unit_settings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            out.setdefault(key, []).append(value)
    return out


def _expand(group: str, seen: set[str]) -> set[str]:
    """The system calls of a systemd group (``@name``), nested groups included."""
    if group in seen:
        return set()
    seen.add(group)
    text = subprocess.run(
        ["systemd-analyze", "syscall-filter", group], capture_output=True, text=True, check=True
    ).stdout
    calls: set[str] = set()
    for line in text.splitlines()[1:]:
        word = line.strip()
        if not word or word.startswith("#"):
            continue
        calls |= _expand(word, seen) if word.startswith("@") else {word}
    return calls


def resolve(entries: list[str]) -> set[str]:
    calls: set[str] = set()
    for entry in entries:
        for word in entry.split():
            calls |= _expand(word, set()) if word.startswith("@") else {word}
    return calls


def allowed_syscalls(settings: dict[str, list[str]]) -> set[str]:
    """What the unit's SystemCallFilter lines allow: the allow list, less every ``~`` line's
    calls, less ``@clock`` when ``ProtectClock=yes`` (systemd adds that denial itself)."""
    allow = [v for v in settings["SystemCallFilter"] if not v.startswith("~")]
    deny = [v.removeprefix("~") for v in settings["SystemCallFilter"] if v.startswith("~")]
    assert allow, "the unit's filter is an allow list"
    if settings.get("ProtectClock") == ["yes"]:
        deny.append("@clock")
    return resolve(allow) - resolve(deny)


def test_the_unit_is_sandboxed() -> None:
    settings = unit_settings()
    for key in ("PrivateDevices", "ProtectClock", "ProtectKernelTunables", "ProtectKernelLogs",
                "NoNewPrivileges", "RestrictSUIDSGID", "MemoryDenyWriteExecute"):  # fmt: skip
        assert settings.get(key) == ["yes"], key
    assert settings["UMask"] == ["0077"]
    assert settings["SystemCallFilter"][0] == "@system-service"
    assert settings["CapabilityBoundingSet"] == ["CAP_NET_ADMIN CAP_NET_RAW"]
    calls = allowed_syscalls(settings)
    # What netlink, sockets and trio need is in; what a proxy never does is out.
    assert {"socket", "bind", "sendmsg", "recvmsg", "epoll_wait", "setrlimit"} <= calls
    assert not {"settimeofday", "clock_settime", "init_module", "reboot", "setuid"} & calls


def test_systemd_analyze_security_rates_it() -> None:
    out = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(UNIT)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    m = re.search(r"Overall exposure level for nlproxy\.service: (\d+\.\d+)", out.stdout)
    assert m, out.stdout + out.stderr
    # 4.7 before SystemCallFilter, UMask, ProtectClock, PrivateDevices & co.; 1.7 with them.
    assert float(m.group(1)) <= 2.0, out.stdout


@pytest.fixture(scope="module")
def seccomp_binding() -> None:
    subprocess.run(
        ["bash", str(ROOT / "packaging/need-debs.sh"), "python3-seccomp"],
        check=True, capture_output=True,
    )  # fmt: skip


def _status(pid: int, field: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(field)


def test_the_daemon_runs_in_the_units_sandbox(
    seccomp_binding: None, deb: Path, testbed: Testbed, readable_tmp: Path
) -> None:
    settings = unit_settings()
    tree = readable_tmp / "deb"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], check=True)
    [site] = tree.glob("opt/nlproxy/lib/python3.*/site-packages")

    d = manifests(testbed, readable_tmp / "m")
    helper = readable_tmp / "apply.py"
    helper.write_text(APPLY)
    helper.chmod(0o644)
    caps = ",".join(f"+{c.removeprefix('CAP_').lower()}" for c in settings[
        "CapabilityBoundingSet"][0].split())  # fmt: skip
    healthz, metrics = two_free_ports()
    cmd = [
        "ip", "netns", "exec", testbed.node.netns,
        "setpriv", "--reuid", NOBODY, "--regid", NOBODY, "--clear-groups", "--no-new-privs",
        f"--inh-caps=-all,{caps}", f"--ambient-caps=-all,{caps}", f"--bounding-set=-all,{caps}",
        "/usr/bin/python3", str(helper), json.dumps(sorted(allowed_syscalls(settings))),
        settings["SystemCallErrorNumber"][0], settings["UMask"][0],
        "/usr/bin/python3.11", "-m", "nlproxy", "--log-format", "json", "run",
        "--manifests", str(d),
        "--node-name", testbed.node.name, "--cluster-cidr", testbed.cluster_cidr(),
        "--service-cidr", testbed.service_cidr(), "--sync-period", "2s",
        "--healthz-bind-address", f"127.0.0.1:{healthz}",
        "--metrics-bind-address", f"127.0.0.1:{metrics}",
    ]  # fmt: skip
    log = (readable_tmp / "daemon.log").open("w+")
    # The package's modules, not the checkout's: the directory the daemon starts in has none.
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": str(site)}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=readable_tmp, env=env)
    try:
        deadline = time.monotonic() + 90  # generous: a loaded machine
        code = 0
        while time.monotonic() < deadline and proc.poll() is None and code != 200:
            try:
                code = http_get(testbed.node.netns, healthz, "/healthz")[0]
            except OSError:
                time.sleep(0.2)
        log.seek(0)
        assert code == 200, f"exit {proc.poll()}: {log.read()[-3000:]}"
        # The sandbox is in force on the daemon itself.
        assert _status(proc.pid, "Seccomp") == "2"  # a filter
        assert _status(proc.pid, "NoNewPrivs") == "1"
        assert _status(proc.pid, "Umask") == "0077"
        assert _status(proc.pid, "Uid").split()[0] == NOBODY
        where = Path(f"/proc/{proc.pid}/map_files")  # the shim loaded is the package's
        assert any("_nftshim" in str(f.readlink()) and str(tree) in str(f.readlink())
                   for f in where.iterdir()), "the .deb's shim"  # fmt: skip
        out = tcp_request(testbed.pod("pod-b").netns, VIP, 80)
        assert (out.result, out.pod) == (Result.ANSWERED, "pod-a")
        code, body = http_get(testbed.node.netns, metrics, "/metrics")
        assert code == 200
        assert "kubeproxy_sync_proxy_rules_last_timestamp_seconds" in body
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        log.seek(0)
        text = log.read()
        log.close()
    assert '"level": "error"' not in text, text[-3000:]
