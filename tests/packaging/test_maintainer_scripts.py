"""The .deb's maintainer scripts on a systemd host, and its sysctl.d file.

postinst runs as dpkg runs it (``configure``), in a private mount namespace where
``/run/systemd/system`` exists and the systemd tools it may call are stand-ins recording their
arguments: nothing on this machine is changed. It must apply only its own sysctl.d file, never
restart systemd-sysctl (which re-applies every file on the node), and that file must never set
the conntrack table size (a fixed value there would lower a larger one at every boot).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.packaging.conftest import ROOT

SYSCTL_FILE = "/etc/sysctl.d/90-nlproxy-conntrack.conf"


def run_postinst(tmp_path: Path) -> list[str]:
    """postinst configure on a pretend systemd host; the recorded calls, one a line."""
    calls = tmp_path / "calls"
    calls.touch()
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for tool in ("systemctl", "systemd-sysusers", "systemd-sysctl"):
        stub = stubs / tool
        stub.write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\n')
        stub.chmod(0o755)
    upper, work = tmp_path / "upper", tmp_path / "work"
    (upper / "systemd/system").mkdir(parents=True)
    work.mkdir()
    script = "\n".join(
        [
            "set -e",
            f"mount -t overlay overlay -o lowerdir=/run,upperdir={upper},workdir={work} /run",
            f"mount --bind {stubs}/systemd-sysctl /usr/lib/systemd/systemd-sysctl",
            f'PATH={stubs}:$PATH sh {ROOT}/packaging/deb/postinst configure ""',
        ]
    )
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return calls.read_text().splitlines()


def test_postinst_applies_only_its_own_sysctl_file(tmp_path: Path) -> None:
    calls = run_postinst(tmp_path)
    sysctl = [c for c in calls if c.startswith("systemd-sysctl")]
    assert sysctl == [f"systemd-sysctl {SYSCTL_FILE}"]
    assert not [c for c in calls if "systemd-sysctl" in c and c.startswith("systemctl")]
    assert "systemctl try-restart nlproxy.service" in calls  # an upgrade restarts a running one


def test_the_sysctl_file_never_sets_the_table_size() -> None:
    text = (ROOT / "deploy/sysctl/90-nlproxy-conntrack.conf").read_text()
    keys = [
        line.split("=", 1)[0].strip()
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith(("#", ";"))
    ]
    assert keys  # the timeouts are there
    assert "net.netfilter.nf_conntrack_max" not in keys
    assert not [k for k in keys if "conntrack_max" in k or "nf_conntrack_buckets" in k]
