"""``--service-counters`` without a kernel: what the planner adds, that counting changes no
verdict, that endpoint changes leave the counting elements alone, and the metric's sums."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv6Address, ip_address
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from nlproxy.commands import run
from nlproxy.errors import InvalidNftObject
from nlproxy.nft.ir import (
    Cmp,
    Family,
    Field,
    L4Proto,
    Lookup,
    Operation,
    Rule,
    Ruleset,
    Set,
    Table,
    Verb,
)
from nlproxy.nft.render import render_rule, render_set
from nlproxy.nft.validate import validate
from nlproxy.proxy import naming as n
from nlproxy.proxy.incremental import attach, plan_update
from nlproxy.proxy.planner import plan
from nlproxy.proxy.skeleton import IPV4, add_counting
from nlproxy.serve.metrics import ServiceCounters, service_totals
from tests import world
from tests.unit.builders import NODE, endpoint, eps_slice, node, port, service, snapshot

COUNTING_SETS = (n.SERVICE_COUNTERS, n.NODEPORT_COUNTERS)
COUNTING_CHAINS = (n.COUNTERS_PREROUTING, n.COUNTERS_OUTPUT, n.COUNT_SERVICES)


def _web(*endpoints: str) -> Any:
    svc = service(
        "default",
        "web",
        ["10.96.0.10", "fd00:96::10"],
        [
            port("default", "web", "http", 80, node_port=30080),
            port("default", "web", "dns", 53, "UDP"),
        ],
        external_ips=(ip_address("192.168.60.10"),),
        load_balancer_ips=(ip_address("192.168.70.10"),),
    )
    eps = [endpoint(ip) for ip in endpoints]
    slices = [eps_slice("default", "web", eps, [("http", 80, "TCP"), ("dns", 53, "UDP")])]
    return snapshot([svc], slices if eps else [], node=node())


def _config(on: bool = True) -> Any:
    return world.config(node_name=NODE, service_counters=on)


def test_one_element_per_frontend_whatever_the_endpoints() -> None:
    for eps in ((), ("10.0.0.5",), ("10.0.0.5", "10.0.0.6")):
        p = plan(_web(*eps), _config())
        v4, v6 = p.rulesets[Family.IP], p.rulesets[Family.IP6]
        addrs = ("10.96.0.10", "192.168.60.10", "192.168.70.10")
        assert set(v4.elements[n.SERVICE_COUNTERS]) == {
            (ip_address(a), proto, number) for a in addrs for proto, number in ((6, 80), (17, 53))
        }
        assert set(v6.elements[n.SERVICE_COUNTERS]) == {
            (IPv6Address("fd00:96::10"), 6, 80),
            (IPv6Address("fd00:96::10"), 17, 53),
        }
        for rs in (v4, v6):
            assert set(rs.elements[n.NODEPORT_COUNTERS]) == {(6, 30080)}
            assert all(isinstance(rs.sets[s], Set) and rs.sets[s].counter for s in COUNTING_SETS)  # type: ignore[union-attr]
            assert all(c in rs.chains for c in COUNTING_CHAINS)


def test_off_by_default_adds_nothing() -> None:
    p = plan(_web("10.0.0.5"), _config(on=False))
    for rs in p.rulesets.values():
        assert not set(COUNTING_SETS) & set(rs.sets)
        assert not set(COUNTING_CHAINS) & set(rs.chains)
        assert not any(isinstance(s, Set) and s.counter for s in rs.sets.values())


def test_endpoint_change_does_not_touch_counting_elements() -> None:
    before = _web("10.0.0.5")
    p = plan(before, _config())
    assert attach(p, before)
    old = {s: dict(p.rulesets[Family.IP].elements[s]) for s in COUNTING_SETS}
    for eps in (("10.0.0.5", "10.0.0.6"), ()):
        p, deltas = plan_update(p, _web(*eps), _config())
        assert deltas is not None, "an endpoint change is an in-place update"
        touched = [key for d in deltas.values() for key in d.elements if key[0] in COUNTING_SETS]
        assert touched == []
        assert any(deltas.values()), "the backends changed"
        assert {s: p.rulesets[Family.IP].elements[s] for s in COUNTING_SETS} == old


@pytest.mark.parametrize("case", world.CASES)
def test_counting_changes_no_trace(case: world.Case) -> None:
    on = plan(world.world(), world.config(service_counters=True)).rulesets
    assert case.trace(on) == case.expected


def test_service_totals_sum_frontends_of_both_families() -> None:
    ports = plan(_web("10.0.0.5"), _config()).ports
    http = next(p for p in ports.values() if p.ref.port_name == "http")
    readings: dict[Family, Any] = {
        Family.IP: {
            n.SERVICE_COUNTERS: {
                (IPv4Address("10.96.0.10"), 6, 80): (10, 1000),
                (IPv4Address("192.168.60.10"), 6, 80): (1, 100),
                (IPv4Address("10.99.99.99"), 6, 80): (500, 50000),  # not in the plan: skipped
            },
            n.NODEPORT_COUNTERS: {(6, 30080): (2, 200)},
        },
        Family.IP6: {n.NODEPORT_COUNTERS: {(6, 30080): (3, 300)}},
    }
    totals = service_totals(ports.values(), readings)
    assert totals == {str(http.ref): (16, 1600)}, "dns has no element read: no series"


def test_collector_exposes_both_families_labelled_by_service_port() -> None:
    registry = CollectorRegistry()
    counters = ServiceCounters(registry)
    counters.totals = {"default/web:http/TCP": (16, 1600)}
    text = generate_latest(registry).decode()
    assert "# TYPE nlproxy_service_packets_total counter" in text
    assert 'nlproxy_service_packets_total{service="default/web:http/TCP"} 16.0' in text
    assert 'nlproxy_service_bytes_total{service="default/web:http/TCP"} 1600.0' in text


def test_counting_rules_render_as_nft_lists_them() -> None:
    rs = Ruleset(table=Table(family=Family.IP, name="t"))
    add_counting(rs, IPV4)
    rules = [render_rule(r) for c in COUNTING_CHAINS for r in rs.rules[c]]
    assert rules[:3] == [
        'ct status dnat iif != "lo" jump count-services',
        "ct status dnat jump count-services",
        "meta l4proto tcp ct original ip daddr . meta l4proto . ct original proto-dst "
        "@service-counters return",
    ]
    assert (
        rules[-1]
        == "meta l4proto sctp meta l4proto . ct original proto-dst @nodeport-counters return"
    )
    lines = render_set(rs.sets[n.NODEPORT_COUNTERS], {})
    assert lines == [
        "\tset nodeport-counters {",
        "\t\ttype inet_proto . inet_service",
        "\t\tcounter",
        "\t}",
    ]


def test_validate_rejects_the_other_familys_original_address() -> None:
    rs = Ruleset(table=Table(family=Family.IP, name="t"))
    add_counting(rs, IPV4)
    key = (Field.CT_ORIGINAL_IP6_DADDR, Field.META_L4PROTO, Field.CT_ORIGINAL_PROTO_DST)
    bad = Rule(
        chain=n.COUNT_SERVICES,
        exprs=(Cmp(Field.META_L4PROTO, L4Proto.TCP), Lookup(key, n.SERVICE_COUNTERS)),
    )
    ops = [Operation(Verb.ADD, s) for s in rs.sets.values()]
    ops += [Operation(Verb.ADD, c) for c in rs.chains.values()]
    with pytest.raises(InvalidNftObject, match="ct original ip6 daddr in an ip table"):
        validate(rs.table, [*ops, Operation(Verb.ADD, bad)])
    validate(
        rs.table, [*ops, *(Operation(Verb.ADD, r) for c in COUNTING_CHAINS for r in rs.rules[c])]
    )


def test_run_flag_turns_counting_on() -> None:
    parser = run.argparse.ArgumentParser()
    run.add_arguments(parser)
    on = parser.parse_args(["--node-name", NODE, "--service-counters"])
    assert run.settings(on).proxy.service_counters
    assert not run.settings(parser.parse_args(["--node-name", NODE])).proxy.service_counters
