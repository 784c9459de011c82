"""``nlproxy explain`` against rules programmed by a real ``run --once``, with real packets.

pod-a, pod-b, pod-c are on node1 (where nlproxy runs), pod-r on node2; the client is outside.
What the report says is checked against what traffic actually does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nlproxy.cli import main
from nlproxy.demo.echo import Result, UdpSession
from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import daemon, publish, wait_until
from tests.kernel.topo import PORTS, SLICE_PORTS, answers, apply, ask, results
from tests.netns import sh

testbed = topo.testbed
testbed6 = topo.testbed6

VIP = "10.96.0.10"
LB_IP = "192.168.70.10"
NODE_PORTS = {"tcp": 30080, "udp": 30053}
EXIT_UNREACHABLE = 4
EXIT_USAGE = 2


def _web(tb: Testbed, pods: list[str], **spec: Any) -> list[dict[str, Any]]:
    eps = [topo.endpoint(str(tb.pod(p).ipv4), tb.pod(p).node) for p in pods]
    return [topo.service("web", VIP, PORTS, **spec), topo.endpoint_slice("web", eps, SLICE_PORTS)]


def _explain(capsys: pytest.CaptureFixture[str], netns: str, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(["--netns", netns, "--log-level", "warning", "explain", *args])
    out = capsys.readouterr()
    return status, out.out, out.err


def _json(capsys: pytest.CaptureFixture[str], netns: str, *args: str) -> tuple[int, Any]:
    status, out, err = _explain(capsys, netns, *args, "--json")
    assert out, err
    return status, json.loads(out)


def _inspect_warns(capsys: pytest.CaptureFixture[str], netns: str, *args: str) -> bool:
    """Whether ``nlproxy inspect`` warns about kube-proxy's ``ip kube-proxy`` table."""
    capsys.readouterr()
    main(["--netns", netns, "--log-level", "warning", "inspect", *args])
    err = capsys.readouterr().err
    return "warning: another proxy's rules: table ip kube-proxy (kube-proxy" in err


def _section(text: str, head: str) -> str:
    """The lines of one headed section of the text report."""
    blocks = {b.split("\n", 1)[0]: b.rstrip("\n") for b in text.split("\n\n")}
    assert head in blocks, f"no section {head!r} in:\n{text}"
    return blocks[head]


def test_healthy_service(
    testbed: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    apply(testbed, tmp_path, _web(testbed, ["pod-b", "pod-r"]))
    b, r = (str(testbed.pod(p).ipv4) for p in ("pod-b", "pod-r"))
    node = testbed.node.netns
    status, text, _ = _explain(capsys, node, "default/web")
    assert status == 0, text
    assert "Service default/web" in text
    rules = _section(text, "Rules (programmed)")
    assert f'{VIP} . tcp . 80 comment "default/web:tcp/TCP" : goto cluster-ip-2' in rules
    assert f"{VIP} . udp . 53 . 1 : {r} . 8080" in rules
    assert "chain cluster-ip-2 {" in rules
    assert "numgen random mod 2 map @backends" in rules
    assert "off: the programmed rules carry no counter expressions" in text
    endpoints = _section(text, "Endpoints (inspector)").splitlines()[2:]
    assert [line.split()[:3] for line in endpoints] == [
        [f"{b}:8080", "local", "yes"],
        [f"{r}:8080", "remote", "yes"],
    ]
    assert _section(text, "Verdict") == (
        "Verdict\n  OK: every frontend has endpoints, every endpoint is reachable"
    )

    status, doc = _json(capsys, node, "default/web")
    assert (status, doc["ok"], doc["problems"]) == (0, True, [])
    fronts = {(f["address"], f["port_number"], f["protocol"]): f for f in doc["frontends"]}
    assert set(fronts) == {(VIP, 80, "TCP"), (VIP, 53, "UDP")}
    for f in fronts.values():
        assert (f["state"], f["dispatch"]) == ("dispatch", "cluster-ip-2")
        assert f["endpoints"] == [f"{b}:8080", f"{r}:8080"]
    # What the report says is what traffic does.
    a = testbed.pod("pod-a")
    assert set(answers(ask("tcp", a.netns, VIP, 80))) == {"pod-b", "pod-r"}


def test_no_endpoints_rejects(
    testbed: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    apply(testbed, tmp_path, _web(testbed, []))
    status, text, _ = _explain(
        capsys, testbed.node.netns, "default/web", "--manifests", str(tmp_path)
    )
    assert status == EXIT_UNREACHABLE, text
    assert "web-ipv4  IPv4  ports tcp 8080/TCP, udp 8080/UDP\n    (no endpoints)" in text
    rules = _section(text, "Rules (programmed)")
    assert f'{VIP} . tcp . 80 comment "default/web:tcp/TCP" : goto reject-chain' in rules
    assert "not programmed: no endpoints -> reject (no dispatch element)" in rules
    assert "chain reject-chain {" in rules
    verdict = _section(text, "Verdict")
    assert f"default/web:tcp/TCP {VIP}:80/TCP: not programmed: no endpoints -> reject" in verdict

    status, doc = _json(capsys, testbed.node.netns, "default/web", "--from", "10.244.1.4")
    assert (status, doc["ok"]) == (EXIT_UNREACHABLE, False)
    assert {f["state"] for f in doc["frontends"]} == {"reject"}
    assert {(t["verdict"], t["diagnosis"]) for t in doc["trace"]["results"]} == {
        ("REJECT", "rejected: the service has no endpoints")
    }
    a = testbed.pod("pod-a")
    assert results(ask("tcp", a.netns, VIP, 80, n=1)) == {Result.REFUSED}


def test_unreachable_endpoint(
    testbed: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    apply(testbed, tmp_path, _web(testbed, ["pod-b", "pod-c"]))
    b, c = testbed.pod("pod-b"), testbed.pod("pod-c")
    topo.sh(testbed.node.netns, "ip", "link", "set", "dev", b.host_veth, "down")
    status, text, _ = _explain(capsys, testbed.node.netns, "default/web")
    assert status == EXIT_UNREACHABLE, text
    assert f"PROBLEM: endpoint {b.ipv4}:8080 unreachable: route {b.ipv4} dev {b.host_veth}" in text
    status, doc = _json(capsys, testbed.node.netns, "default/web", "--port", "tcp")
    assert status == EXIT_UNREACHABLE
    reach = {e["endpoint"]: (e["kind"], e["reachable"]) for e in doc["endpoints"]}
    assert reach == {f"{b.ipv4}:8080": ("unreachable", False), f"{c.ipv4}:8080": ("local", True)}
    assert [f["port"] for f in doc["frontends"]] == ["default/web:tcp/TCP"]


def _load_balancer(tb: Testbed, allowed: str) -> list[dict[str, Any]]:
    ports = [{**p, "nodePort": NODE_PORTS[p["name"]]} for p in PORTS]
    eps = [topo.endpoint(str(tb.pod(p).ipv4), tb.pod(p).node) for p in ("pod-b", "pod-c")]
    status = {"loadBalancer": {"ingress": [{"ip": LB_IP}]}}
    svc = topo.service(
        "edge",
        "10.96.0.20",
        ports,
        type="LoadBalancer",
        status=status,
        loadBalancerSourceRanges=[f"{allowed}/32"],
    )
    return [svc, topo.endpoint_slice("edge", eps, SLICE_PORTS)]


def test_trace_load_balancer_source_ranges(
    testbed: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    allowed, denied = (str(a) for a in testbed.client.ipv4)
    apply(testbed, tmp_path, _load_balancer(testbed, allowed))
    node = testbed.node.netns
    b, c = (f"{testbed.pod(p).ipv4}:8080" for p in ("pod-b", "pod-c"))

    status, doc = _json(capsys, node, "default/edge", "--from", allowed)
    assert status == 0, doc["problems"]
    rows = {t["frontend"]: t for t in doc["trace"]["results"]}
    assert set(rows) == {
        "10.96.0.20:80/TCP",
        "10.96.0.20:53/UDP",
        f"{LB_IP}:80/TCP",
        f"{LB_IP}:53/UDP",
        "nodeport:30080/TCP",
        "nodeport:30053/UDP",
    }
    for t in rows.values():
        assert (t["verdict"], t["endpoints"], t["masquerade"], t["ok"]) == (
            "ACCEPT",
            [b, c],
            True,
            True,
        )
    assert rows["nodeport:30080/TCP"]["sent_to"] == str(testbed.node.ipv4)

    status, text, _ = _explain(capsys, node, "default/edge", "--from", denied)
    assert status == EXIT_UNREACHABLE, text
    trace = _section(text, f"Trace from {denied} (programmed rules)")
    why = f"dropped: source {denied} is not in loadBalancerSourceRanges ({allowed}/32)"
    lb_rows = [line for line in trace.splitlines() if line.strip().startswith(LB_IP)]
    assert len(lb_rows) == 2
    assert all(" DROP " in line and line.endswith(why) for line in lb_rows), lb_rows
    assert "firewalled" in _section(text, "Frontends")
    # The kernel agrees: the allowed source gets answers, the denied one is dropped.
    ns = testbed.client.netns
    assert set(answers(ask("tcp", ns, LB_IP, 80, src=allowed, n=4))) <= {"pod-b", "pod-c"}
    assert results(ask("tcp", ns, LB_IP, 80, src=denied, n=1)) == {Result.TIMEOUT}


def test_udp_flow_is_listed(
    testbed: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    apply(testbed, tmp_path, _web(testbed, ["pod-b", "pod-c"]))
    a = testbed.pod("pod-a")
    with UdpSession(a.netns, VIP, 53) as session:
        answered = testbed.pod(session.ask().pod)
        status, doc = _json(capsys, testbed.node.netns, "default/web", "--port", "53")
        _, text, _ = _explain(capsys, testbed.node.netns, "default/web", "--port", "udp")
    assert status == 0, doc["problems"]
    (group,) = doc["conntrack"]
    assert (group["frontend"], group["count"]) == (f"{VIP}:53/UDP", 1)
    flow = group["flows"][0]
    assert (flow["proto"], flow["orig"]["src"], flow["orig"]["dst"]) == ("udp", str(a.ipv4), VIP)
    assert (flow["reply"]["src"], flow["reply"]["sport"]) == (str(answered.ipv4), 8080)
    conntrack = _section(text, "Conntrack")
    assert f"{VIP}:53/UDP  flows: 1" in conntrack
    assert f"-> {VIP}:53  endpoint {answered.ipv4}:8080" in conntrack


def test_usage_errors(testbed: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    apply(testbed, tmp_path, _web(testbed, ["pod-b"]))
    node = testbed.node.netns
    cases = [
        (["web"], "is not NAMESPACE/NAME"),
        (["default/Web"], "is not NAMESPACE/NAME"),
        (["default/nothere"], "service default/nothere: unknown: nothing is programmed"),
        (["default/web", "--from", "10.0.0.300"], "--from: '10.0.0.300' is not an IP"),
        (["default/web", "--port", "8443"], "--port: '8443' is no port of default/web"),
        (["default/web", "--manifests", str(tmp_path / "none")], "is not a directory"),
    ]
    for args, message in cases:
        status, out, err = _explain(capsys, node, *args)
        assert (status, out) == (EXIT_USAGE, ""), args
        assert message in err, (args, err)
    status, _, err = _explain(capsys, node)
    assert status == EXIT_USAGE
    assert "NS/NAME" in err


def test_manifests_without_programmed_rules(
    make_netns: Callable[[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = make_netns("explain")
    headless = topo.service("db", "None", PORTS)
    objs = [topo.service("web", VIP, PORTS), headless]
    topo.write_manifests(tmp_path, objs)
    status, text, _ = _explain(capsys, ns, "default/web", "--manifests", str(tmp_path))
    assert status == EXIT_UNREACHABLE, text
    assert "not programmed at all: no element of the service is in the kernel" in text
    assert f"default/web:tcp/TCP {VIP}:80/TCP: not programmed" in text
    assert "EndpointSlices\n  (none)" in text

    status, doc = _json(capsys, ns, "default/db", "--manifests", str(tmp_path))
    assert status == EXIT_UNREACHABLE
    assert doc["manifests"]["status"] == "skipped"
    assert doc["frontends"] == []
    assert doc["problems"][0] == (
        "Service default/db: skipped: headless, ExternalName or another proxy's Service; "
        "nlproxy does not proxy it"
    )


def test_dual_stack_local_policy_trace(
    testbed6: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tb = testbed6
    ports = [{**p, "nodePort": NODE_PORTS[p["name"]]} for p in PORTS]
    b, r = tb.pod("pod-b"), tb.pod("pod-r")
    objs = [
        topo.service(
            "web",
            [VIP, "fd00:10:96::10"],
            ports,
            type="NodePort",
            externalTrafficPolicy="Local",
        ),
        topo.endpoint_slice(
            "web", [topo.endpoint(str(p.ipv4), p.node) for p in (b, r)], SLICE_PORTS
        ),
        topo.endpoint_slice(
            "web",
            [topo.endpoint(str(p.ipv6), p.node) for p in (b, r)],
            SLICE_PORTS,
            family="IPv6",
        ),
    ]
    apply(tb, tmp_path, objs)
    client = tb.client.ipv6[0]
    status, doc = _json(
        capsys, tb.node.netns, "default/web", "--port", "tcp", "--from", str(client)
    )
    assert status == 0, doc["problems"]
    rows = {t["frontend"]: t for t in doc["trace"]["results"]}
    # eTP=Local: only the local endpoint, the client's source kept; IPv4 rows are not traced.
    assert rows["nodeport6:30080/TCP"]["endpoints"] == [f"[{b.ipv6}]:8080"]
    assert rows["nodeport6:30080/TCP"]["masquerade"] is False
    assert rows["nodeport:30080/TCP"]["verdict"] == "-"
    assert rows["[fd00:10:96::10]:80/TCP"]["endpoints"] == [f"[{b.ipv6}]:8080", f"[{r.ipv6}]:8080"]
    node6 = str(tb.node.ipv6)
    assert rows["nodeport6:30080/TCP"]["sent_to"] == node6
    seen = answers(ask("tcp", tb.client.netns, node6, NODE_PORTS["tcp"], n=4))
    assert seen == {"pod-b": {str(client)}}


PROXY_NAME_LABEL = "service.kubernetes.io/service-proxy-name"


@pytest.mark.parametrize("canary", [True, False], ids=["canary", "no-canary"])
def test_kube_proxys_table_is_beside_a_canary_and_a_problem_otherwise(
    canary: bool, testbed: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A daemon run as a canary (``--service-proxy-name``) says, on its metrics port, which
    tables of kube-proxy's it runs beside: explain shows them as expected, not as a problem.
    Beside a daemon that is no canary, or none, the same table is a problem (exit 4)."""
    node = testbed.node.netns
    sh("nft", "add", "table", "ip", "kube-proxy", ns=node)  # kube-proxy's, nftables mode
    web = _web(testbed, ["pod-b", "pod-r"])
    if canary:  # the Service and its slice labelled for nlproxy, as the canary serves
        for obj in web:
            obj["metadata"].setdefault("labels", {})[PROXY_NAME_LABEL] = "nlproxy"
    manifests = publish(tmp_path / "m", [testbed.node_manifest(), *web])
    flags = ("--service-proxy-name", "nlproxy") if canary else ()
    gauge = "nlproxy_beside_proxy_tables{" if canary else "nlproxy_foreign_proxy_tables{"
    with daemon(testbed, manifests, *flags) as d:

        def reported() -> bool:
            lines = d.get(d.metrics, "/metrics")[1].splitlines()
            return any(ln.startswith(gauge) and 'table="kube-proxy"' in ln for ln in lines)

        wait_until(reported, 10, f"the daemon's {gauge}")
        metrics = ("--metrics-address", f"127.0.0.1:{d.metrics}")
        status, text, _ = _explain(capsys, node, "default/web", *metrics)
        _, doc = _json(capsys, node, "default/web", *metrics)
        inspect_warned = _inspect_warns(capsys, node, *metrics)
    line = "table ip kube-proxy (kube-proxy, nftables mode)"
    # inspect asks the daemon as explain does: no warning beside a canary, one otherwise.
    assert inspect_warned is not canary
    assert _inspect_warns(capsys, node, *metrics)  # no daemon to ask
    if canary:
        assert status == 0, text
        assert _section(text, "Beside (canary)").splitlines()[1:] == [
            "  the service proxy this canary runs beside (expected, left alone):",
            f"    {line}",
        ]
        assert "PROBLEM" not in text
        assert (doc["ok"], doc["problems"], doc["beside_proxy_rules"]) == (True, [], [line])
    else:
        assert status == EXIT_UNREACHABLE, text
        assert "Beside (canary)" not in text
        assert f"  PROBLEM: another proxy's rules: {line}: " in _section(text, "Verdict")
        assert (doc["ok"], doc["beside_proxy_rules"]) == (False, [])
        assert [p.split(": ")[1] for p in doc["problems"]] == [line]
    # No daemon to ask: the table is a problem, whatever a daemon said before.
    status, text, _ = _explain(capsys, node, "default/web", *metrics)
    assert status == EXIT_UNREACHABLE, text
    assert f"  PROBLEM: another proxy's rules: {line}: " in _section(text, "Verdict")
