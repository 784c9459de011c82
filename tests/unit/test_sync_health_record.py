"""The health-check record (``sync/health.py``) on the fakes: each Local Service's health-check
node port and local endpoint count, in the IPv4 table beside the restart record, written only
when it changes, and what keeps a kept Service's port answering across a restart while its
file does not parse (``keep.py``)."""

from __future__ import annotations

import dataclasses

import pytest

from nlproxy.cluster.model import ClusterSnapshot, Service, ServiceKey
from nlproxy.conntrack.fake import FakeConntrack
from nlproxy.nft.fake import FakeNftables
from nlproxy.nft.ir import Chain, Family, Rule, Ruleset, Table
from nlproxy.nft.reconcile import stamp
from nlproxy.proxy import naming as n
from nlproxy.serve.healthcheck import HealthCheck
from nlproxy.sync.fingerprint import NFT_COMMENT_MAX, RECORD_COMMENT_MAX, take_record
from nlproxy.sync.health import HEALTH_CHAIN, comment, health_ops, parse, take_health
from nlproxy.sync.kernel import SyncKernel
from nlproxy.sync.syncer import Syncer
from tests.unit.builders import NODE, endpoint, eps_slice, node, port, service, snapshot
from tests.unit.incremental import CONFIG


def make(nft: FakeNftables, *, record: bool = True) -> Syncer:
    kernel = SyncKernel(tables=nft.open, readback=nft, flows=FakeConntrack())
    return Syncer(CONFIG, kernel, record=record)


def local(name: str, cip: str, hc: int, node_port: int, ns: str = "default") -> Service:
    return service(
        ns,
        name,
        cip,
        ports=[port(ns, name, node_port=node_port)],
        load_balancer_ips=["198.51.100.7"],
        external_policy_local=True,
        health_check_node_port=hc,
    )


def cluster(
    unread: tuple[str, ...] = (), **services: tuple[Service, tuple[str, ...]]
) -> ClusterSnapshot:
    slices = [
        eps_slice("default", name, [endpoint(ip, node=NODE) for ip in ips])
        for name, (_, ips) in services.items()
    ]
    snap = snapshot([svc for svc, _ in services.values()], slices, node=node())
    return dataclasses.replace(snap, unread=unread)


LB = (local("lb", "10.96.0.30", 31500, 30500), ("10.1.0.1", "10.1.0.2"))
OTHER = (service("default", "other", "10.96.0.31"), ("10.1.0.3",))


def recorded(nft: FakeNftables) -> dict[int, HealthCheck] | None:
    return take_health(nft.dump(Family.IP))


def check(name: str, count: int) -> HealthCheck:
    return HealthCheck(ServiceKey(namespace="default", name=name), count)


def test_a_comment_reads_back_as_written() -> None:
    hc = HealthCheck(ServiceKey(namespace="kube-system", name="ingress"), 3)
    assert comment(31000, hc) == "hc 31000 3 kube-system/ingress"
    assert parse(comment(31000, hc)) == (31000, hc)
    assert parse(stamp(Rule(chain=HEALTH_CHAIN, exprs=(), comment=comment(31000, hc))).comment) == (
        31000,
        hc,
    )
    assert parse("nlproxy d=x g=1") is None


def test_the_longest_names_are_cut_to_what_nft_reads_back() -> None:
    """A namespace and a name of 63 characters each do not fit with the port and the count:
    the name is cut, the port and the count are whole, and the rule as programmed (its
    fingerprint after the comment) stays within what ``nft -f`` accepts."""
    key = ServiceKey(namespace="n" * 63, name="s" * 63)
    hc = HealthCheck(key, 123456789)
    text = comment(65535, hc)
    assert len(text) <= RECORD_COMMENT_MAX
    assert len(stamp(Rule(chain=HEALTH_CHAIN, exprs=(), comment=text)).comment) <= NFT_COMMENT_MAX
    got = parse(text)
    assert got is not None
    port_, back = got
    assert (port_, back.local_endpoints, back.service.namespace) == (65535, 123456789, "n" * 63)
    assert 0 < len(back.service.name) < 63
    assert ("s" * 63).startswith(back.service.name)


def test_a_read_back_gives_the_record_and_loses_its_chain() -> None:
    rs = Ruleset(table=Table(family=Family.IP, name=n.TABLE))
    checks = {31000: check("a", 2), 30999: check("b", 0)}
    for op in health_ops(checks):
        if isinstance(op.obj, Chain):
            rs.add_chain(op.obj)
        elif isinstance(op.obj, Rule):
            rs.rules.setdefault(HEALTH_CHAIN, []).append(op.obj)
    keep = dataclasses.replace(rs, chains=dict(rs.chains), rules=dict(rs.rules))
    assert take_health(rs) == checks
    assert HEALTH_CHAIN not in rs.chains
    assert HEALTH_CHAIN not in rs.rules
    assert take_health(rs) is None
    take_record(keep)  # the restart record's taker drops it too: never a drift
    assert HEALTH_CHAIN not in keep.chains


@pytest.mark.parametrize("trusted", [True, False], ids=["by-record", "by-read-back"])
def test_an_unchanged_health_check_set_sends_nothing(trusted: bool) -> None:
    nft = FakeNftables(n.TABLE)
    first = make(nft)
    result = first.sync(cluster(lb=LB, other=OTHER))
    assert result.health_checks == {31500: check("lb", 2)}
    assert recorded(nft) == {31500: check("lb", 2)}

    # A change that leaves the health checks as they are does not write the record.
    moved = (OTHER[0], ("10.1.0.4",))
    first.sync(cluster(lb=LB, other=moved))
    assert HEALTH_CHAIN not in str(nft.batches[-1])

    batches = len(nft.batches)
    second = make(nft)
    if not trusted:
        second.verify()  # the tables read back, the record with them
    again = second.sync(cluster(lb=LB, other=moved))
    assert again.total_ops == 0
    assert again.restarted is trusted
    assert len(nft.batches) == batches, "nothing sent"
    assert again.health_checks == {31500: check("lb", 2)}

    # One local endpoint fewer: the record follows in the same batch.
    second.sync(cluster(lb=(LB[0], ("10.1.0.1",)), other=moved))
    assert recorded(nft) == {31500: check("lb", 1)}
    assert len(nft.batches) == batches + 2  # the IPv4 batch with it, the IPv6 one


def test_no_record_without_restart_records() -> None:
    nft = FakeNftables(n.TABLE)
    make(nft, record=False).sync(cluster(lb=LB))
    assert recorded(nft) is None


def test_a_kept_service_keeps_its_health_check_while_its_file_is_unread() -> None:
    nft = FakeNftables(n.TABLE)
    make(nft).sync(cluster(lb=LB, other=OTHER))

    # Restarted while lb's file does not parse: its health check is kept from the record.
    second = make(nft)
    result = second.sync(cluster(("lb.yaml",), other=OTHER))
    assert second.keeper.kept == {"default/lb"}
    assert result.health_checks == {31500: check("lb", 2)}
    assert recorded(nft) == {31500: check("lb", 2)}
    # Other changes meanwhile keep it too, and so does another restart, still unread.
    changed = second.sync(cluster(("lb.yaml",), other=(OTHER[0], ("10.1.0.4",))))
    assert changed.health_checks == {31500: check("lb", 2)}
    third = make(nft)
    assert third.sync(cluster(("lb.yaml",), other=OTHER)).health_checks == {31500: check("lb", 2)}

    # The file parses again with one local endpoint: the plan's entry replaces the kept one.
    fixed = third.sync(cluster(lb=(LB[0], ("10.1.0.2",)), other=OTHER))
    assert fixed.health_checks == {31500: check("lb", 1)}
    assert recorded(nft) == {31500: check("lb", 1)}


def test_a_service_gone_from_the_fixed_file_loses_its_port() -> None:
    nft = FakeNftables(n.TABLE)
    make(nft).sync(cluster(lb=LB, other=OTHER))
    second = make(nft)
    assert second.sync(cluster(("lb.yaml",), other=OTHER)).health_checks == {31500: check("lb", 2)}
    gone = second.sync(cluster(other=OTHER))
    assert gone.health_checks == {}
    assert recorded(nft) == {}


def test_a_port_the_plan_gives_another_service_is_the_plans() -> None:
    nft = FakeNftables(n.TABLE)
    make(nft).sync(cluster(lb=LB, other=OTHER))
    taker = (local("taker", "10.96.0.32", 31500, 30501), ("10.1.0.5",))
    second = make(nft)
    result = second.sync(cluster(("lb.yaml",), other=OTHER, taker=taker))
    assert result.health_checks == {31500: check("taker", 1)}


def test_a_cut_name_of_a_known_service_is_not_kept() -> None:
    """A record's name cut to fit is that of the Service whose name cut alike: once seen, it
    is the plan's, not kept."""
    ns, long = "n" * 63, "x" * 63
    nft = FakeNftables(n.TABLE)
    svc = local(long, "10.96.0.30", 31500, 30500, ns=ns)
    eps = eps_slice(ns, long, [endpoint("10.1.0.1", node=NODE)])
    make(nft).sync(snapshot([svc], [eps], node=node()))
    held = recorded(nft)
    assert held is not None
    assert held[31500].service != svc.key  # cut
    second = make(nft)
    # Read again, now without a health-check port (another file is unread): not kept.
    plain = local(long, "10.96.0.30", 31500, 30500, ns=ns)
    plain = service(ns, long, "10.96.0.30", ports=plain.ports, load_balancer_ips=["198.51.100.7"])
    unread = dataclasses.replace(snapshot([plain], [eps], node=node()), unread=("x.yaml",))
    assert second.sync(unread).health_checks == {}
    # Never seen since the start: kept, under its cut name.
    third = make(nft)
    make(nft).sync(snapshot([svc], [eps], node=node()))
    kept = third.sync(dataclasses.replace(snapshot([], node=node()), unread=("x.yaml",)))
    assert kept.health_checks == {31500: held[31500]}
