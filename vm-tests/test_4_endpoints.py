"""Removing an endpoint by editing the manifests: nlproxy reprograms the nodes and deletes the
removed endpoint's UDP flows, so the next datagram from the same client socket reaches another
pod instead of the one that is gone."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import cluster
import pytest
from conftest import Vms, pods_answering, wait_for

NODE1 = cluster.nodes()[0]
VIP = cluster.WEB.cluster_ip
DEADLINE = 60.0


def flows_to(vms: Vms, pod_ip: str, sport: int | None = None) -> list[int]:
    """Remaining timeouts (s) of node1's UDP flows to the VIP DNATed to pod_ip; with ``sport``,
    only the flow from that client port (earlier tests' probes leave short flows to the same
    pod, which say nothing about this test's flow)."""
    only = f" --orig-port-src {sport}" if sport is not None else ""
    out = vms.out(
        NODE1.name,
        f"sudo conntrack -L -p udp --orig-dst {VIP} --orig-port-dst 53 --reply-src {pod_ip}"
        f"{only} 2>/dev/null",
    )
    return [int(line.split()[2]) for line in out.splitlines() if line.startswith("udp")]


def ask(session: subprocess.Popen[str]) -> dict[str, Any]:
    assert session.stdin is not None
    assert session.stdout is not None
    session.stdin.write("\n")
    line = session.stdout.readline()
    if not line:
        pytest.fail(f"the UDP probe session ended: {session.stderr and session.stderr.read()}")
    answer: dict[str, Any] = json.loads(line)
    return answer


@pytest.mark.usefixtures("restore_manifests")
def test_removed_endpoint_flow_is_deleted_and_the_socket_moves_on(vms: Vms) -> None:
    probe = f"python3 /usr/local/lib/nlproxy-vm/probe.py udp-session {VIP} 53"
    with vms.popen("client", probe) as session:
        try:
            first = ask(session)
            assert first["ok"], first
            # A flow answered and still used more than 2 s later gets the UDP stream timeout
            # (nf_conntrack_udp_timeout_stream, 120 s): then only a deletion can make it vanish
            # within DEADLINE.
            time.sleep(3.0)
            second = ask(session)
            assert (second["ok"], second["pod"], second["local_port"]) == (
                True,
                first["pod"],
                first["local_port"],
            ), second
            gone, gone_ip = first["pod"], cluster.pod_node(first["pod"]).pods[first["pod"]]
            timeouts = flows_to(vms, gone_ip, first["local_port"])
            assert len(timeouts) == 1, f"this socket's flow on {NODE1.name} to {gone}: {timeouts}"
            assert timeouts[0] > DEADLINE, f"flow would expire by itself: {timeouts}"

            start = vms.clock(NODE1.name)
            vms.write_manifests(without=frozenset({gone}))
            wait_for(
                f"node1's flow to the removed endpoint {gone} deleted",
                lambda: not flows_to(vms, gone_ip),
                DEADLINE,
            )

            after = ask(session)
            assert after["ok"], after
            assert after["local_port"] == first["local_port"]
            assert after["pod"] != gone, f"{gone} still answered after its endpoint was removed"
            flushed = [
                line
                for line in vms.journal(NODE1.name, since=start)
                if line["event"] == "conntrack.flushed" and line.get("deleted", 0) > 0
            ]
            assert flushed, f"{NODE1.name}: no conntrack.flushed event with deleted > 0"
            rest = {p for p, _, _ in cluster.endpoints(cluster.WEB, frozenset({gone}))}
            assert after["pod"] in rest
            assert pods_answering(vms, "client", "tcp", VIP, 80, 30) <= rest
        finally:
            session.kill()
