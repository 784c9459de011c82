"""Services claiming one frontend, and external addresses no Service may take (``claims.py``).

Through ``ClusterState``, as the sources feed it: the older Service keeps a frontend, the younger
is named and left out (whole, for a ClusterIP or NodePort; the address, for an external IP), and
when the older goes the younger gets it back. Kept incrementally: any order of changes ends where
a fresh state with the final objects starts.
"""

from __future__ import annotations

import ipaddress
import random
from ipaddress import IPv4Network, ip_network

import pytest

from nlproxy.cluster.claims import Claims
from nlproxy.cluster.model import Delete, ObjectRef, Service, ServiceCIDR, ServiceKey, Upsert
from nlproxy.cluster.state import ClusterState
from tests.unit.builders import port, service

OLD, NEW = "2024-01-01T00:00:00Z", "2025-06-01T00:00:00Z"


def ref(svc: Service) -> ObjectRef:
    return ObjectRef(kind="Service", namespace=svc.key.namespace, name=svc.key.name)


def up(svc: Service) -> Upsert:
    return Upsert(ref=ref(svc), obj=svc)


def gone(svc: Service) -> Delete:
    return Delete(ref=ref(svc))


def test_duplicate_cluster_ip_the_younger_is_left_out_until_the_older_goes() -> None:
    a = service("a", "web", "10.96.0.10", created=OLD)
    b = service("b", "copy", "10.96.0.10", created=NEW)
    state = ClusterState("n1")
    state.apply([up(b), up(a)])  # arrival order does not matter; age does
    assert set(state.snapshot().services) == {a.key}
    assert state.refused == [
        "Service b/copy: ClusterIP 10.96.0.10 is also Service a/web's (older); left out"
    ]
    changed = state.apply([gone(a)])
    assert changed == {a.key, b.key}  # b is planned again: it has the address now
    assert set(state.snapshot().services) == {b.key}
    assert state.refused == []


def test_duplicate_node_port_and_protocol() -> None:
    a = service("a", "x", "10.96.0.1", [port("a", "x", node_port=30080)], created=OLD)
    b = service("a", "y", "10.96.0.2", [port("a", "y", node_port=30080)], created=NEW)
    udp = service("a", "z", "10.96.0.3", [port("a", "z", protocol="UDP", node_port=30080)])
    state = ClusterState("n1")
    state.apply([up(a), up(b), up(udp)])
    assert set(state.snapshot().services) == {a.key, udp.key}
    assert state.refused == [
        "Service a/y: nodePort 30080/TCP is also Service a/x's (older); left out"
    ]


def test_external_ip_that_is_another_services_cluster_ip_is_refused_whatever_the_age() -> None:
    victim = service("kube-system", "dns", "10.96.0.10", created=NEW)
    thief = service("evil", "x", "10.96.0.99", external_ips=["10.96.0.10"], created=OLD)
    state = ClusterState("n1")
    state.apply([up(thief), up(victim)])
    snap = state.snapshot()
    assert snap.services[thief.key].external_ips == ()
    assert snap.services[thief.key].cluster_ips == thief.cluster_ips  # the rest is programmed
    assert state.refused == [
        "Service evil/x: spec.externalIPs: 10.96.0.10 is the ClusterIP of Service "
        "kube-system/dns; 10.96.0.10 left out"
    ]
    # The ClusterIP's Service goes: the address is free to take.
    state.apply([gone(victim)])
    assert state.snapshot().services[thief.key].external_ips == thief.external_ips


def test_one_external_ip_and_port_older_keeps_it_other_ports_and_addresses_stay() -> None:
    a = service("a", "one", "10.96.0.1", external_ips=["203.0.113.5"], created=OLD)
    b = service("b", "two", "10.96.0.2", external_ips=["203.0.113.5", "203.0.113.6"], created=NEW)
    other_port = service(
        "c", "three", "10.96.0.3", [port("c", "three", "p443", 443)], external_ips=["203.0.113.5"]
    )
    state = ClusterState("n1")
    state.apply([up(a), up(b), up(other_port)])
    services = state.snapshot().services
    assert services[b.key].external_ips == (b.external_ips[1],)
    assert services[other_port.key].external_ips == other_port.external_ips
    assert state.refused == [
        "Service b/two: spec.externalIPs: 203.0.113.5 port 80/TCP is also Service a/one's "
        "(older); 203.0.113.5 left out"
    ]


@pytest.mark.parametrize(
    ("ip", "what"),
    [
        ("127.0.0.1", "a loopback address"),
        ("::1", "a loopback address"),
        ("0.0.0.0", "an unspecified address"),
        ("169.254.169.254", "a link-local address"),
        ("fe80::1", "a link-local address"),
        ("224.0.0.251", "a multicast address"),
        ("ff02::1", "a multicast address"),
        ("255.255.255.255", "the broadcast address"),
    ],
)
def test_special_addresses_are_refused(ip: str, what: str) -> None:
    ext = service("a", "ext", "10.96.0.1", external_ips=[ip, "203.0.113.9"])
    lb = service("a", "lb", "10.96.0.2", load_balancer_ips=[ip])
    state = ClusterState("n1")
    state.apply([up(ext), up(lb)])
    services = state.snapshot().services
    assert [str(i) for i in services[ext.key].external_ips] == ["203.0.113.9"]
    assert services[lb.key].load_balancer_ips == ()
    assert state.refused == [
        f"Service a/ext: spec.externalIPs: {ip} is {what}; {ip} left out",
        f"Service a/lb: status.loadBalancer.ingress: {ip} is {what}; {ip} left out",
    ]


@pytest.mark.parametrize(
    ("ips", "field", "what"),
    [
        (["127.0.0.1"], "spec.clusterIP", "a loopback address"),
        (["0.0.0.0"], "spec.clusterIP", "an unspecified address"),
        (["169.254.169.254"], "spec.clusterIP", "a link-local address"),
        (["224.0.0.251"], "spec.clusterIP", "a multicast address"),
        (["255.255.255.255"], "spec.clusterIP", "the broadcast address"),
        (["10.96.0.3", "::1"], "spec.clusterIPs[1]", "a loopback address"),
        (["10.96.0.3", "fe80::1"], "spec.clusterIPs[1]", "a link-local address"),
    ],
)
def test_special_cluster_ips_leave_the_service_out(ips: list[str], field: str, what: str) -> None:
    """As for external IPs: a ClusterIP of 127.0.0.1 would take the node's own listeners."""
    svc = service("a", "web", ips)
    state = ClusterState("n1")
    state.apply([up(svc), up(service("a", "ok", "10.96.0.4"))])
    assert set(state.snapshot().services) == {ServiceKey(namespace="a", name="ok")}
    assert state.refused == [f"Service a/web: {field}: {ips[-1]} is {what}; left out"]


@pytest.mark.parametrize(
    ("first", "second", "holder"),
    [
        # Not a timestamp: after every real one (it sorted first as text).
        ("0", "2024-05-01T10:00:00Z", "b/copy"),
        ("yesterday", "2024-05-01T10:00:00Z", "b/copy"),
        # The same instant written two ways: equal ages, the namespace decides.
        ("2024-05-01T11:00:00+01:00", "2024-05-01T10:00:00Z", "a/web"),
        ("2024-05-01T10:00:00.000000Z", "2024-05-01T10:00:00Z", "a/web"),
        # An earlier instant wins, whatever its text sorts as.
        ("2024-05-01T10:30:00+01:00", "2024-05-01T10:00:00Z", "a/web"),
        ("2024-05-01T10:00:00Z", "2024-05-01T09:30:00-01:00", "a/web"),
    ],
)
def test_ages_are_instants_and_odd_timestamps_count_as_none(
    first: str, second: str, holder: str
) -> None:
    a = service("a", "web", "10.96.0.10", created=first)
    b = service("b", "copy", "10.96.0.10", created=second)
    state = ClusterState("n1")
    state.apply([up(a), up(b)])
    (kept,) = state.snapshot().services
    assert str(kept) == holder


def test_external_ip_cidrs_restrict_external_ips_only() -> None:
    ext = service("a", "ext", "10.96.0.1", external_ips=["203.0.113.9", "198.51.100.7"])
    lb = service("a", "lb", "10.96.0.2", load_balancer_ips=["198.51.100.8"])
    state = ClusterState("n1", external_ip_cidrs=[ip_network("203.0.113.0/24")])
    state.apply([up(ext), up(lb)])
    services = state.snapshot().services
    assert [str(i) for i in services[ext.key].external_ips] == ["203.0.113.9"]
    assert services[lb.key].load_balancer_ips == lb.load_balancer_ips
    assert state.refused == [
        "Service a/ext: spec.externalIPs: 198.51.100.7 is outside --external-ip-cidrs; "
        "198.51.100.7 left out"
    ]


def _random_service(rng: random.Random, i: int) -> Service:
    node_port = rng.choice([None, 30001, 30002])
    return service(
        "ns",
        f"s{i}",
        f"10.96.0.{rng.randint(1, 4)}",
        [port("ns", f"s{i}", "p", rng.choice([80, 443]), node_port=node_port)],
        external_ips=rng.sample(["203.0.113.1", "203.0.113.2", "10.96.0.1", "10.96.0.2"], 2),
        created=rng.choice(["", OLD, NEW]),
    )


@pytest.mark.parametrize("seed", range(30))
def test_incremental_equals_a_fresh_state(seed: int) -> None:
    rng = random.Random(seed)
    state = ClusterState("n1")
    current: dict[ServiceKey, Service] = {}
    for _ in range(40):
        i = rng.randint(0, 7)
        if rng.random() < 0.25 and current:
            victim = rng.choice(sorted(current, key=str))
            state.apply([gone(current.pop(victim))])
        else:
            svc = _random_service(rng, i)
            current[svc.key] = svc
            state.apply([up(svc)])
        fresh = ClusterState("n1")
        fresh.apply([up(s) for s in current.values()])
        assert dict(state.snapshot().services) == dict(fresh.snapshot().services)
        assert state.refused == fresh.refused


def _plain_or_not(rng: random.Random, i: int) -> Service:
    """Mostly plain Services (one ClusterIP, no external address: the claims' fast path when
    their ClusterIP and NodePort are theirs alone) among ones that share or watch their
    addresses, or whose ClusterIP is refused."""
    if rng.random() < 0.3:
        return _random_service(rng, i)
    return service(
        "ns",
        f"s{i}",
        rng.choice([f"10.96.0.{rng.randint(1, 12)}", "10.96.0.1", "127.0.0.5", "10.97.0.1"]),
        [port("ns", f"s{i}", "p", 80, node_port=rng.choice([None, None, 30001, 30003]))],
        created=rng.choice(["", OLD, NEW]),
    )


@pytest.mark.parametrize("seed", range(30))
def test_batches_of_mostly_plain_services_equal_a_fresh_state(seed: int) -> None:
    rng = random.Random(seed)
    ranges = (ipaddress.ip_network("10.96.0.0/16"),) if seed % 2 else ()
    state = ClusterState("n1", service_cidrs=ranges)
    current: dict[ServiceKey, Service] = {}
    for _ in range(15):
        batch = []
        for _ in range(rng.randint(1, 6)):
            i = rng.randint(0, 15)
            if rng.random() < 0.2 and current:
                victim = rng.choice(sorted(current, key=str))
                batch.append(gone(current.pop(victim)))
            else:
                svc = _plain_or_not(rng, i)
                current[svc.key] = svc
                batch.append(up(svc))
        state.apply(batch)
        fresh = ClusterState("n1", service_cidrs=ranges)
        fresh.apply([up(s) for s in current.values()])
        assert dict(state.snapshot().services) == dict(fresh.snapshot().services)
        assert state.refused == fresh.refused


def _history(seed: int) -> tuple[tuple[IPv4Network, ...], list[list[Upsert | Delete]]]:
    rng = random.Random(seed)
    ranges = (IPv4Network("10.96.0.0/16"),) if seed % 2 else ()
    batches: list[list[Upsert | Delete]] = []
    current: dict[ServiceKey, Service] = {}
    for _ in range(15):
        batch: list[Upsert | Delete] = []
        for _ in range(rng.randint(1, 6)):
            i = rng.randint(0, 15)
            if rng.random() < 0.2 and current:
                batch.append(gone(current.pop(rng.choice(sorted(current, key=str)))))
            else:
                svc = _plain_or_not(rng, i)
                current[svc.key] = svc
                batch.append(up(svc))
        batches.append(batch)
    return ranges, batches


@pytest.mark.parametrize("seed", range(40))
def test_the_fast_claims_decide_as_the_general_ones(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch by batch, the same services changed, the same view and the same refusals with the
    plain Services' short ways as with every Service decided the general way."""
    ranges, batches = _history(seed)

    def run() -> list[object]:
        state = ClusterState("n1", service_cidrs=ranges)
        out: list[object] = []
        for batch in batches:
            changed = state.apply(batch)
            out.append((sorted(map(str, changed)), dict(state.snapshot().services), state.refused))
        return out

    fast = run()
    monkeypatch.setattr(Claims, "_plain", lambda self, svc: False)
    monkeypatch.setattr(Claims, "_plain_alone", lambda self, svc: False)
    assert run() == fast


def test_many_services_on_one_cluster_ip_the_oldest_holds_it_and_the_next_one_follows() -> None:
    """A crowd on one address (a copied manifest, or a user's loop): each change still picks the
    oldest holder, also after the holder goes and after an age changes."""
    ages = [f"2024-01-{d:02}T00:00:00Z" for d in range(1, 29)]
    crowd = [service("ns", f"s{i:03}", "10.96.0.10", created=ages[i % 28]) for i in range(200)]
    thief = service("ns", "thief", "10.96.0.99", external_ips=["10.96.0.10"], created=ages[0])
    state = ClusterState("n1")
    state.apply([up(s) for s in (*crowd, thief)])

    def holder() -> str:
        (key,) = [k for k in state.snapshot().services if k.name != "thief"]
        return key.name

    assert holder() == "s000"  # 2024-01-01, and first by name among s000, s028, s056 ...
    assert any("10.96.0.10 is the ClusterIP of Service ns/s000" in r for r in state.refused)
    state.apply([gone(crowd[0])])
    assert holder() == "s028"
    state.apply([up(service("ns", "s028", "10.96.0.10", created=ages[27]))])  # now the youngest
    assert holder() == "s056"
    assert any("10.96.0.10 is the ClusterIP of Service ns/s056" in r for r in state.refused)


def _cidr(name: str, *nets: str) -> Upsert:
    obj = ServiceCIDR(name=name, cidrs=tuple(ip_network(n) for n in nets))
    return Upsert(ref=ObjectRef(kind="ServiceCIDR", namespace="", name=name), obj=obj)


def test_a_cluster_ip_outside_the_configured_service_range_leaves_its_service_out() -> None:
    """A manifest's ClusterIP of 8.8.8.8 would take that address from every pod on the node."""
    rogue = service("a", "rogue", "8.8.8.8")
    ok = service("a", "ok", "10.96.0.4")
    state = ClusterState("n1", service_cidrs=[ip_network("10.96.0.0/12")])
    state.apply([up(rogue), up(ok)])
    assert set(state.snapshot().services) == {ok.key}
    assert state.refused == [
        "Service a/rogue: spec.clusterIP: 8.8.8.8 is outside the service ranges "
        "(10.96.0.0/12); left out"
    ]


def test_service_cidr_objects_add_ranges_and_their_changes_decide_again() -> None:
    new_range = service("a", "new", "10.200.0.5")
    dual = service("a", "dual", ["10.96.0.5", "fd00:10:96::5"])
    state = ClusterState("n1", service_cidrs=[ip_network("10.96.0.0/16")])
    state.apply([up(new_range), up(dual)])
    # No IPv6 range is known: the IPv6 ClusterIP is taken as written.
    assert set(state.snapshot().services) == {dual.key}
    state.apply([_cidr("extra", "10.200.0.0/16", "fd00:10:96::/112")])
    assert set(state.snapshot().services) == {dual.key, new_range.key}
    assert state.refused == []
    state.apply([_cidr("extra", "10.200.0.0/16", "fd00:99::/112")])
    assert set(state.snapshot().services) == {new_range.key}
    assert state.refused == [
        "Service a/dual: spec.clusterIPs[1]: fd00:10:96::5 is outside the service ranges "
        "(fd00:99::/112); left out"
    ]
    state.apply([Delete(ref=ObjectRef(kind="ServiceCIDR", namespace="", name="extra"))])
    assert set(state.snapshot().services) == {dual.key}


def test_with_no_service_range_known_any_unicast_cluster_ip_is_taken() -> None:
    svc = service("a", "anywhere", "8.8.8.8")
    state = ClusterState("n1")
    state.apply([up(svc)])
    assert set(state.snapshot().services) == {svc.key}
    assert state.refused == []


def test_a_deleted_service_leaves_nothing_behind_claims_or_none() -> None:
    """A Service that claimed nothing (headless, no nodePort) is forgotten when deleted as
    one with claims is: a churning cluster's deleted Services must not pile up."""
    claims = Claims()
    headless = service("a", "headless", [])
    web = service("a", "web", "10.96.0.10", [port("a", "web", node_port=30080)])
    for round_ in range(3):  # created and deleted again: nothing grows
        services = {headless.key: headless, web.key: web}
        claims.update([headless.key, web.key], services)
        assert set(claims._created) == {headless.key, web.key}
        claims.update([headless.key, web.key], {})
        assert (round_, claims._created, claims._claims, claims._by) == (round_, {}, {}, {})
