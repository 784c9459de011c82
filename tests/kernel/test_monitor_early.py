"""The drift watch takes its first generation before the daemon's first read-back and commit.

Before, it began only after the first sync, and took the kernel's generation then as "seen": a
change another process made to nlproxy's tables before that went unseen, and the quiet verify
(which skips the read-back while every transaction since is nlproxy's own) would never look.
Here the first sync is held back by an API server that refuses EndpointSlices, another process
writes to nlproxy's table meanwhile, and after the grant the daemon must report and repair it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import VIP_A, Daemon, answered_by, put_service, wait_until
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import TOKEN, write_kubeconfig

testbed = topo.testbed


def nft(tb: Testbed, *args: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", tb.node.netns, "nft", *args],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout  # fmt: skip


def test_a_change_before_the_first_sync_is_seen_and_repaired(
    testbed: Testbed, tmp_path: Path
) -> None:
    api = ApiServer(token=TOKEN)
    api.start()
    d = None
    try:
        api.store.put("nodes", testbed.node_manifest())
        put_service(api, testbed, "a", VIP_A, ["pod-a"])
        api.forbid("endpointslices", "list")
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api)
        d = Daemon(testbed, None, "--kubeconfig", str(kubeconfig), "--sync-period", "2s")
        slices = "/apis/discovery.k8s.io/v1/endpointslices"
        wait_until(lambda: any(p == slices for p, _ in api.requests), 20.0, "the slice list")
        assert not d.events("sync.applied")
        # Another process writes into nlproxy's table before nlproxy's first commit.
        nft(testbed, "add", "table", "ip", "nlproxy")
        nft(testbed, "add", "chain", "ip", "nlproxy", "intruder")
        api.allow("endpointslices")
        d.wait_ready(timeout=40)
        # Reported by the loop once it runs, as generations of a writer the kernel does not
        # name to a process that is not a member of NFNLGRP_NFTABLES (docs/ruleset.md).
        wait_until(
            lambda: [e for e in d.events("drift.notifications_lost") if not e["own"]],
            10.0,
            "the drift",
        )
        assert answered_by(testbed, VIP_A, 4) == {"pod-a"}
        wait_until(lambda: "intruder" not in nft(testbed, "list", "table", "ip", "nlproxy"),
                   10.0, "the intruder's chain removed")  # fmt: skip
    finally:
        if d is not None:
            d.kill()
        api.stop()
