"""A running daemon's ``/healthz`` follows its Node: tainted ``ToBeDeletedByClusterAutoscaler``
it answers 503 with ``nodeEligible: false`` (load balancers drain the node) while ``/livez``
stays 200; without the taint it is 200 again."""

from __future__ import annotations

import json
from pathlib import Path

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import daemon, objects, publish, wait_until

testbed = topo.testbed


def test_autoscaler_taint_makes_healthz_drain(testbed: Testbed, tmp_path: Path) -> None:
    objs = objects(testbed, ["pod-a"])
    d = publish(tmp_path / "m", objs)
    with daemon(testbed, d) as proc:
        assert json.loads(proc.get(proc.healthz, "/healthz")[1])["nodeEligible"] is True
        objs[0]["spec"]["taints"] = [
            {"key": "ToBeDeletedByClusterAutoscaler", "value": "1", "effect": "NoSchedule"}
        ]
        publish(d, objs)
        wait_until(lambda: proc.get(proc.healthz, "/healthz")[0] == 503, 5.0, "healthz drains")
        assert json.loads(proc.get(proc.healthz, "/healthz")[1])["nodeEligible"] is False
        assert proc.get(proc.healthz, "/livez")[0] == 200
        del objs[0]["spec"]["taints"]
        publish(d, objs)
        wait_until(lambda: proc.get(proc.healthz, "/healthz")[0] == 200, 5.0, "healthz back")
