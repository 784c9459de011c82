"""``--service-counters`` on the real kernel: real TCP and UDP through a ClusterIP, an external IP
and a NodePort are counted once per packet, both directions, per frontend element.

Counts are read from outside with ``nft -j list set`` (and compared with ``read_counters``). A
UDP request is one datagram each way, so its frontend must count exactly 2 packets: that also
shows nothing is counted twice, loopback included (output, then prerouting on ``lo``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from ipaddress import ip_address
from pathlib import Path
from typing import Any

import pytest

from nlproxy.cli import main
from nlproxy.demo.echo import EchoServer, Result, request
from nlproxy.demo.testbed import Testbed
from nlproxy.nft.counters import read_counters
from nlproxy.nft.ir import Family
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.naming import TABLE as TABLE_NAME
from nlproxy.proxy.skeleton import counter_sets
from nlproxy.sync.kernel import real as real_kernel
from nlproxy.sync.syncer import Syncer
from tests.kernel import topo
from tests.kernel.topo import PORTS, SLICE_PORTS, answers, ask, nft_ruleset, run_once
from tests.unit.builders import NODE, endpoint, eps_slice, node, port, service, snapshot

testbed = topo.testbed

VIP, IDLE_VIP = "10.96.0.30", "10.96.0.31"
EXTERNAL_IP = "192.168.60.30"
NODE_PORTS = {"tcp": 30080, "udp": 30053}
SVC_PORT = {"tcp": 80, "udp": 53}
N = 4  # requests per frontend and protocol
HELLO = len(b"hello\n")  # what a client sends


def _objects(tb: Testbed, pods: list[str]) -> list[dict[str, Any]]:
    ports = [{**p, "nodePort": NODE_PORTS[p["name"]]} for p in PORTS]
    eps = [topo.endpoint(str(tb.pod(p).ipv4), tb.pod(p).node) for p in pods]
    idle_eps = [topo.endpoint(str(tb.pod("pod-c").ipv4), tb.pod("pod-c").node)]
    return [
        tb.node_manifest(),
        topo.service("edge", VIP, ports, type="NodePort", externalIPs=[EXTERNAL_IP]),
        topo.endpoint_slice("edge", eps, SLICE_PORTS),
        topo.service("idle", IDLE_VIP, PORTS),
        topo.endpoint_slice("idle", idle_eps, SLICE_PORTS),
    ]


def _apply(tb: Testbed, directory: Path, objects: list[dict[str, Any]], *flags: str) -> None:
    topo.write_manifests(directory, objects)
    status = run_once(tb, directory, *flags)
    assert status == topo.EXIT_OK, f"run --once exited {status}\n{nft_ruleset(tb)}"


def _nft_counts(ns: str, set_name: str) -> dict[tuple[Any, ...], tuple[int, int]]:
    """Key -> (packets, bytes) of a counter set, as ``nft -j`` lists it."""
    doc = json.loads(topo.sh(ns, "nft", "-j", "list", "set", "ip", TABLE_NAME, set_name))
    out = {}
    for item in doc["nftables"]:
        for el in item.get("set", {}).get("elem", []):
            val, counter = el["elem"]["val"]["concat"], el["elem"]["counter"]
            out[tuple(val)] = (counter["packets"], counter["bytes"])
    return out


def _all_counts(ns: str) -> dict[tuple[Any, ...], tuple[int, int]]:
    return {**_nft_counts(ns, "service-counters"), **_nft_counts(ns, "nodeport-counters")}


def _frontend_keys(tb: Testbed, proto: str) -> dict[str, tuple[Any, ...]]:
    return {
        "cluster-ip": (VIP, proto, SVC_PORT[proto]),
        "external-ip": (EXTERNAL_IP, proto, SVC_PORT[proto]),
        "node-port": (proto, NODE_PORTS[proto]),
    }


def _send(tb: Testbed, proto: str) -> None:
    """N requests to each frontend: the ClusterIP from pod-a, the others from the client."""
    a = tb.pod("pod-a")
    node_ip = str(tb.node.ipv4)
    answers(ask(proto, a.netns, VIP, SVC_PORT[proto], n=N))
    answers(ask(proto, tb.client.netns, EXTERNAL_IP, SVC_PORT[proto], n=N))
    answers(ask(proto, tb.client.netns, node_ip, NODE_PORTS[proto], n=N))


def test_counts_each_frontend_once_per_packet(testbed: Testbed, tmp_path: Path) -> None:
    _apply(testbed, tmp_path, _objects(testbed, ["pod-b"]), "--service-counters")
    ns = testbed.node.netns
    before = _all_counts(ns)
    assert set(before.values()) == {(0, 0)}
    idle = [k for k in before if k[0] == IDLE_VIP]
    assert len(idle) == 2
    for proto in ("tcp", "udp"):
        _send(testbed, proto)
    after = _all_counts(ns)
    for kind, key in _frontend_keys(testbed, "udp").items():
        packets, octets = after[key]
        # One datagram each way per request; each IP packet is at least 28 header bytes.
        assert packets == 2 * N, f"{kind} {key}: {after[key]}"
        assert octets >= N * (2 * 28 + HELLO), f"{kind} {key}: {after[key]}"
    for kind, key in _frontend_keys(testbed, "tcp").items():
        packets, octets = after[key]
        # At least SYN, ACK, data from the client and SYN-ACK, data from the endpoint.
        assert packets >= 5 * N, f"{kind} {key}: {after[key]}"
        assert octets >= N * (5 * 40 + HELLO), f"{kind} {key}: {after[key]}"
    assert all(after[k] == (0, 0) for k in idle), "another service's counters stay at zero"
    read = read_counters(Family.IP, TABLE_NAME, counter_sets(Family.IP), netns=ns)
    mine = {
        (str(k[0]), {6: "tcp", 17: "udp"}[k[1]], k[2]): v
        for k, v in read["service-counters"].items()
    }
    assert mine == _nft_counts(ns, "service-counters")


def test_endpoint_change_keeps_counts_and_toggling_converges(
    testbed: Testbed, tmp_path: Path
) -> None:
    _apply(testbed, tmp_path, _objects(testbed, ["pod-b"]), "--service-counters")
    _send(testbed, "udp")
    counted = _all_counts(testbed.node.netns)
    assert counted[(VIP, "udp", 53)] == (2 * N, counted[(VIP, "udp", 53)][1])
    _apply(testbed, tmp_path, _objects(testbed, ["pod-b", "pod-c"]), "--service-counters")
    assert _all_counts(testbed.node.netns) == counted, "endpoint churn left the counters alone"
    seen = answers(ask("udp", testbed.pod("pod-a").netns, VIP, 53, n=topo.REQUESTS))
    assert set(seen) == {"pod-b", "pod-c"}

    _apply(testbed, tmp_path, _objects(testbed, ["pod-b", "pod-c"]))
    text = nft_ruleset(testbed)
    for name in ("service-counters", "nodeport-counters", "counters-prerouting", "count-services"):
        assert name not in text, f"{name} left behind with counting off"
    _apply(testbed, tmp_path, _objects(testbed, ["pod-b", "pod-c"]), "--service-counters")
    again = _all_counts(testbed.node.netns)
    assert set(again) == set(counted)
    assert set(again.values()) == {(0, 0)}


def test_loopback_traffic_is_counted_once(testbed: Testbed, tmp_path: Path) -> None:
    """The node reaches a ClusterIP whose endpoint is the node itself: every packet crosses
    output and then prerouting on ``lo``, and must still count once."""
    node_ip = str(testbed.node.ipv4)
    host = EchoServer(testbed.node.netns, "host", [8081])
    host.start()
    try:
        ports = [{"name": "udp", "port": 53, "targetPort": 8081, "protocol": "UDP"}]
        slice_ports = [{"name": "udp", "port": 8081, "protocol": "UDP"}]
        objs = [
            testbed.node_manifest(),
            topo.service("self", VIP, ports),
            topo.endpoint_slice("self", [topo.endpoint(node_ip, testbed.node.name)], slice_ports),
        ]
        _apply(testbed, tmp_path, objs, "--service-counters")
        outcomes = [request("udp", testbed.node.netns, VIP, 53) for _ in range(N)]
        assert {o.result for o in outcomes} == {Result.ANSWERED}, outcomes
    finally:
        host.stop()
    packets, _ = _nft_counts(testbed.node.netns, "service-counters")[(VIP, "udp", 53)]
    assert packets == 2 * N


def test_unchanged_resync_sends_nothing(make_netns: Callable[[str], str]) -> None:
    ns = make_netns("sc")
    svc = service(
        "default",
        "web",
        ["10.96.0.10", "fd00:96::10"],
        [
            port("default", "web", "http", 80, node_port=30080),
            port("default", "web", "dns", 53, "UDP"),
        ],
        external_ips=(ip_address("192.168.60.10"),),
    )
    eps = eps_slice(
        "default", "web", [endpoint("10.0.0.5")], [("http", 80, "TCP"), ("dns", 53, "UDP")]
    )
    snap = snapshot([svc], [eps], node=node())
    syncer = Syncer(ProxyConfig(node_name=NODE, service_counters=True), real_kernel(ns))
    try:
        first = syncer.sync(snap)
        assert first.total_ops > 0
        assert syncer.sync(snap).total_ops == 0
        syncer.verify()  # the cache now comes from the kernel's read-back
        assert syncer.sync(snap).total_ops == 0
    finally:
        syncer.close()
    counts = {
        fam: read_counters(fam, TABLE_NAME, counter_sets(fam), netns=ns)
        for fam in (Family.IP, Family.IP6)
    }
    assert set(counts[Family.IP]["service-counters"]) == {
        (ip_address(a), p, n)
        for a in ("10.96.0.10", "192.168.60.10")
        for p, n in ((6, 80), (17, 53))
    }
    assert set(counts[Family.IP6]["nodeport-counters"]) == {(6, 30080)}


def test_explain_shows_the_counts(
    testbed: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node_ns = testbed.node.netns
    _apply(testbed, tmp_path, _objects(testbed, ["pod-b"]))
    capsys.readouterr()
    main(["--netns", node_ns, "--log-level", "warning", "explain", "default/edge", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert "service" not in doc["counters"], "counting is off"
    _apply(testbed, tmp_path, _objects(testbed, ["pod-b"]), "--service-counters")
    _send(testbed, "udp")
    main(["--netns", node_ns, "--log-level", "warning", "explain", "default/edge", "--json"])
    doc = json.loads(capsys.readouterr().out)
    udp = {c["frontend"]: c["packets"] for c in doc["counters"]["service"] if "UDP" in c["port"]}
    assert udp == {
        f"{VIP}:53/UDP": 2 * N,
        f"{EXTERNAL_IP}:53/UDP": 2 * N,
        "nodeport:30053/UDP": 2 * N,
    }
    main(["--netns", node_ns, "--log-level", "warning", "explain", "default/edge"])
    text = capsys.readouterr().out
    assert "service counters (both directions" in text
    assert f"{VIP}:53/UDP" in text.split("Counters")[1].split("Conntrack")[0]


def test_rules_prints_the_counts_as_nft_does(
    testbed: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node_ns = testbed.node.netns
    _apply(testbed, tmp_path, _objects(testbed, ["pod-b"]), "--service-counters")
    _send(testbed, "udp")
    capsys.readouterr()
    assert main(["--netns", node_ns, "rules", "--family", "ip"]) == 0
    key = f"{VIP} . udp . 53 counter"

    def element(text: str) -> str:
        (line,) = [line for line in text.splitlines() if key in line]
        return line[line.index(key) :].rstrip(",} ")

    ours = element(capsys.readouterr().out)
    assert ours.startswith(f"{key} packets {2 * N} bytes ")
    nft = topo.sh(node_ns, "nft", "list", "set", "ip", TABLE_NAME, "service-counters")
    assert ours == element(nft)
