"""The test bed itself, with plain routing (no nlproxy rules): real packets, real namespaces."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from ipaddress import ip_address
from pathlib import Path

import pytest

from nlproxy.demo import ns as testbed_ns
from nlproxy.demo.echo import Result, UdpSession, request, tcp_request, udp_request
from nlproxy.demo.testbed import Testbed
from nlproxy.netlink.netns import NETNS_RUN_DIR
from tests import netns
from tests.kernel import topo

testbed = topo.testbed
testbed6 = topo.testbed6


def _exists(name: str) -> bool:
    return os.path.exists(os.path.join(NETNS_RUN_DIR, name))


def _all_namespaces(tb: Testbed) -> list[str]:
    return [tb.node.netns, tb.node2.netns, tb.client.netns, *(p.netns for p in tb.pods.values())]


@pytest.mark.parametrize("proto", ["tcp", "udp"])
@pytest.mark.parametrize("pod", ["pod-a", "pod-c", "pod-r"])
def test_client_reaches_pod_by_pod_ip_unchanged(testbed: Testbed, proto: str, pod: str) -> None:
    """client → node1 (→ node2) → pod: routed, no NAT: the pod sees the client's address."""
    out = request(proto, testbed.client.netns, str(testbed.pod(pod).ipv4), 8080)
    assert out.result is Result.ANSWERED, out
    assert out.pod == pod
    assert out.src == testbed.client.ipv4[0]


def test_client_second_address(testbed: Testbed) -> None:
    alt = str(testbed.client.ipv4[1])
    out = tcp_request(testbed.client.netns, str(testbed.pod("pod-b").ipv4), 8080, src=alt)
    assert (out.pod, out.src) == ("pod-b", ip_address(alt))


def test_pod_to_remote_pod_and_node_to_pod(testbed: Testbed) -> None:
    a, r = testbed.pod("pod-a"), testbed.pod("pod-r")
    out = udp_request(a.netns, str(r.ipv4), 8080)
    assert (out.pod, out.src) == ("pod-r", a.ipv4)
    out = tcp_request(testbed.node.netns, str(a.ipv4), 8080)
    # The node reaches its pods from the veth's address, the pods' gateway.
    assert (out.pod, out.src) == ("pod-a", testbed.node.gateway_v4)


def test_kindnet_routes_on_the_node(testbed: Testbed) -> None:
    routes = topo_sh(testbed.node.netns, "ip", "route")
    for pod in testbed.local_pods:
        assert f"{pod.ipv4} dev {pod.host_veth} proto static scope host" in routes
    assert f"10.244.2.0/24 via {testbed.node2.ipv4} dev eth0" in routes
    forward = topo_sh(testbed.node.netns, "sysctl", "-n", "net.ipv4.ip_forward")
    assert forward.strip() == "1"


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_closed_port_is_refused(testbed: Testbed, proto: str) -> None:
    out = request(proto, testbed.client.netns, str(testbed.pod("pod-a").ipv4), 9)
    assert out.result is Result.REFUSED, out


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_unreachable_route_is_reported(testbed: Testbed, proto: str) -> None:
    topo_sh(testbed.node.netns, "ip", "route", "add", "unreachable", "10.99.0.0/16")
    out = request(proto, testbed.client.netns, "10.99.1.1", 80)
    assert out.result is Result.UNREACHABLE, out


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_silently_dropped_is_a_timeout(testbed: Testbed, proto: str) -> None:
    # Nothing has 10.244.1.99: node1 sends it to its default gateway, the client, which does
    # not forward, so it vanishes.
    out = request(proto, testbed.client.netns, "10.244.1.99", 8080, timeout=0.5)
    assert out.result is Result.TIMEOUT, out


def test_udp_session_keeps_its_source_port(testbed: Testbed) -> None:
    pod = testbed.pod("pod-b")
    with UdpSession(testbed.client.netns, str(pod.ipv4), 8080) as session:
        answers = [session.ask() for _ in range(3)]
        local_port = session.local[1]
    assert {(a.pod, a.src, a.sport) for a in answers} == {
        ("pod-b", testbed.client.ipv4[0], local_port)
    }


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_ipv6_client_to_pods(testbed6: Testbed, proto: str) -> None:
    tb = testbed6
    for pod in tb.pods.values():
        assert pod.ipv6 is not None
        out = request(proto, tb.client.netns, str(pod.ipv6), 8080)
        assert (out.pod, out.src) == (pod.name, tb.client.ipv6[0]), out
    alt = str(tb.client.ipv6[1])
    out = request(proto, tb.client.netns, str(tb.pod("pod-r").ipv6), 8080, src=alt)
    assert (out.pod, out.src) == ("pod-r", ip_address(alt))
    a, r = tb.pod("pod-a"), tb.pod("pod-r")
    out = request(proto, a.netns, str(r.ipv6), 8080)
    assert (out.pod, out.src) == ("pod-r", a.ipv6)


def test_node_manifest_describes_node1(testbed6: Testbed) -> None:
    node = testbed6.node_manifest()
    assert node["metadata"]["name"] == testbed6.node.name
    assert node["spec"]["podCIDRs"] == ["10.244.1.0/24", "fd00:10:244:1::/64"]
    internal = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
    assert internal == [str(testbed6.node.ipv4), str(testbed6.node.ipv6)]


def test_close_stops_servers_and_deletes_namespaces() -> None:
    tb = Testbed(tag="tkc").start()
    try:
        names = _all_namespaces(tb)
        assert all(_exists(n) for n in names)
        assert len(set(names)) == len(names)
        pod_ns = tb.pod("pod-a").netns
        pids = [int(p) for p in topo_sh(None, "ip", "netns", "pids", pod_ns).split()]
        assert pids, "the echo server of pod-a runs in its namespace"
    finally:
        tb.close()
    assert not any(_exists(n) for n in names)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_exception_inside_with_cleans_up() -> None:
    names: list[str] = []

    def build_and_fail() -> None:
        with Testbed(tag="tke", remote_pods=()) as tb:
            names.extend(_all_namespaces(tb))
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        build_and_fail()
    assert names
    assert not any(_exists(n) for n in names)


def test_two_testbeds_side_by_side() -> None:
    with Testbed(tag="tk2") as one, Testbed(tag="tk2") as two:
        assert not set(_all_namespaces(one)) & set(_all_namespaces(two))
        for tb in (one, two):
            out = tcp_request(tb.client.netns, str(tb.pod("pod-a").ipv4), 8080)
            assert out.pod == "pod-a"


_CHILD = textwrap.dedent(
    """
    import sys, time
    from nlproxy.demo.testbed import Testbed
    with Testbed(tag="tks", remote_pods=()) as tb:
        names = [tb.node.netns, tb.node2.netns, tb.client.netns]
        names += [p.netns for p in tb.pods.values()]
        print(" ".join(names), flush=True)
        time.sleep(60)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_interrupted_process_cleans_up(sig: signal.Signals) -> None:
    try:
        _interrupt_and_check(sig)
    finally:  # what a child that failed to clean up left (it is dead by now)
        testbed_ns.sweep_stale("tks")


def _interrupt_and_check(sig: signal.Signals) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", _CHILD],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
        preexec_fn=netns.default_sigint,
    ) as proc:
        try:
            assert proc.stdout is not None
            names = proc.stdout.readline().split()
            assert names, "the child did not build its test bed"
            assert all(_exists(n) for n in names)
            proc.send_signal(sig)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert not any(_exists(n) for n in names)


def test_sweep_stale_removes_only_dead_owners() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = testbed_ns.create(f"nlp-tkw-{dead.pid}-0-node1")
    live = testbed_ns.create(testbed_ns.unique_name("tkw", "node1"))
    try:
        assert testbed_ns.sweep_stale("tkw") == [stale]
        assert not _exists(stale)
        assert _exists(live)
    finally:
        testbed_ns.delete(stale)
        testbed_ns.delete(live)


def topo_sh(ns: str | None, *cmd: str) -> str:
    full = ["ip", "netns", "exec", ns, *cmd] if ns else list(cmd)
    return subprocess.run(full, capture_output=True, text=True, check=True).stdout


def test_failed_build_names_the_object_and_leaves_nothing() -> None:
    before = set(os.listdir(NETNS_RUN_DIR))
    with pytest.raises(testbed_ns.TestbedError, match=r"^pod twin: name used twice$"):
        Testbed(tag="tkf", local_pods=("twin",), remote_pods=("twin",)).start()
    leftover = {n for n in set(os.listdir(NETNS_RUN_DIR)) - before if "-tkf-" in n}
    assert not leftover
