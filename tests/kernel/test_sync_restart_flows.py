"""A daemon killed between a commit and its conntrack cleanup: the next one deletes the stale
UDP flow at start (``sync/cleanup.py``'s sweep), and keeps the live backend's.

The first daemon is the real ``nlproxy run`` with one thing added: the moment its cleanup is
about to delete the flows of a removed endpoint, it sends itself SIGKILL (what a stop
deadline, ``kill -9`` or the OOM killer does at that moment). So the kernel holds the commit
without pod A, and conntrack still sends the client's UDP socket to pod A, which is gone: its
datagrams are lost. The second daemon is the real one, unchanged.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from ipaddress import ip_address
from pathlib import Path
from typing import Any

import pytest

from nlproxy.conntrack.kernel import Conntrack
from nlproxy.conntrack.messages import Flow, FlowFilter
from nlproxy.demo.echo import Outcome, Result, UdpSession
from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import ScriptedDaemon, daemon, publish, wait_until
from tests.netns import sh

testbed = topo.testbed

VIP = "10.96.0.60"
PORTS = ({"name": "udp", "port": 53, "targetPort": 8080, "protocol": "UDP"},)
SLICE_PORTS = ({"name": "udp", "port": 8080, "protocol": "UDP"},)

KILLED_AT_CLEANUP = """
import os, signal, sys
from nlproxy.conntrack import kernel

deleting = kernel.Conntrack.delete

def killed(self, filters):
    # A removed endpoint's flows are about to go: die here, as a SIGKILL at this moment does.
    if any(f.reply_src is not None for f in filters):
        os.kill(os.getpid(), signal.SIGKILL)
    return deleting(self, filters)

kernel.Conntrack.delete = killed
from nlproxy.cli import main
sys.exit(main(sys.argv[1:]))
"""


def objects(tb: Testbed, pods: list[str]) -> list[dict[str, Any]]:
    svc = topo.service("u", VIP, PORTS)
    eps = [topo.endpoint(str(tb.pod(p).ipv4), tb.pod(p).node) for p in pods]
    return [tb.node_manifest(), svc, topo.endpoint_slice("u", eps, SLICE_PORTS)]


@pytest.fixture
def killed(testbed: Testbed, tmp_path: Path) -> Iterator[tuple[ScriptedDaemon, Path]]:
    d = publish(tmp_path / "m", objects(testbed, ["pod-a", "pod-b"]))
    proc = ScriptedDaemon(testbed, d, KILLED_AT_CLEANUP)
    try:
        proc.wait_ready()
        yield proc, d
    finally:
        proc.kill()


def session_to(tb: Testbed, pod: str) -> tuple[UdpSession, Outcome]:
    """A UDP socket in pod-c whose flow the ClusterIP sent to ``pod`` (new source ports until
    one lands there: the choice is random)."""
    for _ in range(200):
        s = UdpSession(tb.pod("pod-c").netns, VIP, 53)
        out = s.ask()
        if out.result is Result.ANSWERED and out.pod == pod:
            return s, out
        s.close()
    raise AssertionError(f"no UDP socket reached {pod}")


def flows_to_vip(ns: str) -> list[Flow]:
    return list(Conntrack(ns).list(FlowFilter(proto="udp", orig_dst=ip_address(VIP))))


def flow_of(ns: str, sport: int) -> Flow | None:
    found = [f for f in flows_to_vip(ns) if f.orig.sport == sport]
    return found[0] if found else None


def by_backend(flows: list[Flow], addr: str) -> dict[int, int | None]:
    """Source port -> conntrack id of the flows ``addr`` answers."""
    return {f.orig.sport: f.id for f in flows if str(f.reply.src) == addr}


def test_a_restart_deletes_the_flow_a_killed_daemon_left(
    testbed: Testbed, killed: tuple[ScriptedDaemon, Path]
) -> None:
    first, d = killed
    node = testbed.node.netns
    # Long flow timeouts in the node: only the daemons delete flows in this test.
    for key in ("nf_conntrack_udp_timeout", "nf_conntrack_udp_timeout_stream"):
        sh("sysctl", "-qw", f"net.netfilter.{key}=3600", ns=node)
    to_a, _ = session_to(testbed, "pod-a")
    to_b, _ = session_to(testbed, "pod-b")
    with to_a, to_b:
        for s in (to_a, to_b):
            assert s.ask().result is Result.ANSWERED  # both ways seen again: an assured stream
        pod_a, pod_b = str(testbed.pod("pod-a").ipv4), str(testbed.pod("pod-b").ipv4)

        # Pod A goes (its link with it), and so does its endpoint: the commit lands, the
        # cleanup never runs.
        sh("ip", "link", "set", "eth0", "down", ns=testbed.pod("pod-a").netns)
        publish(d, objects(testbed, ["pod-b"]))
        assert first.proc.wait(timeout=120) == -signal.SIGKILL
        assert pod_a not in topo.nft_ruleset(testbed)  # committed without pod A
        stale = flow_of(node, to_a.local[1])
        assert stale is not None
        assert str(stale.reply.src) == pod_a
        lost = to_a.ask()
        assert lost.pod != "pod-b", "the stale flow still carries the socket to pod A"
        # Every socket that landed on pod A (session_to tried several) left such a flow.
        before = flows_to_vip(node)
        on_a, on_b = by_backend(before, pod_a), by_backend(before, pod_b)
        assert to_a.local[1] in on_a
        assert to_b.local[1] in on_b

        with daemon(testbed, d) as second:
            wait_until(
                lambda: not by_backend(flows_to_vip(node), pod_a), 10.0, "the stale flows deleted"
            )
            # Every live backend's flow is the same flow as before: none was deleted.
            assert by_backend(flows_to_vip(node), pod_b) == on_b
            swept = second.events("conntrack.swept")
            assert [e["deleted"] for e in swept] == [len(on_a)]
            # The same source port, now through pod B (an ICMP error of the lost datagrams
            # may still be queued on the socket: it fails one ask).
            moved = [to_a.ask() for _ in range(3)]
            assert {o.pod for o in moved if o.result is Result.ANSWERED} == {"pod-b"}, moved
            assert moved[-1].result is Result.ANSWERED, moved
            assert to_b.ask().pod == "pod-b"
            assert second.stop() == 0
