"""`systemctl restart nlproxy` while the client keeps opening connections through the node port:
nothing is lost (SIGTERM leaves the rules in place) and the new process, finding the kernel
already right, sends no changes."""

from __future__ import annotations

import json
import time

import cluster
from conftest import Vms, wait_for

NODE1 = cluster.nodes()[0]


def test_restart_loses_no_connection_and_changes_nothing(vms: Vms) -> None:
    old_pid = vms.main_pid(NODE1.name)
    stop = f"/tmp/nlproxy-vm-stop-{time.monotonic_ns()}"
    loop = vms.popen(
        "client",
        f"python3 /usr/local/lib/nlproxy-vm/probe.py tcp-loop {NODE1.ip} 30080 --stop {stop}",
    )
    with loop:
        try:
            time.sleep(2.0)  # let the loop run before the restart too
            # Type=notify: restart returns once the new process reported READY=1.
            vms.run(NODE1.name, "sudo systemctl restart nlproxy")
            new_pid = vms.main_pid(NODE1.name)
            assert new_pid not in (0, old_pid)
            time.sleep(2.0)
            vms.run("client", f"touch {stop}")
            out, err = loop.communicate(timeout=60)
        finally:
            loop.kill()
            vms.run("client", f"rm -f {stop}", check=False)
    summary = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
    assert summary is not None, f"the probe loop printed nothing: {err}"
    assert summary["sent"] > 10, summary
    assert summary["failed"] == [], summary

    applied = wait_for(
        "the restarted nlproxy's first sync.applied event",
        lambda: [
            line
            for line in vms.journal(NODE1.name, f"_PID={new_pid}")
            if line["event"] == "sync.applied"
        ],
    )
    assert applied[0]["ops"] == 0, applied[0]
