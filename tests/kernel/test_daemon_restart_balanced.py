"""A daemon restart keeps the round-robin and consistent-hash tables it finds programmed.

The daemon builds at most one Service's budget of such tables a sync, so a first start of
several spreads them over syncs. A restart of an unchanged node finds them all programmed:
it sends nothing, at its first sync or after, and every port still has its tables (no Service
falls back to random choice while they would be rebuilt; clients do not move).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from nlproxy.demo.testbed import Testbed
from tests import objects as o
from tests.kernel import topo
from tests.kernel.daemon import daemon, nft, publish, wait_until

testbed = topo.testbed

LB = "nlproxy.io/load-balancing"
SERVICES = 6
"""Consistent-hash and round-robin Services, alternately: the consistent-hash ones' tables
(4,096 slots a port) are more than one sync's quota together."""


def _balanced(tb: Testbed) -> list[dict[str, Any]]:
    pods = [tb.pod(p) for p in ("pod-a", "pod-b", "pod-c")]
    objs = [tb.node_manifest()]
    for i in range(SERVICES):
        name = f"lb{i}"
        svc = o.service(name, f"10.96.0.{60 + i}", topo.PORTS)
        svc["metadata"]["annotations"] = {LB: "round-robin" if i % 2 else "consistent-hash"}
        eps = [o.endpoint(str(p.ipv4), p.node) for p in pods]
        objs += [svc, o.endpoint_slice(name, eps, topo.SLICE_PORTS)]
    return objs


def _maps(tb: Testbed) -> int:
    """The round-robin and consistent-hash maps in the node's ``ip nlproxy`` table."""
    return nft(tb, "list", "maps", "ip").count("map lb-cluster-")


def test_a_restart_keeps_the_balanced_tables_and_sends_nothing(
    testbed: Testbed, tmp_path: Path
) -> None:
    d = publish(tmp_path / "m", _balanced(testbed))
    every = SERVICES * len(topo.PORTS)
    with daemon(testbed, d) as first:
        wait_until(lambda: _maps(testbed) == every, 10.0, "every Service's tables built")
        time.sleep(0.5)  # a sync still running has committed by now
        built_in = [e for e in first.events("sync.applied") if e["ops"]]
        assert first.stop() == 0
    assert len(built_in) > 1, "the tables were spread over syncs (the quota)"

    with daemon(testbed, d) as second:
        time.sleep(2.0)  # the restart's syncs: trusted, then planned
        applied = second.events("sync.applied")
        trusted = second.events("sync.restart_trusted")
        assert _maps(testbed) == every
    assert applied
    assert [e["ops"] for e in applied] == [0] * len(applied)
    assert trusted
