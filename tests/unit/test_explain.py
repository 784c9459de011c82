"""``nlproxy explain``'s pure halves over planned rulesets: frontends, elements, chains, traces,
diagnoses, manifests facts and rendering. The kernel side is tests/kernel/test_explain.py."""

from __future__ import annotations

import dataclasses
import json
import socket
from ipaddress import ip_address, ip_network
from pathlib import Path

import pytest
import yaml

from nlproxy.cluster.manifests import load_manifests
from nlproxy.cluster.model import ServiceKey
from nlproxy.errors import ConfigError
from nlproxy.inspect.classify import Reachability
from nlproxy.inspect.foreign import ForeignTable, Leftovers
from nlproxy.inspect.ipvs import IpvsLeftovers, VirtualServer
from nlproxy.nft.ir import Family, Ruleset
from nlproxy.operate.explain import EndpointRow, Report, foreign_rules, parse_service_key
from nlproxy.operate.explain_render import render_text, report_to_json, table
from nlproxy.operate.manifests import service_facts, service_frontends
from nlproxy.operate.programmed import (
    FrontendReport,
    element_frontend,
    kernel_frontends,
    service_rules,
)
from nlproxy.operate.trace import trace_frontends
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.planner import plan
from tests.unit.builders import NODE, endpoint, eps_slice, node, port, service, snapshot
from tests.unit.explain_world import LB, LOCAL, planned_rulesets


@pytest.fixture(scope="module")
def rulesets() -> dict[Family, Ruleset]:
    return planned_rulesets()


def _fronts(rs: dict[Family, Ruleset], svc: str) -> dict[str, FrontendReport]:
    return {fe.label: fe for fe in kernel_frontends(rs[Family.IP], svc)}


@pytest.mark.parametrize("text", ["default/web", "kube-system/core-dns.v2"])
def test_service_key(text: str) -> None:
    assert str(parse_service_key(text)) == text


@pytest.mark.parametrize("text", ["web", "a/b/c", "/web", "default/", "Default/Web", "ns/web:80"])
def test_service_key_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="is not NAMESPACE/NAME"):
        parse_service_key(text)


def test_element_frontend_shapes() -> None:
    addr = ip_address("10.96.0.1")
    net = ip_network("10.96.0.1/32")
    assert element_frontend(Family.IP, "backends", (addr, 6, 80, 0)) == (Family.IP, 6, addr, 80)
    assert element_frontend(Family.IP, "firewall-allow", (net, 6, 80, net)) == (
        Family.IP,
        6,
        addr,
        80,
    )
    assert element_frontend(Family.IP, "nodeport-backends", (17, 30053, 1)) == (
        Family.IP,
        17,
        None,
        30053,
    )
    assert element_frontend(Family.IP, "hairpin", (addr, addr)) is None


def test_frontends_of_a_load_balancer(rulesets: dict[Family, Ruleset]) -> None:
    fronts = _fronts(rulesets, "ns/web")
    assert set(fronts) == {
        "172.30.0.10:80/TCP",
        "172.30.0.10:53/UDP",
        f"{LB}:80/TCP",
        f"{LB}:53/UDP",
        "nodeport:30080/TCP",
    }
    cip, lb, np = fronts["172.30.0.10:80/TCP"], fronts[f"{LB}:80/TCP"], fronts["nodeport:30080/TCP"]
    assert (cip.kind, cip.dispatch, cip.no_endpoint) == ("cluster-ip", "cluster-ip-2", None)
    assert (lb.kind, lb.dispatch, lb.allowed) == (
        "load-balancer",
        "external-2",
        (ip_network("203.0.113.0/25"),),
    )
    assert (np.kind, np.dispatch, np.ref) == ("node-port", "nodeport-2", "ns/web:http/TCP")
    assert [str(a) for a, _ in cip.endpoints] == ["10.0.1.4", "10.0.2.4"]
    assert fronts["172.30.0.10:53/UDP"].endpoints[0][1] == 5353


def test_frontends_without_endpoints_reject(rulesets: dict[Family, Ruleset]) -> None:
    (fe,) = kernel_frontends(rulesets[Family.IP], "ns/empty")
    assert (fe.dispatch, fe.no_endpoint, fe.state, fe.endpoints) == (None, "reject", "reject", ())


def test_local_policies_without_local_endpoints_drop(rulesets: dict[Family, Ruleset]) -> None:
    fronts = _fronts(rulesets, "ns/local")
    assert fronts["172.30.0.12:80/TCP"].no_endpoint == "drop"
    lb = fronts["5.5.5.6:80/TCP"]
    assert (lb.dispatch, lb.no_endpoint, lb.local_endpoints) == ("external-local-0", "drop", ())


def test_other_services_and_families_are_not_included(rulesets: dict[Family, Ruleset]) -> None:
    assert kernel_frontends(rulesets[Family.IP], "ns/we") == []
    assert kernel_frontends(rulesets[Family.IP6], "ns/web") == []


def test_rules_of_one_service(rulesets: dict[Family, Ruleset]) -> None:
    fronts = kernel_frontends(rulesets[Family.IP], "ns/web")
    rules = service_rules(rulesets.values(), fronts)
    texts = {(e.set, e.text) for e in rules.elements}
    assert (
        "service-ips",
        '172.30.0.10 . tcp . 80 comment "ns/web:http/TCP" : goto cluster-ip-2',
    ) in texts
    assert ("cluster-ips", "172.30.0.10") in texts
    assert {e.set for e in rules.elements} >= {"firewall-ips", "firewall-allow", "backends"}
    assert not any("172.30.0.11" in t or "ns/empty" in t for _, t in texts)
    names = [c.name for c in rules.chains]
    assert sorted(names) == ["cluster-ip-2", "external-2", "mark-for-masquerade", "nodeport-2"]
    assert rules.counter_rules == 0
    dnat = next(c for c in rules.chains if c.name == "cluster-ip-2").lines
    assert any("numgen random mod 2 map @backends" in line for line in dnat)


def test_rules_of_a_service_without_endpoints(rulesets: dict[Family, Ruleset]) -> None:
    rules = service_rules(rulesets.values(), kernel_frontends(rulesets[Family.IP], "ns/empty"))
    assert [c.name for c in rules.chains] == ["reject-chain"]
    assert {e.set for e in rules.elements} == {"no-endpoint-services", "cluster-ips"}


def _trace(rs: dict[Family, Ruleset], svc: str, src: str) -> dict[str, tuple[str, bool, str]]:
    rows = trace_frontends(rs, kernel_frontends(rs[Family.IP], svc), ip_address(src), LOCAL)
    return {r.frontend.label: (r.verdict, r.ok, r.diagnosis) for r in rows}


def test_trace_allowed_source(rulesets: dict[Family, Ruleset]) -> None:
    rows = _trace(rulesets, "ns/web", "203.0.113.7")
    assert all(ok for _, ok, _ in rows.values()), rows
    assert rows[f"{LB}:80/TCP"][0] == "ACCEPT"


def test_trace_denied_source(rulesets: dict[Family, Ruleset]) -> None:
    rows = _trace(rulesets, "ns/web", "203.0.113.200")
    verdict, ok, why = rows[f"{LB}:80/TCP"]
    assert (verdict, ok) == ("DROP", False)
    assert why == (
        "dropped: source 203.0.113.200 is not in loadBalancerSourceRanges (203.0.113.0/25)"
    )
    # The cluster IP and the node port are not behind the firewall.
    assert rows["172.30.0.10:80/TCP"][:2] == ("ACCEPT", True)
    assert rows["nodeport:30080/TCP"][:2] == ("ACCEPT", True)


def test_trace_no_endpoints(rulesets: dict[Family, Ruleset]) -> None:
    assert _trace(rulesets, "ns/empty", "10.0.1.9") == {
        "172.30.0.11:80/TCP": ("REJECT", False, "rejected: the service has no endpoints")
    }


def test_trace_local_policies(rulesets: dict[Family, Ruleset]) -> None:
    rows = _trace(rulesets, "ns/local", "198.51.100.1")
    assert rows["5.5.5.6:80/TCP"] == (
        "DROP",
        False,
        "dropped: externalTrafficPolicy Local and no local endpoints on this node",
    )
    assert rows["nodeport:30081/TCP"][2].startswith("dropped: externalTrafficPolicy Local")
    assert rows["172.30.0.12:80/TCP"][2] == (
        "dropped: internalTrafficPolicy Local and no local endpoints on this node"
    )


def test_trace_unallocated_cluster_ip(rulesets: dict[Family, Ruleset]) -> None:
    svc = service("ns", "gone", "172.30.0.99")
    fronts = service_frontends(svc)
    (row,) = trace_frontends(rulesets, fronts, ip_address("10.0.1.9"), LOCAL)
    assert (row.verdict, row.ok) == ("DROP", False)
    assert "172.30.0.99 is in the service range but unallocated" in row.diagnosis


def test_trace_other_family_is_not_counted(rulesets: dict[Family, Ruleset]) -> None:
    fronts = kernel_frontends(rulesets[Family.IP], "ns/web")
    rows = trace_frontends(rulesets, fronts, ip_address("fd00::1"), LOCAL)
    assert {(r.verdict, r.ok) for r in rows} == {("-", True)}


def _write(directory: Path, objects: list[dict[str, object]]) -> Path:
    for i, obj in enumerate(objects):
        (directory / f"{i:02d}.yaml").write_text(yaml.safe_dump(obj))
    return directory


def _svc(name: str, **spec: object) -> dict[str, object]:
    body = {"clusterIP": "10.96.0.5", "ports": [{"name": "http", "port": 80}], **spec}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": body,
    }


def _slice(name: str, service_name: str, eps: list[dict[str, object]]) -> dict[str, object]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "labels": {"kubernetes.io/service-name": service_name},
        },
        "addressType": "IPv4",
        "endpoints": eps,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }


def test_facts_of_a_valid_service(tmp_path: Path) -> None:
    eps = [{"addresses": ["10.244.1.4"], "nodeName": "node1", "conditions": {"ready": True}}]
    _write(tmp_path, [_svc("web"), _slice("web-abc", "web", eps), _slice("other-x", "other", [])])
    facts = service_facts(load_manifests(tmp_path), ServiceKey(namespace="ns", name="web"))
    assert facts.status == "valid"
    assert dict(facts.fields)["cluster IPs"] == "10.96.0.5"
    assert [s.name for s in facts.slices] == ["web-abc"]
    assert facts.slices[0].endpoints == ("10.244.1.4  ready,serving  node node1",)
    assert [(f.kind, f.label) for f in facts.frontends] == [("cluster-ip", "10.96.0.5:80/TCP")]
    assert facts.problems == ()


def test_facts_of_a_headless_service(tmp_path: Path) -> None:
    _write(tmp_path, [_svc("db", clusterIP="None")])
    facts = service_facts(load_manifests(tmp_path), ServiceKey(namespace="ns", name="db"))
    assert facts.status == "skipped"
    assert facts.frontends == ()
    assert facts.problems == (
        "Service ns/db: skipped: headless, ExternalName or another proxy's Service; "
        "nlproxy does not proxy it",
    )


def test_facts_name_invalid_objects(tmp_path: Path) -> None:
    bad_slice = _slice("web-bad", "web", [{"addresses": ["not-an-ip"]}])
    _write(tmp_path, [_svc("web", ports=[{"name": "http", "port": 70000}]), bad_slice])
    facts = service_facts(load_manifests(tmp_path), ServiceKey(namespace="ns", name="web"))
    assert facts.status == "invalid"
    assert len(facts.problems) == 2
    assert facts.problems[0].startswith("Service ns/web: spec.ports[0].port: ")
    assert facts.problems[1].startswith("EndpointSlice ns/web-bad: endpoints[0].addresses[0]")
    assert facts.slices[0].status == "invalid"


def test_facts_of_an_absent_service(tmp_path: Path) -> None:
    _write(tmp_path, [_svc("web")])
    facts = service_facts(load_manifests(tmp_path), ServiceKey(namespace="ns", name="nope"))
    assert (facts.status, facts.frontends, facts.problems) == ("absent", (), ())


def test_table_aligns_columns() -> None:
    assert table([("A", "BB", "C"), ("long", "x", "tail")]) == ["  A     BB  C", "  long  x   tail"]


def _report(rs: dict[Family, Ruleset], src: str | None) -> Report:
    fronts = kernel_frontends(rs[Family.IP], "ns/web")
    rules = service_rules(rs.values(), fronts)
    reach = Reachability(
        kind="unreachable", reachable=False, device=None, gateway=None, state="-", reason="no route"
    )
    row = EndpointRow(frontends=("x",), address=ip_address("10.0.2.4"), port=8080, reach=reach)
    source = ip_address(src) if src else None
    traces = trace_frontends(rs, fronts, source, LOCAL) if source else []
    return Report(
        service=ServiceKey(namespace="ns", name="web"),
        source="kernel",
        facts=None,
        rules=rules,
        flows=(),
        endpoints=(row,),
        src=source,
        traces=tuple(traces),
        problems=("endpoint 10.0.2.4:8080 unreachable: no route",),
    )


def test_render_text_sections(rulesets: dict[Family, Ruleset]) -> None:
    text = render_text(_report(rulesets, "203.0.113.200"))
    heads = [line for line in text.splitlines() if line and not line.startswith(" ")]
    assert heads == [
        "Service ns/web",
        "Frontends",
        "Rules (programmed)",
        "Counters",
        "Conntrack",
        "Endpoints (inspector)",
        "Trace from 203.0.113.200 (programmed rules)",
        "Verdict",
    ]
    assert "off: the programmed rules carry no counter expressions" in text
    assert "  PROBLEM: endpoint 10.0.2.4:8080 unreachable: no route" in text
    assert "not in loadBalancerSourceRanges" in text


def test_render_json_is_one_object(rulesets: dict[Family, Ruleset]) -> None:
    doc = json.loads(json.dumps(report_to_json(_report(rulesets, None))))
    assert doc["ok"] is False
    assert doc["trace"] is None
    assert doc["counters"] == {"enabled": False, "rules": 0}
    assert doc["endpoints"][0] == {
        "endpoint": "10.0.2.4:8080",
        "frontends": ["x"],
        "kind": "unreachable",
        "reachable": False,
        "reason": "no route",
    }
    kinds = {f["kind"] for f in doc["frontends"]}
    assert kinds == {"cluster-ip", "load-balancer", "node-port"}
    assert doc["rules"]["programmed"] is True


@pytest.mark.parametrize("node_port", [None, 30080], ids=["clusterip", "node-port"])
def test_affinity_endpoints_come_from_the_service_chains(node_port: int | None) -> None:
    ports = [port("ns", "sticky", node_port=node_port)]
    svc = service("ns", "sticky", "172.30.0.20", ports, affinity_timeout=600)
    sl = eps_slice("ns", "sticky", [endpoint("10.0.1.4", NODE), endpoint("10.0.2.4")])
    config = ProxyConfig(node_name=NODE, cluster_cidrs=(ip_network("10.0.0.0/8"),))
    rs = plan(snapshot([svc], [sl], node=node(["192.168.0.2"])), config).rulesets
    fronts = list(kernel_frontends(rs[Family.IP], "ns/sticky"))
    assert len(fronts) == (2 if node_port else 1)
    for fe in fronts:
        assert fe.dispatch is not None
        assert fe.dispatch.startswith("external-" if fe.kind == "node-port" else "service-")
        assert fe.algorithm == "ClientIP affinity (a new client: random)"
        assert [f"{a}:{p}" for a, p in fe.endpoints] == ["10.0.1.4:80", "10.0.2.4:80"]
    shown = service_rules(rs.values(), fronts)
    names = sorted(c.name.split("-")[0] for c in shown.chains)
    # The port's chains (one more for external traffic), the chain that learns its clients,
    # and the one that chooses a new client's endpoint through the shared ``dnat-2`` chains.
    assert names == sorted(
        ["dnat", "learn", "mark", "new", "service"] + ["external", "nodeport"] * bool(node_port)
    )
    assert any(line.set == "affinity-addresses" for line in shown.elements)
    assert not [c for c in rs[Family.IP].chains if c.startswith("endpoint-")]


def test_facts_name_a_refused_external_ip(tmp_path: Path) -> None:
    _write(
        tmp_path,
        [_svc("dns"), _svc("thief", clusterIP="10.96.0.6", externalIPs=["10.96.0.5", "127.0.0.1"])],
    )
    facts = service_facts(load_manifests(tmp_path), ServiceKey(namespace="ns", name="thief"))
    assert facts.problems == (
        "Service ns/thief: spec.externalIPs: 10.96.0.5 is the ClusterIP of Service ns/dns; "
        "10.96.0.5 left out",
        "Service ns/thief: spec.externalIPs: 127.0.0.1 is a loopback address; 127.0.0.1 left out",
    )
    other = service_facts(load_manifests(tmp_path), ServiceKey(namespace="ns", name="dns"))
    assert other.problems == ()


KUBE_PROXY = Leftovers(
    tables=(
        ForeignTable(family="ip", table="kube-proxy", mode="nftables", chains=()),
        ForeignTable(family="ip6", table="nat", mode="iptables-nft", chains=("KUBE-SERVICES",)),
    ),
    ipvs=IpvsLeftovers(ipsets=("KUBE-CLUSTER-IP",)),
)


def test_another_proxys_rules_are_problems_unless_the_daemon_runs_beside_them() -> None:
    problems, expected = foreign_rules(KUBE_PROXY)
    assert expected == []
    assert [p.split(": ")[1] for p in problems] == [
        "table ip kube-proxy (kube-proxy, nftables mode)",
        "1 KUBE-* chains in table ip6 nat (kube-proxy, iptables-nft)",
        "1 KUBE-* ipsets (kube-proxy, IPVS)",
    ]
    assert all(p.startswith("another proxy's rules: ") for p in problems)
    # A canary's daemon names the tables it runs beside: those are expected, the rest are not.
    problems, expected = foreign_rules(KUBE_PROXY, frozenset({"ip kube-proxy"}))
    assert expected == ["table ip kube-proxy (kube-proxy, nftables mode)"]
    assert [p.split(": ")[1] for p in problems] == [
        "1 KUBE-* chains in table ip6 nat (kube-proxy, iptables-nft)",
        "1 KUBE-* ipsets (kube-proxy, IPVS)",
    ]


def test_a_canary_beside_a_proxy_in_ipvs_mode_expects_its_ipvs_state_too() -> None:
    """IPVS mode writes KUBE-* chains in iptables-nft as well as its virtual servers, ipsets
    and device: beside those chains, the IPVS state is the same proxy's, not a problem."""
    ipvs = IpvsLeftovers(
        virtual_servers=(
            VirtualServer(
                family=socket.AF_INET,
                protocol=socket.IPPROTO_TCP,
                address=ip_address("10.96.0.1"),
                port=443,
            ),
        ),
        ipsets=("KUBE-CLUSTER-IP",),
    )
    found = Leftovers(
        tables=(ForeignTable(family="ip", table="nat", mode="iptables-nft", chains=("KUBE-SVC",)),),
        ipvs=ipvs,
    )
    problems, expected = foreign_rules(found, frozenset({"ip nat"}))
    assert problems == []
    assert expected == [
        "1 KUBE-* chains in table ip nat (kube-proxy, iptables-nft)",
        "1 IPVS virtual servers (kube-proxy, IPVS)",
        "1 KUBE-* ipsets (kube-proxy, IPVS)",
    ]
    # Not a canary (the daemon runs beside nothing): every one is a problem.
    problems, expected = foreign_rules(found)
    assert (len(problems), expected) == (3, [])


def test_the_proxy_a_canary_runs_beside_is_shown_apart_from_the_verdict(
    rulesets: dict[Family, Ruleset],
) -> None:
    beside = ("table ip kube-proxy (kube-proxy, nftables mode)",)
    report = dataclasses.replace(_report(rulesets, None), problems=(), beside=beside)
    text = render_text(report)
    heads = [line for line in text.splitlines() if line and not line.startswith(" ")]
    assert heads[-2:] == ["Beside (canary)", "Verdict"]
    section = text.split("Beside (canary)\n", 1)[1].split("\n\n", 1)[0]
    assert section.splitlines() == [
        "  the service proxy this canary runs beside (expected, left alone):",
        "    table ip kube-proxy (kube-proxy, nftables mode)",
    ]
    assert "PROBLEM" not in text
    assert "  OK: every frontend has endpoints, every endpoint is reachable" in text
    doc = report_to_json(report)
    assert doc["beside_proxy_rules"] == list(beside)
    assert doc["ok"] is True
    # No canary: no such section, and the JSON says so with an empty list.
    plain = _report(rulesets, None)
    assert "Beside (canary)" not in render_text(plain)
    assert report_to_json(plain)["beside_proxy_rules"] == []
