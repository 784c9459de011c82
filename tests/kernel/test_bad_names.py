"""A name the API server would refuse (too long, not ASCII) is named at parse time and only that
Service is left out; before, the kernel refused the whole batch (an affinity set's name grew
past its limit) and no change reached any Service."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import VIP_A, answered_by, objects

testbed = topo.testbed


@pytest.mark.parametrize("name", ["a" * 300, "wéb"], ids=["300-characters", "not-ascii"])
def test_an_invalid_name_leaves_only_that_service_out(
    testbed: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    bad = topo.service(name, "10.96.0.66", sessionAffinity="ClientIP")
    eps = [topo.endpoint(str(testbed.pod("pod-b").ipv4), testbed.node.name)]
    topo.write_manifests(tmp_path, objects(testbed, ["pod-a"]))
    bad_file = tmp_path / "bad.yaml"  # not named after the object: the name is the problem
    bad_file.write_text(yaml.safe_dump_all([bad, topo.endpoint_slice(name, eps)]))
    assert topo.run_once(testbed, tmp_path) == topo.EXIT_INVALID
    assert "is not a valid Service name" in capsys.readouterr().err
    assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
