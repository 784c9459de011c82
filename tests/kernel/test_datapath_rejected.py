"""Two Services claiming one frontend: the younger is refused it, named, and the node keeps
serving the others.

Two LoadBalancer services claim one address and port with overlapping source ranges: each is
valid alone; together they would make overlapping elements in an interval set, which the kernel
refuses (``test_sync_isolation.py`` drives that refusal through the Syncer). The state settles
the claim first: the first claimant keeps the address, ``run --once`` names the other and exits
3, and the rest of it (its ClusterIP) and every other service are programmed. Fixing the service
brings it in on the next run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.topo import (
    EXIT_INVALID,
    EXIT_OK,
    LB_IP,
    answers,
    ask,
    lb,
    run_once,
    write_manifests,
)

testbed = topo.testbed

WEB_VIP = "10.96.0.30"


def web(tb: Testbed) -> list[Any]:
    p = tb.pod("pod-a")
    return [
        topo.service("web", WEB_VIP),
        topo.endpoint_slice("web", [topo.endpoint(str(p.ipv4), p.node)]),
    ]


def test_a_refused_service_is_left_out_and_the_rest_serve(
    testbed: Testbed, tmp_path: Path, capsys: Any
) -> None:
    client = str(testbed.client.ipv4[0])
    # The kernel refuses a range inside one already in the set (a wider one after a narrower
    # one it takes).
    first = lb(testbed, "edge-a", "10.96.0.10", "pod-b", 80, [f"{client}/24"])
    clash = lb(testbed, "edge-b", "10.96.0.11", "pod-c", 80, [f"{client}/32"])
    objs = [testbed.node_manifest(), *first, *clash, *web(testbed)]
    assert run_once(testbed, write_manifests(tmp_path, objs)) == EXIT_INVALID
    err = capsys.readouterr().err
    assert (
        "Service default/edge-b: status.loadBalancer.ingress: 192.168.70.10 port 80/TCP is also "
        "Service default/edge-a's (older); 192.168.70.10 left out" in err
    )
    assert set(answers(ask("tcp", testbed.pod("pod-r").netns, "10.96.0.11", 80, n=4))) == {
        "pod-c"
    }  # the rest of edge-b is programmed
    ns, gw = testbed.client.netns, str(testbed.node.gateway_v4)
    # edge-a, the first claimant, owns the address; web works from a pod.
    assert answers(ask("tcp", ns, LB_IP, 80, n=8)) == {"pod-b": {gw}}
    pod_r = testbed.pod("pod-r")
    assert set(answers(ask("tcp", pod_r.netns, WEB_VIP, 80, n=4))) == {"pod-a"}

    # edge-b moves to its own port: nothing is refused any more, both serve.
    fixed = lb(testbed, "edge-b", "10.96.0.11", "pod-c", 8080, [f"{client}/32"])
    objs = [testbed.node_manifest(), *first, *fixed, *web(testbed)]
    assert run_once(testbed, write_manifests(tmp_path, objs)) == EXIT_OK
    assert answers(ask("tcp", ns, LB_IP, 8080, n=8)) == {"pod-c": {gw}}
    assert answers(ask("tcp", ns, LB_IP, 80, n=8)) == {"pod-b": {gw}}
