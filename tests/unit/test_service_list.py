"""``nlproxy services``' pure half over planned rulesets: every service's frontends read back
once, policies inferred from the shape or taken from the Services, backend conditions from the
slices, and the table and JSON. The kernel side is tests/kernel/test_services.py."""

from __future__ import annotations

from ipaddress import ip_address

import pytest

from nlproxy.inspect.classify import Reachability
from nlproxy.nft.ir import Family, IPAddress, Ruleset
from nlproxy.operate.programmed import kernel_frontends
from nlproxy.operate.services import (
    ServiceRow,
    build_rows,
    join_frontends,
    manifests_index,
    render_table,
    row_json,
)
from tests.unit.builders import NODE, endpoint, eps_slice, port, service
from tests.unit.explain_world import LB, planned_rulesets


@pytest.fixture(scope="module")
def rulesets() -> dict[Family, Ruleset]:
    return planned_rulesets()


def _reach(addr: IPAddress) -> Reachability:
    local = str(addr).startswith("10.0.1.")
    return Reachability(
        kind="local" if local else "remote",
        reachable=str(addr) != "10.0.2.5",
        device="veth0" if local else "eth0",
        gateway=None,
        state="up",
        reason="no route" if str(addr) == "10.0.2.5" else "ok",
    )


def _rows(rulesets: dict[Family, Ruleset], **kw: object) -> dict[str, ServiceRow]:
    fronts = kernel_frontends(rulesets[Family.IP])
    addrs = {a for fe in fronts for a, _ in (*fe.endpoints, *fe.local_endpoints)}
    rows = build_rows(fronts, rulesets, {a: _reach(a) for a in addrs}, **kw)  # type: ignore[arg-type]
    return {f"{r.frontend.ref} {r.frontend.label}": r for r in rows}


def test_every_service_is_read_back_in_one_call(rulesets: dict[Family, Ruleset]) -> None:
    fronts = kernel_frontends(rulesets[Family.IP])
    per_service = [
        fe
        for svc in ("ns/web", "ns/empty", "ns/local")
        for fe in kernel_frontends(rulesets[Family.IP], svc)
    ]
    assert len(fronts) == len(per_service) == 9  # web 5, empty 1, local 3
    assert {fe.key: fe for fe in fronts} == {fe.key: fe for fe in per_service}


def test_policies_the_kernel_tells(rulesets: dict[Family, Ruleset]) -> None:
    rows = _rows(rulesets)
    lb = rows[f"ns/web:http/TCP {LB}:80/TCP"]
    assert (lb.external_policy, lb.internal_policy, lb.affinity) == ("Cluster", None, "None")
    local_np = rows["ns/local:p80/TCP nodeport:30081/TCP"]
    assert local_np.external_policy == "Local"
    assert local_np.backends == ()  # its only endpoint is on another node
    assert [str(a) for a, _ in local_np.cluster_backends] == ["10.0.2.5"]
    local_cip = rows["ns/local:p80/TCP 172.30.0.12:80/TCP"]
    assert (local_cip.internal_policy, local_cip.frontend.state) == ("Local", "drop")
    web = rows["ns/web:http/TCP 172.30.0.10:80/TCP"]
    assert web.internal_policy is None  # Cluster and Local look alike while both have endpoints
    assert [(str(b.address), b.state, b.reach and b.reach.kind) for b in web.backends] == [
        ("10.0.1.4", "in use", "local"),
        ("10.0.2.4", "in use", "remote"),
    ]


def test_manifests_give_conditions_and_policies(rulesets: dict[Family, Ruleset]) -> None:
    p = port
    manifests = manifests_index(
        [
            service("ns", "web", "172.30.0.10", [p("ns", "web", "http", 80, node_port=30080)]),
            eps_slice(
                "ns",
                "web",
                [
                    endpoint("10.0.1.4", NODE),
                    endpoint("10.0.2.4"),
                    endpoint("10.0.1.9", NODE, ready=False, serving=True, terminating=True),
                    endpoint("10.0.1.8", NODE, ready=False, serving=False),
                ],
                [("http", 8080, "TCP"), ("dns", 5353, "UDP")],
            ),
            service("ns", "local", "172.30.0.12", internal_policy_local=False),
        ]
    )
    rows = _rows(rulesets, manifests=manifests)
    web = rows["ns/web:http/TCP 172.30.0.10:80/TCP"]
    assert web.internal_policy == "Cluster"
    assert [(str(b.address), b.state, b.programmed) for b in web.backends] == [
        ("10.0.1.4", "ready", True),
        ("10.0.2.4", "ready", True),
        ("10.0.1.8", "not-ready", False),
        ("10.0.1.9", "serving,terminating", False),
    ]
    dns = rows["ns/web:dns/UDP 172.30.0.10:53/UDP"]
    assert {b.port for b in dns.backends} == {5353}  # the slice port of the same name
    # The Service says so, whatever the shape suggests.
    assert rows["ns/local:p80/TCP 172.30.0.12:80/TCP"].internal_policy == "Cluster"


def test_table_and_json(rulesets: dict[Family, Ruleset]) -> None:
    rows = _rows(rulesets)
    ordered = sorted(rows.values(), key=lambda r: (r.frontend.ref, r.frontend.label))
    text = render_table(ordered).splitlines()
    assert text[0].split() == ["FRONTEND", "TYPE", "SERVICE", "PORT", "POLICY", "BACKENDS"]
    empty = next(line for line in text if "ns/empty" in line)
    assert empty.endswith("(no backends: reject)")
    lb = text.index(next(line for line in text if line.startswith(f"{LB}:80/TCP")))
    assert "LoadBalancer" in text[lb]
    assert "sourceRanges=203.0.113.0/25" in text[lb]
    assert text[lb].endswith("1 => 10.0.1.4:8080 (in use, local, reachable)")
    assert text[lb + 1].strip() == "2 => 10.0.2.4:8080 (in use, remote, reachable)"
    local = next(line for line in text if line.startswith("nodeport:30081/TCP"))
    assert local.endswith("(no backends: drop)")
    doc = row_json(rows["ns/web:http/TCP 172.30.0.10:80/TCP"])
    assert doc["frontend"] == "172.30.0.10:80/TCP"
    assert doc["type"] == "ClusterIP"
    assert doc["backends"] == [
        {
            "address": "10.0.1.4",
            "port": 8080,
            "state": "in use",
            "programmed": True,
            "node": None,
            "where": "local",
            "reachable": True,
            "reason": "ok",
        },
        {
            "address": "10.0.2.4",
            "port": 8080,
            "state": "in use",
            "programmed": True,
            "node": None,
            "where": "remote",
            "reachable": True,
            "reason": "ok",
        },
    ]
    assert ip_address(str(doc["address"])) == ip_address("172.30.0.10")


def test_join_names_kinds_and_adds_what_is_not_programmed(rulesets: dict[Family, Ruleset]) -> None:
    p = port
    manifests = manifests_index(
        [
            service(
                "ns",
                "web",
                "172.30.0.10",
                [p("ns", "web", "http", 80, node_port=30080), p("ns", "web", "dns", 53, "UDP")],
                load_balancer_ips=[LB],
            ),
            service("ns", "new", "172.30.0.99", external_ips=["192.0.2.9"]),
        ]
    )
    programmed = kernel_frontends(rulesets[Family.IP])
    joined = {(fe.ref, fe.label): fe for fe in join_frontends(programmed, manifests)}
    assert len(joined) == len(programmed) + 2
    assert joined[("ns/new:p80/TCP", "192.0.2.9:80/TCP")].kind == "external-ip"
    assert not joined[("ns/new:p80/TCP", "172.30.0.99:80/TCP")].programmed
    assert joined[("ns/web:http/TCP", f"{LB}:80/TCP")].kind == "load-balancer"
    only = join_frontends(kernel_frontends(rulesets[Family.IP], "ns/web"), manifests, "ns/web")
    assert {fe.ref.partition(":")[0] for fe in only} == {"ns/web"}
    rows = build_rows([joined[("ns/new:p80/TCP", "192.0.2.9:80/TCP")]], rulesets, {}, manifests)
    assert render_table(rows).splitlines()[1].endswith("(no backends: not programmed)")


def test_local_policy_with_affinity_lists_its_local_backends() -> None:
    """externalTrafficPolicy: Local plus ClientIP affinity: outside traffic goes to the local
    pod through the port's own ``local-…`` chain, which services/explain must read (they said
    "no backends" while traffic flowed)."""
    from ipaddress import ip_network

    from nlproxy.proxy.config import ProxyConfig
    from nlproxy.proxy.planner import plan
    from tests.unit.builders import node, snapshot

    svc = service(
        "ns", "sticky", "172.30.0.20", [port("ns", "sticky", node_port=30090)],
        load_balancer_ips=["5.5.5.7"], external_policy_local=True, affinity_timeout=600,
    )  # fmt: skip
    sl = eps_slice("ns", "sticky", [endpoint("10.0.1.7", NODE), endpoint("10.0.2.7")])
    config = ProxyConfig(
        node_name=NODE,
        cluster_cidrs=(ip_network("10.0.0.0/8"),),
        service_cidrs=(ip_network("172.30.0.0/16"),),
    )
    rs = plan(snapshot([svc], [sl], node=node(["192.168.0.2"])), config).rulesets
    for manifests in (None, manifests_index([svc, sl])):
        rows = _rows(rs, manifests=manifests)
        for label in ("5.5.5.7:80/TCP", "nodeport:30090/TCP"):
            row = rows[f"ns/sticky:p80/TCP {label}"]
            assert (row.external_policy, row.affinity) == ("Local", "ClientIP")
            assert [str(b.address) for b in row.backends if b.programmed] == ["10.0.1.7"]
            assert "no backends" not in render_table([row])
