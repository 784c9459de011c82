"""``--owned-table`` end to end: the daemon's tables are owned by its netlink socket.

While it runs, nobody else (not even ``nft`` as root) may delete or flush them, and ``nft flush
ruleset`` leaves them alone; they persist when it stops (traffic keeps flowing through a
restart); the next daemon re-takes them without a blip, and a table made earlier without the
flag is replaced by an owned one in one batch.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import VIP_A, answered_by, daemon, objects, publish

testbed = topo.testbed


def nft(tb: Testbed, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", tb.node.netns, "nft", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )


def test_owned_tables_resist_deletion_and_flush_ruleset(testbed: Testbed, tmp_path: Path) -> None:
    d = publish(tmp_path / "m", objects(testbed, ["pod-a"]))
    with daemon(testbed, d, "--owned-table") as proc:
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        for family in ("ip", "ip6"):
            refused = nft(testbed, "delete", "table", family, "nlproxy")
            assert refused.returncode != 0, f"{family} nlproxy could be deleted"
            assert "Operation not permitted" in refused.stderr
        assert nft(testbed, "flush", "ruleset").returncode == 0
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}, "flush ruleset removed the rules"
        # flush ruleset is another process's commit, read back: it changed nothing of nlproxy's.
        assert not proc.events("drift.repaired")
        assert proc.stop() == 0
    # Persistent: the rules stay after the owner exits, and anyone may change them again.
    assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
    with daemon(testbed, d, "--owned-table"):
        # Re-taken by the new process: protected again, still serving.
        assert nft(testbed, "delete", "table", "ip", "nlproxy").returncode != 0
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}


def test_a_table_made_without_the_flag_becomes_owned(testbed: Testbed, tmp_path: Path) -> None:
    d = publish(tmp_path / "m", objects(testbed, ["pod-a"]))
    with daemon(testbed, d) as plain:
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        assert plain.stop() == 0
    with daemon(testbed, d, "--owned-table") as proc:
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        assert nft(testbed, "delete", "table", "ip", "nlproxy").returncode != 0
        (event,) = [e for e in proc.events("table.owned") if e["family"] == "ip"]
        assert event["recreated"] is True
