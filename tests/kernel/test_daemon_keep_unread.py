"""A file that does not parse when the daemon starts keeps its Services as programmed.

The previous daemon programmed them; the new one cannot read the file, so it knows nothing of
what the file holds. Its Services keep answering (the tables keep their objects, no restart
record says they are gone) while other files' changes are applied, a Service removed from a
file that is read is removed, and once the file parses again what it no longer holds goes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from nlproxy.demo.echo import Result, tcp_request
from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import VIP_A, VIP_B, answered_by, daemon, wait_until
from tests.objects import endpoint, endpoint_slice, service

testbed = topo.testbed

VIP_C = "10.96.0.12"  # in the broken file; removed when it is fixed
VIP_D = "10.96.0.13"  # in a file read throughout; removed while the other is broken


def _service(tb: Testbed, name: str, vip: str, pods: list[str]) -> list[dict[str, Any]]:
    eps = [endpoint(str(tb.pod(p).ipv4), tb.node.name) for p in pods]
    return [service(name, vip), endpoint_slice(name, eps)]


def _write(path: Path, objs: list[dict[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(yaml.safe_dump_all(objs, sort_keys=False))
    tmp.replace(path)


def _refused(tb: Testbed, vip: str) -> bool:
    return tcp_request(tb.pod("pod-a").netns, vip, 80, timeout=1.0).result is not Result.ANSWERED


def test_a_broken_file_at_start_keeps_its_services_until_it_parses(
    testbed: Testbed, tmp_path: Path
) -> None:
    d = tmp_path / "m"
    d.mkdir()
    _write(d / "node.yaml", [testbed.node_manifest()])
    broken = d / "a.yaml"
    _write(
        broken, _service(testbed, "a", VIP_A, ["pod-a"]) + _service(testbed, "c", VIP_C, ["pod-b"])
    )
    other = d / "b.yaml"
    _write(
        other, _service(testbed, "b", VIP_B, ["pod-c"]) + _service(testbed, "d", VIP_D, ["pod-c"])
    )
    with daemon(testbed, d) as first:
        for vip, pod in ((VIP_A, "pod-a"), (VIP_B, "pod-c"), (VIP_C, "pod-b"), (VIP_D, "pod-c")):
            wait_until(lambda v=vip, p=pod: answered_by(testbed, v, 3) == {p}, 10.0, vip)
        assert first.stop() == 0

    broken.write_text(broken.read_text() + "\n---\nkind: Service\nmetadata: {name: [oops\n")
    with daemon(testbed, d) as second:
        assert answered_by(testbed, VIP_A, 6) == {"pod-a"}, "the unread file's Service was cut"
        assert answered_by(testbed, VIP_C, 6) == {"pod-b"}
        assert answered_by(testbed, VIP_B, 6) == {"pod-c"}
        (kept,) = second.events("sync.kept")[:1]
        assert kept["services"] == ["default/a", "default/c"]
        assert kept["unread"] == ["a.yaml"]

        # Other files go on: a change is applied and a removal deletes, the kept stay.
        _write(other, _service(testbed, "b", VIP_B, ["pod-b"]))
        wait_until(lambda: answered_by(testbed, VIP_B, 3) == {"pod-b"}, 10.0, "b moved")
        wait_until(lambda: _refused(testbed, VIP_D), 10.0, "d removed")
        assert answered_by(testbed, VIP_A, 6) == {"pod-a"}
        assert answered_by(testbed, VIP_C, 6) == {"pod-b"}

        # Fixed: its new content is applied, and what it no longer holds is deleted.
        _write(broken, _service(testbed, "a", VIP_A, ["pod-c"]))
        wait_until(lambda: answered_by(testbed, VIP_A, 3) == {"pod-c"}, 10.0, "a fixed")
        wait_until(lambda: _refused(testbed, VIP_C), 10.0, "c removed with the fix")
        assert second.events("sync.keep_ended")
        assert answered_by(testbed, VIP_B, 3) == {"pod-b"}
        assert second.stop() == 0

    # The tables hold exactly the plan: a restart trusts them and sends nothing.
    with daemon(testbed, d) as third:
        wait_until(lambda: bool(third.events("sync.applied")), 10.0, "a first sync")
        assert answered_by(testbed, VIP_A, 3) == {"pod-c"}
        assert _refused(testbed, VIP_C)
        assert next(e["ops"] for e in third.events("sync.applied")) == 0
