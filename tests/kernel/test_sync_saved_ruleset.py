"""A ruleset the Syncer programmed, its records included, saves and loads back with ``nft``.

``nft list ruleset > f; nft -f f`` restores every table of a node at once, and ``nft`` refuses
the whole file for one comment over 128 characters. The layouts themselves are checked by
``test_nft_restore.py`` (programmed without records); here the Syncer writes them, with the
restart record each commit leaves in the tables (and the health-check record of the world's
Local Service: ``sync/health.py``), as the daemon does and as ``run --once`` does
after a clean run (a second digest, of its files). Loaded into another namespace, the tables
read back as the plan (a sync there sends nothing), and the records there vouch for nothing:
another writer made those tables.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from nlproxy.cluster.model import LoadBalancing
from nlproxy.sync.kernel import real as real_kernel
from nlproxy.sync.syncer import Syncer
from tests.netns import sh
from tests.world import config, world

LAYOUTS = [
    pytest.param(False, LoadBalancing.RANDOM, id="plain"),
    pytest.param(True, LoadBalancing.RANDOM, id="service-counters"),
    pytest.param(False, LoadBalancing.ROUND_ROBIN, id="round-robin"),
    pytest.param(False, LoadBalancing.CONSISTENT_HASH, id="consistent-hash"),
]


@pytest.mark.parametrize(("counters", "lb"), LAYOUTS)
@pytest.mark.parametrize("files", [False, True], ids=["daemon", "run-once"])
def test_a_saved_ruleset_with_restart_records_loads_back(
    make_netns: Callable[[str], str], counters: bool, lb: LoadBalancing, files: bool
) -> None:
    node, scratch = make_netns("srs"), make_netns("srr")
    cfg = config(service_counters=counters, load_balancing=lb)
    syncer = Syncer(cfg, real_kernel(node))
    try:
        if files:  # what run --once records after a run with nothing to warn about
            syncer.files_digest = "ab" * 32
        assert syncer.sync(world()).total_ops > 0
        saved = sh("nft", "list", "ruleset", ns=node)
    finally:
        syncer.close()
    assert "restart-record" in saved
    assert "health-check-record" in saved  # the world's Local Service's port (sync/health.py)

    load = subprocess.run(
        ["ip", "netns", "exec", scratch, "nft", "-f", "-"],
        input=saved,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert load.returncode == 0, f"nft -f refused the saved ruleset:\n{load.stderr}"

    restored = Syncer(cfg, real_kernel(scratch))
    try:
        result = restored.sync(world())
    finally:
        restored.close()
    assert not result.restarted  # the records do not vouch for tables another writer made
    assert result.total_ops == 0  # read back, they hold the plan
