"""nlproxy needs no more than CAP_NET_ADMIN and CAP_NET_RAW: run it as an unprivileged user
holding just those two (as the systemd unit does) and check it programs a working service.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nlproxy.demo.echo import Result, tcp_request
from nlproxy.demo.testbed import Testbed
from tests.kernel import topo

testbed = topo.testbed

NOBODY = "65534"
VIP = "10.96.0.40"


def as_nobody(tb: Testbed, caps: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``nlproxy ARGS`` inside the node namespace as uid/gid 65534 holding only ``caps``."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.fail("setpriv (util-linux) is missing")
    cmd = [
        "ip", "netns", "exec", tb.node.netns,
        setpriv, "--reuid", NOBODY, "--regid", NOBODY, "--clear-groups",
        f"--inh-caps=-all{caps}", f"--ambient-caps=-all{caps}", f"--bounding-set=-all{caps}",
        sys.executable, "-m", "nlproxy", *args,
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def manifests(tb: Testbed, directory: Path) -> Path:
    ep = topo.endpoint(str(tb.pod("pod-a").ipv4), tb.node.name)
    objs = [tb.node_manifest(), topo.service("web", VIP), topo.endpoint_slice("web", [ep])]
    topo.write_manifests(directory, objs)
    directory.chmod(0o755)
    for f in directory.iterdir():
        f.chmod(0o644)
    return directory


def run_args(tb: Testbed, directory: Path) -> list[str]:
    return [
        "run", "--once", "--manifests", str(directory), "--node-name", tb.node.name,
        "--cluster-cidr", tb.cluster_cidr(), "--service-cidr", tb.service_cidr(),
    ]  # fmt: skip


@pytest.fixture
def readable_tmp(tmp_path: Path) -> Path:
    """pytest's tmp dirs are private to root; the unprivileged user must read the manifests."""
    for p in (tmp_path, *tmp_path.parents):
        if p == Path("/tmp"):
            break
        p.chmod(p.stat().st_mode | 0o055)
    return tmp_path


def test_two_capabilities_are_enough(testbed: Testbed, readable_tmp: Path) -> None:
    d = manifests(testbed, readable_tmp / "m")
    proc = as_nobody(testbed, ",+net_admin,+net_raw", *run_args(testbed, d))
    assert proc.returncode == 0, proc.stderr
    out = tcp_request(testbed.pod("pod-b").netns, VIP, 80)
    assert (out.result, out.pod) == (Result.ANSWERED, "pod-a")
    again = as_nobody(
        testbed, ",+net_admin,+net_raw", "--log-format", "json", *run_args(testbed, d)
    )
    assert again.returncode == 0, again.stderr
    assert '"ops": 0' in again.stderr  # it read back what it had programmed, as nobody
    rules = as_nobody(testbed, ",+net_admin,+net_raw", "rules")
    assert rules.returncode == 0, rules.stderr
    assert VIP in rules.stdout


def test_without_net_admin_it_fails_cleanly(testbed: Testbed, readable_tmp: Path) -> None:
    d = manifests(testbed, readable_tmp / "m")
    proc = as_nobody(testbed, ",+net_raw", *run_args(testbed, d))
    assert proc.returncode == 1, proc.stderr
    assert "Operation not permitted" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_conntrack_without_net_admin_names_the_capability(testbed: Testbed) -> None:
    proc = as_nobody(testbed, ",+net_raw", "conntrack", "list")
    assert proc.returncode == 1, proc.stderr
    assert "need CAP_NET_ADMIN" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
