"""A daemon killed between a commit that removed an affinity client's endpoint and forgetting
that client: the next one forgets it at start (``sync/batches.py``'s ``forget_left_clients``).

Without that, the restart sends nothing (the tables already hold the commit), so nothing
forgets the client: the port's clients map keeps sending it to the removed pod (which still
answers here, as a pod that left the Service's endpoints but not the node does), and each of its
packets refreshes the entry, so it never moves.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import ScriptedDaemon, daemon, publish, wait_until
from tests.kernel.test_datapath_affinity_map import STICKY, VIP, _clients
from tests.kernel.topo import PORTS, SLICE_PORTS, answers, ask

testbed = topo.testbed


KILLED_AT_FORGET = """
import os, signal, sys
from nlproxy.sync import batches

forgetting = batches.Batches.forget_clients

def killed(self, planned, changing):
    # Once armed: die after the commit, before its clients are forgotten.
    if os.path.exists(os.environ["NLPROXY_TEST_ARMED"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return forgetting(self, planned, changing)

batches.Batches.forget_clients = killed
from nlproxy.cli import main
sys.exit(main(sys.argv[1:]))
"""


def objects(tb: Testbed, pods: list[str]) -> list[dict[str, Any]]:
    eps = [topo.endpoint(str(tb.pod(p).ipv4), tb.pod(p).node) for p in pods]
    return [
        tb.node_manifest(),
        topo.service("web", VIP, PORTS, **STICKY),
        topo.endpoint_slice("web", eps, SLICE_PORTS),
    ]


def test_a_restart_forgets_the_clients_a_killed_daemon_left(
    testbed: Testbed, tmp_path: Path
) -> None:
    pods = ["pod-b", "pod-c", "pod-r"]
    d = publish(tmp_path / "m", objects(testbed, pods))
    armed = tmp_path / "armed"
    first = ScriptedDaemon(testbed, d, KILLED_AT_FORGET, {"NLPROXY_TEST_ARMED": str(armed)})
    client = testbed.pod("pod-a")
    try:
        first.wait_ready()
        seen = answers(ask("tcp", client.netns, VIP, 80))
        assert len(seen) == 1, f"one client, one pod: {seen}"
        (pod,) = seen
        assert _clients(testbed) == {str(client.ipv4): str(testbed.pod(pod).ipv4)}

        # The client's pod leaves the Service (it still answers); the commit lands and the
        # daemon dies before forgetting the client.
        armed.touch()
        publish(d, objects(testbed, [p for p in pods if p != pod]))
        assert first.proc.wait(timeout=120) == -signal.SIGKILL
    finally:
        first.kill()
    assert _clients(testbed) == {str(client.ipv4): str(testbed.pod(pod).ipv4)}  # left behind
    assert answers(ask("tcp", client.netns, VIP, 80, n=3)) == {pod: {str(client.ipv4)}}

    with daemon(testbed, d) as second:
        wait_until(lambda: str(client.ipv4) not in _clients(testbed), 20.0, "the client forgotten")
        moved = answers(ask("tcp", client.netns, VIP, 80))
        assert len(moved) == 1, f"one client, one pod: {moved}"
        assert pod not in moved
        assert second.stop() == 0
