"""Load-balancing choices with real packets: round-robin and consistent hashing.

pod-a, pod-b, pod-c are on node1 (where nlproxy runs), pod-r on node2; the client routes
everything through node1.
"""

from __future__ import annotations

import itertools
import json
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path
from typing import Any

import pytest

from nlproxy.cli import main
from nlproxy.cluster.model import Protocol
from nlproxy.demo.echo import Result, UdpSession, request
from nlproxy.demo.testbed import Testbed
from nlproxy.nft.ir import Family
from nlproxy.nft.readback import read_ruleset
from nlproxy.proxy.naming import TABLE as TABLE_NAME
from nlproxy.proxy.tracer import trace
from tests.kernel import topo
from tests.kernel.topo import PORTS, SLICE_PORTS, SVC_PORT, apply

testbed = topo.testbed
testbed6 = topo.testbed6

VIP = "10.96.0.30"
NODE_PORTS = {"tcp": 30081, "udp": 30054}
LB = "nlproxy.io/load-balancing"


def _web(
    tb: Testbed, pods: list[str], annotations: dict[str, str], **spec: Any
) -> list[dict[str, Any]]:
    ports = [{**p, "nodePort": NODE_PORTS[p["name"]]} for p in PORTS]
    svc = topo.service("web", VIP, ports, type="NodePort", **spec)
    svc["metadata"]["annotations"] = annotations
    eps = [topo.endpoint(str(tb.pod(p).ipv4), tb.pod(p).node) for p in pods]
    return [svc, topo.endpoint_slice("web", eps, SLICE_PORTS)]


def _pods(ns: str, addr: str, port: int, proto: str, n: int) -> list[str]:
    """The pod that answered each of ``n`` consecutive new connections, in order."""
    out = []
    for _ in range(n):
        o = request(proto, ns, addr, port)
        assert o.result is Result.ANSWERED, str(o)
        out.append(o.pod)
    return out


PODS = ["pod-b", "pod-c", "pod-r"]


@pytest.mark.parametrize("proto", ["tcp", "udp"])
@pytest.mark.parametrize("frontend", ["cluster-ip", "node-port"])
def test_round_robin_reaches_each_pod_once_per_round(
    testbed: Testbed, tmp_path: Path, proto: str, frontend: str
) -> None:
    apply(testbed, tmp_path, _web(testbed, PODS, {LB: "round-robin"}))
    if frontend == "cluster-ip":
        ns, addr, port = testbed.pod("pod-a").netns, VIP, SVC_PORT[proto]
    else:
        ns, addr, port = testbed.client.netns, str(testbed.node.ipv4), NODE_PORTS[proto]
    seen = _pods(ns, addr, port, proto, 4 * len(PODS))
    rounds = [seen[i : i + len(PODS)] for i in range(0, len(seen), len(PODS))]
    assert all(sorted(r) == PODS for r in rounds), rounds
    assert all(r == rounds[0] for r in rounds), f"not in a fixed order: {rounds}"


def test_round_robin_from_the_node_default(testbed: Testbed, tmp_path: Path) -> None:
    """``--load-balancing round-robin`` applies to Services without the annotation."""
    topo.write_manifests(tmp_path, [testbed.node_manifest(), *_web(testbed, PODS, {})])
    assert topo.run_once(testbed, tmp_path, "--load-balancing", "round-robin") == topo.EXIT_OK
    seen = _pods(testbed.pod("pod-a").netns, VIP, 80, "tcp", 2 * len(PODS))
    assert sorted(seen[:3]) == PODS, seen
    assert seen[3:] == seen[:3], seen


def test_round_robin_follows_an_endpoint_change(testbed: Testbed, tmp_path: Path) -> None:
    apply(testbed, tmp_path, _web(testbed, PODS, {LB: "round-robin"}))
    ns = testbed.pod("pod-a").netns
    assert sorted(_pods(ns, VIP, 80, "tcp", 3)) == PODS
    apply(testbed, tmp_path, _web(testbed, ["pod-c", "pod-r"], {LB: "round-robin"}))
    seen = _pods(ns, VIP, 80, "tcp", 4)
    assert sorted(seen[:2]) == ["pod-c", "pod-r"], seen
    assert seen[2:] == seen[:2], seen


# -- consistent hashing ------------------------------------------------------------------------

CLIENTS = [f"192.168.50.{i}" for i in range(10, 34)]
ALL_PODS = ["pod-a", "pod-b", "pod-c", "pod-r"]


def _add_clients(tb: Testbed) -> None:
    for addr in CLIENTS:
        topo.sh(tb.client.netns, "ip", "addr", "add", f"{addr}/24", "dev", "eth0")


def _choices(tb: Testbed, addr: str, port: int) -> dict[str, str]:
    """Client address -> the pod that answered it (two connections each: always the same)."""
    out = {}
    for src in CLIENTS:
        pods = {request("tcp", tb.client.netns, addr, port, src=src).pod for _ in range(2)}
        assert len(pods) == 1, f"{src}: {pods}"
        out[src] = pods.pop()
    return out


def _traced(tb: Testbed, addr: str, port: int) -> dict[str, str]:
    """What the tracer predicts from the ruleset read back from the node's kernel."""
    rs = read_ruleset(Family.IP, TABLE_NAME, netns=tb.node.netns)
    assert rs is not None
    by_ip = {str(tb.pod(p).ipv4): p for p in ALL_PODS}
    local = [tb.node.ipv4, tb.node.gateway_v4, IPv4Address("192.168.50.1")]
    out = {}
    for src in CLIENTS:
        got = trace(rs, IPv4Address(src), Protocol.TCP, IPv4Address(addr), port, local_addrs=local)
        (endpoint,) = got.endpoints
        out[src] = by_ip[endpoint.split(":")[0]]
    return out


def test_consistent_hash_same_client_same_pod_as_traced(testbed: Testbed, tmp_path: Path) -> None:
    """Each client sticks to one pod, the one the kernel's jhash picks as the tracer computes
    it, through the ClusterIP and the node port alike (one table, one hash)."""
    _add_clients(testbed)
    apply(testbed, tmp_path, _web(testbed, ALL_PODS, {LB: "consistent-hash"}))
    via_vip = _choices(testbed, VIP, 80)
    assert len(set(via_vip.values())) > 1, f"24 clients all on one pod: {via_vip}"
    assert via_vip == _traced(testbed, VIP, 80)
    assert _choices(testbed, str(testbed.node.ipv4), NODE_PORTS["tcp"]) == via_vip


def test_consistent_hash_agrees_across_nodes_restarts_and_recreation(
    testbed: Testbed, tmp_path: Path
) -> None:
    """Two nodes with the same Service send every client to the same pod, and so does a node
    after nlproxy restarts and after its table is removed and created again."""
    _add_clients(testbed)
    objs = _web(testbed, ALL_PODS, {LB: "consistent-hash"})
    objs[0]["metadata"]["uid"] = "0b4c6c1e-8f7d-4d6e-9a57-3f1c2f0e5a11"
    apply(testbed, tmp_path, objs)
    first = _choices(testbed, VIP, 80)
    with Testbed(tag="tk2") as other:
        _add_clients(other)
        assert [str(other.pod(p).ipv4) for p in ALL_PODS] == [
            str(testbed.pod(p).ipv4) for p in ALL_PODS
        ]
        apply(other, tmp_path / "other", objs)
        assert _choices(other, VIP, 80) == first
    apply(testbed, tmp_path, objs)  # a restart: the next run reads the table back
    assert _choices(testbed, VIP, 80) == first
    assert main(["--netns", testbed.node.netns, "cleanup"]) == 0
    apply(testbed, tmp_path, objs)  # the table created anew
    assert _choices(testbed, VIP, 80) == first


def test_session_affinity_wins_over_consistent_hash(testbed: Testbed, tmp_path: Path) -> None:
    """With both set, a client stays on the pod affinity gave it, a random one: over many
    clients the pods differ from the hash's choice somewhere."""
    _add_clients(testbed)
    ch = {LB: "consistent-hash"}
    apply(testbed, tmp_path, _web(testbed, ALL_PODS, ch))
    hashed = _choices(testbed, VIP, 80)
    apply(testbed, tmp_path, _web(testbed, ALL_PODS, ch, sessionAffinity="ClientIP"))
    rules = topo.nft_ruleset(testbed)
    assert "jhash" not in rules
    assert "lb-cluster-" not in rules
    sticky = _choices(testbed, VIP, 80)
    assert sticky != hashed


def test_explain_names_the_algorithm_and_the_clients_pod(
    testbed: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``explain`` says how each port chooses, and with ``--from`` which pod that client gets:
    the one it really reaches."""
    _add_clients(testbed)
    apply(testbed, tmp_path, _web(testbed, ALL_PODS, {LB: "consistent-hash"}))
    reached = _choices(testbed, VIP, 80)
    by_pod = {p: f"{testbed.pod(p).ipv4}:8080" for p in ALL_PODS}
    for src in CLIENTS[:4]:
        capsys.readouterr()
        argv = ["--netns", testbed.node.netns, "explain", "default/web", "--port", "tcp"]
        assert main([*argv, "--from", src, "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        algorithms = {fe["load_balancing"] for fe in report["frontends"]}
        assert len(algorithms) == 1
        assert algorithms.pop().startswith("consistent-hash (jhash ip saddr mod 4096 seed 0x")
        traced = {t["frontend"]: t["endpoints"] for t in report["trace"]["results"]}
        assert traced[f"{VIP}:80/TCP"] == [by_pod[reached[src]]], traced
    apply(testbed, tmp_path, _web(testbed, PODS, {LB: "round-robin"}))
    capsys.readouterr()
    assert main(["--netns", testbed.node.netns, "explain", "default/web"]) == 0
    text = capsys.readouterr().out
    assert "default/web:tcp/TCP load balancing: round-robin" in text


@pytest.mark.parametrize("algorithm", ["round-robin", "consistent-hash"])
def test_udp_flow_moves_off_a_removed_endpoint(
    testbed: Testbed, tmp_path: Path, algorithm: str
) -> None:
    """One UDP socket keeps its conntrack entry; removing its endpoint deletes the flow, so the
    socket's next packet is balanced again, to a pod that is still there."""
    a = testbed.pod("pod-a")
    apply(testbed, tmp_path, _web(testbed, PODS, {LB: algorithm}))
    with UdpSession(a.netns, VIP, 53) as session:
        first = session.ask().pod
        rest = [p for p in PODS if p != first]
        apply(testbed, tmp_path, _web(testbed, rest, {LB: algorithm}))
        after = [session.ask() for _ in range(3)]
    assert {o.pod for o in after} <= set(rest), [str(o) for o in after]
    assert all(o.result is Result.ANSWERED for o in after), [str(o) for o in after]


def test_daemon_moves_a_udp_flow_off_a_removed_endpoint(testbed: Testbed, tmp_path: Path) -> None:
    """The daemon's incremental sync: a consistent-hash port loses the endpoint a UDP socket is
    on; the flow is deleted (conntrack_deleted in the sync's log line) and the socket's next
    packets reach a pod that is still there."""
    from tests.kernel.daemon import daemon, publish, wait_until

    a = testbed.pod("pod-a")
    ch = {LB: "consistent-hash"}
    manifests = publish(tmp_path / "m", [testbed.node_manifest(), *_web(testbed, PODS, ch)])
    with daemon(testbed, manifests) as d, UdpSession(a.netns, VIP, 53) as session:
        wait_until(lambda: session.ask().result is Result.ANSWERED, 10, "the service answers")
        first = session.ask().pod
        rest = [p for p in PODS if p != first]
        publish(manifests, [testbed.node_manifest(), *_web(testbed, rest, ch)])
        wait_until(
            lambda: any(e.get("conntrack_deleted") for e in d.events("sync.applied")),
            10,
            "a sync deleted the flow",
        )
        after = [session.ask() for _ in range(3)]
    assert {o.pod for o in after} <= set(rest), [str(o) for o in after]
    assert all(o.result is Result.ANSWERED for o in after), [str(o) for o in after]


def test_consistent_hash_over_ipv6_is_as_traced(testbed6: Testbed, tmp_path: Path) -> None:
    """``jhash ip6 saddr``: 16 bytes, more than one round of the hash; the kernel's choice for
    each of 16 clients is the one the tracer computes."""
    tb = testbed6
    clients = [f"fd00:192:168:50::{i:x}" for i in range(0x10, 0x20)]
    for addr in clients:
        topo.sh(tb.client.netns, "ip", "addr", "add", f"{addr}/64", "dev", "eth0", "nodad")
    vip6 = "fd00:10:96::30"
    svc = topo.service("web", ["10.96.0.30", vip6], PORTS, ipFamilyPolicy="RequireDualStack")
    svc["metadata"]["annotations"] = {LB: "consistent-hash"}
    v6 = [topo.endpoint(str(tb.pod(p).ipv6), tb.pod(p).node) for p in ALL_PODS]
    apply(tb, tmp_path, [svc, topo.endpoint_slice("web", v6, SLICE_PORTS, family="IPv6")])
    rs = read_ruleset(Family.IP6, TABLE_NAME, netns=tb.node.netns)
    assert rs is not None
    by_ip = {str(tb.pod(p).ipv6): p for p in ALL_PODS}
    seen, traced = {}, {}
    for src in clients:
        pods = {request("tcp", tb.client.netns, vip6, 80, src=src).pod for _ in range(2)}
        assert len(pods) == 1, f"{src}: {pods}"
        seen[src] = pods.pop()
        got = trace(rs, IPv6Address(src), Protocol.TCP, IPv6Address(vip6), 80, local_addrs=[])
        (endpoint,) = got.endpoints
        traced[src] = by_ip[endpoint.rsplit(":", 1)[0].strip("[]")]
    assert len(set(seen.values())) > 1, seen
    assert seen == traced


# -- what nlproxy does not take: typos and tables past the budget ------------------------------


@pytest.mark.parametrize(
    "annotations",
    [
        pytest.param({LB: "roundrobin"}, id="unknown-algorithm"),
        pytest.param(
            {LB: "consistent-hash", "nlproxy.io/consistent-hash-key": "source-ip"},
            id="unknown-hash-key",
        ),
    ],
)
def test_a_typo_in_an_annotation_keeps_the_service_up(
    testbed: Testbed,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    annotations: dict[str, str],
) -> None:
    """The API server never validates annotations: the ClusterIP and node port still answer,
    with the default for the misspelt value (the client address alone for a bad hash key),
    and the run names the field."""
    _add_clients(testbed)
    apply(testbed, tmp_path, _web(testbed, ALL_PODS, annotations))
    assert "service.annotation_ignored" in capsys.readouterr().err
    seen = _pods(testbed.pod("pod-a").netns, VIP, 80, "tcp", 8)
    assert set(seen) <= set(ALL_PODS)
    _pods(testbed.client.netns, str(testbed.node.ipv4), NODE_PORTS["tcp"], "tcp", 2)
    if LB in annotations and annotations[LB] == "consistent-hash":
        assert _choices(testbed, VIP, 80) == _traced(testbed, VIP, 80)
    argv = ["--netns", testbed.node.netns, "explain", "default/web", "--manifests", str(tmp_path)]
    main(argv)
    out = capsys.readouterr().out
    (field,) = [k for k in annotations if annotations[k] not in ("consistent-hash",)]
    assert f"PROBLEM: Service default/web: metadata.annotations[{field}]" in out, out
    assert "the default is kept" in out


def _many_ports(tb: Testbed, count: int, annotations: dict[str, str]) -> list[dict[str, Any]]:
    """``web`` with ``count`` TCP ports (80, 81, …), all to the pods' 8080."""
    ports = [
        {"name": f"p{i}", "port": 80 + i, "targetPort": 8080, "protocol": "TCP"}
        for i in range(count)
    ]
    svc = topo.service("web", VIP, ports)
    svc["metadata"]["annotations"] = annotations
    eps = [topo.endpoint(str(tb.pod(p).ipv4), tb.pod(p).node) for p in ALL_PODS]
    slice_ports = [{"name": f"p{i}", "port": 8080, "protocol": "TCP"} for i in range(count)]
    return [svc, topo.endpoint_slice("web", eps, slice_ports)]


def test_a_service_past_the_element_budget_falls_back_to_random(
    testbed: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """5 consistent-hash ports would be 5 tables of 4096 slots, past the budget of 16384
    elements per Service: the Service is programmed with random choice, named in a warning,
    and answers on every port; within the budget (4 ports) it gets its tables."""
    apply(testbed, tmp_path, _many_ports(testbed, 5, {LB: "consistent-hash"}))
    err = capsys.readouterr().err
    assert "service.over_budget" in err
    assert "default/web" in err
    rules = topo.nft_ruleset(testbed)
    assert "jhash" not in rules
    assert "lb-cluster-" not in rules
    ns = testbed.pod("pod-a").netns
    for port in (80, 82, 84):
        assert set(_pods(ns, VIP, port, "tcp", 3)) <= set(ALL_PODS)
    argv = ["--netns", testbed.node.netns, "explain", "default/web", "--manifests", str(tmp_path)]
    main(argv)
    out = capsys.readouterr().out
    assert (
        "load balancing  consistent-hash asked; random: 20480 elements past the service budget"
        in out
    ), out
    assert "load balancing: random" in out
    apply(testbed, tmp_path, _many_ports(testbed, 4, {LB: "consistent-hash"}))
    assert "service.over_budget" not in capsys.readouterr().err
    assert topo.nft_ruleset(testbed).count("jhash") == 4
    assert set(_pods(ns, VIP, 83, "tcp", 3)) <= set(ALL_PODS)


def test_consistent_hash_moves_only_the_clients_of_the_endpoint_that_came_or_went(
    testbed: Testbed, tmp_path: Path
) -> None:
    """2 -> 3 -> 4 pods and back to 3, with real connections from 24 client addresses: each
    step moves only clients to the added pod or off the removed one (whatever the endpoint
    count, powers of two included); the others stay where they were."""
    _add_clients(testbed)
    steps = [["pod-b", "pod-c"], ["pod-a", "pod-b", "pod-c"], ALL_PODS, ["pod-a", "pod-b", "pod-r"]]
    before: dict[str, str] = {}
    for prev, pods in zip([[], *steps], steps, strict=False):
        apply(testbed, tmp_path, _web(testbed, pods, {LB: "consistent-hash"}))
        now = _choices(testbed, VIP, 80)
        assert set(now.values()) <= set(pods)
        if prev:
            moved = {c for c in CLIENTS if now[c] != before[c]}
            came, went = set(pods) - set(prev), set(prev) - set(pods)
            assert all(now[c] in came or before[c] in went for c in moved), (before, now)
            assert len(moved) < len(CLIENTS), "some clients stay"
        before = now


# -- random choice: endpoints keep their slots ------------------------------------------------


def _slots(tb: Testbed) -> list[str]:
    """The pods in the ClusterIP's TCP backends slots, by index, as the node's kernel holds them."""
    rs = read_ruleset(Family.IP, TABLE_NAME, netns=tb.node.netns)
    assert rs is not None
    by_ip = {tb.pod(p).ipv4: p for p in ALL_PODS}
    held = rs.elements.get("backends", {})
    slots = {
        key[3]: by_ip[el.value[0]]
        for key, el in held.items()
        if key[:3] == (IPv4Address(VIP), 6, 80) and isinstance(el.value, tuple)
    }
    assert sorted(slots) == list(range(len(slots))), f"slots not dense: {slots}"
    return [slots[i] for i in range(len(slots))]


def test_random_choice_keeps_slots_and_reaches_only_live_endpoints(
    testbed: Testbed, tmp_path: Path
) -> None:
    """The daemon's incremental syncs keep each remaining endpoint in its backends slot (the
    last one moves into a freed slot), so a change costs a few elements; across removals and
    additions every slot holds a live endpoint once, and new connections reach every live pod
    and no other. A restarted daemon reads the slots back and rewrites nothing."""
    from tests.kernel.daemon import daemon, publish, wait_until

    ns = testbed.client.netns
    steps = [ALL_PODS, ALL_PODS[1:], ["pod-b", "pod-r"], ["pod-a", "pod-b", "pod-r"], ALL_PODS]
    manifests = publish(tmp_path / "m", [testbed.node_manifest(), *_web(testbed, steps[0], {})])
    seen_orders = []
    with daemon(testbed, manifests) as d:
        for live in steps:
            publish(manifests, [testbed.node_manifest(), *_web(testbed, live, {})])
            wait_until(lambda live=live: sorted(_slots(testbed)) == sorted(live), 10, str(live))
            seen_orders.append(_slots(testbed))
            assert set(_pods(ns, VIP, 80, "tcp", 40)) == set(live), live
        assert any(e.get("incremental") for e in d.events("sync.applied")), "synced in place"
        assert d.stop() == 0
    for before, after in itertools.pairwise(seen_orders):
        for i, pod in enumerate(before[: len(after)]):
            assert pod not in after or after[i] == pod, f"{pod} left its slot: {before} {after}"
    # pod-a went from slot 0 and came back: the slots are no longer in sorted order.
    assert seen_orders[-1] != seen_orders[0], seen_orders
    with daemon(testbed, manifests) as d:
        wait_until(lambda: d.events("sync.applied"), 10, "the restarted daemon's first sync")
        assert d.events("sync.applied")[0]["ops"] == 0
        assert _slots(testbed) == seen_orders[-1]
        assert set(_pods(ns, VIP, 80, "tcp", 40)) == set(ALL_PODS)
        publish(manifests, [testbed.node_manifest(), *_web(testbed, ALL_PODS[:2], {})])
        wait_until(lambda: sorted(_slots(testbed)) == ALL_PODS[:2], 10, "pod-c and pod-r go")
        assert set(_pods(ns, VIP, 80, "tcp", 40)) == set(ALL_PODS[:2])
