"""ClientIP affinity's map layout (``proxy/affinity.py``): a ClusterIP-only IPv4 port costs a
few objects whatever its endpoints, an endpoint change is element operations, and the packet
path still reaches every endpoint for a new client. Other ports keep per-endpoint chains."""

from __future__ import annotations

import re
from collections.abc import Mapping
from ipaddress import ip_address
from typing import TypeVar

import msgspec
import pytest

from nlproxy.cluster.model import EndpointSlice, Service
from nlproxy.conntrack.fake import FakeConntrack
from nlproxy.nft.fake import FakeNftables
from nlproxy.nft.ir import (
    Chain,
    DataType,
    DnatMap,
    Element,
    Family,
    Field,
    Map,
    Operation,
    Rule,
    Ruleset,
    Set,
    SetFlag,
    SetUpdate,
    Verb,
    goto,
    names,
)
from nlproxy.nft.reconcile import diff
from nlproxy.proxy import naming as n
from nlproxy.proxy.affinity import client_maps
from nlproxy.proxy.incremental import attach, plan_update
from nlproxy.proxy.layout import GLOBAL_BACKENDS, closure
from nlproxy.proxy.planner import plan
from nlproxy.proxy.tracer import trace
from nlproxy.sync.kernel import SyncKernel
from nlproxy.sync.syncer import Syncer, as_programmed
from tests.unit import incremental as inc
from tests.unit.builders import NODE, endpoint, eps_slice, node, port, service, snapshot, upsert
from tests.unit.incremental import CONFIG

CIP = "172.30.0.10"
CIP2 = "172.30.0.11"
NODE_IP = ip_address("192.168.0.2")
T = TypeVar("T")


def _sticky(
    ports: int,
    eps: int,
    *,
    drop: int | None = None,
    node_ports: bool = False,
    lb: bool = False,
    local: bool = False,
) -> tuple[Service, EndpointSlice]:
    specs = [
        port("b", "big", f"p{k}", 8000 + k, node_port=30000 + k if node_ports else None)
        for k in range(ports)
    ]
    extra: dict[str, object] = {}
    if lb:
        extra |= {"external_ips": ["192.0.2.7"], "load_balancer_ips": ["198.51.100.7"]}
    if local:
        extra |= {"external_policy_local": True, "health_check_node_port": 32000}
    svc = service("b", "big", CIP, specs, affinity_timeout=600, **extra)
    # Every other endpoint on this node (for the Local policy).
    members = [
        endpoint(f"10.1.{i // 250}.{i % 250 + 1}", NODE if i % 2 else "node2")
        for i in range(eps)
        if i != drop
    ]
    return svc, eps_slice("b", "big", members, [(f"p{k}", 8000 + k, "TCP") for k in range(ports)])


_COUNTED = re.compile(r"-[0-9]+$")


def _uncounted(by_name: Mapping[str, T]) -> dict[str, T]:
    """``by_name`` without the shared chains named by an endpoint count."""
    return {k: v for k, v in by_name.items() if not _COUNTED.search(k)}


def _ip(svc: tuple[Service, EndpointSlice]) -> Ruleset:
    snap = snapshot([svc[0]], [svc[1]], node=node([str(NODE_IP)]))
    return plan(snap, CONFIG).rulesets[Family.IP]


SHAPES = {
    "clusterip": {},
    "nodeport": {"node_ports": True},
    "external-ips-and-lb": {"lb": True},
    "everything-local": {"node_ports": True, "lb": True, "local": True},
}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_objects_do_not_grow_with_endpoints(shape: dict[str, bool]) -> None:
    small, large = _ip(_sticky(3, 10, **shape)), _ip(_sticky(3, 200, **shape))
    # (but the shared chains named by an endpoint count: ``dnat-10`` there, ``dnat-200`` here)
    assert _uncounted(small.chains) == _uncounted(large.chains)
    assert set(small.sets) == set(large.sets)
    assert {k: len(v) for k, v in _uncounted(small.rules).items()} == {
        k: len(v) for k, v in _uncounted(large.rules).items()
    }
    mine = [name for name, c in large.chains.items() if c.comment.startswith("b/big")]
    roles = sorted(name.split("-")[0] for name in mine)
    # Per port a chain that chooses (two with a Local policy: this node's endpoints, and every
    # endpoint for pods and the node itself), one for external traffic, and one that learns.
    external = shape.get("node_ports") or shape.get("lb")
    # Each choosing chain sends a new client on to a chain of its own (``new``, ``newlocal``).
    if shape.get("local"):
        assert roles == sorted(["external", "learn", "local", "new", "newlocal", "service"] * 3)
    elif external:
        assert roles == sorted(["external", "learn", "new", "service"] * 3)
    else:
        assert roles == sorted(["learn", "new", "service"] * 3)
    assert not [c for c in large.chains if c.startswith("endpoint-")]
    clients = [s for name, s in large.sets.items() if name.startswith("clients-")]
    assert len(clients) == 3
    for s in clients:
        assert isinstance(s, Map)
        assert s.flags & SetFlag.EVAL
        assert s.timeout == 600
    local_maps = [s for name in large.sets if name.startswith("localclients-")]
    assert len(local_maps) == (3 if shape.get("local") else 0)
    # One learning entry per frontend address and per node port.
    ports = _sticky(3, 1, **shape)[0].ports
    addresses = {k: el.value for k, el in large.elements[n.AFFINITY_ADDRESSES].items()}
    fronts = [CIP, *(["192.0.2.7", "198.51.100.7"] if shape.get("lb") else [])]
    assert addresses == {
        (ip_address(a), 6, sp.port): goto(n.affinity_learn_chain(sp.ref))
        for sp in ports
        for a in fronts
    }
    node_ports = large.elements.get(n.AFFINITY_NODEPORTS, {})
    assert len(node_ports) == (3 if shape.get("node_ports") else 0)
    # (the node ports' endpoints: elements, held as the kernel's bytes)
    assert len(large.elements[n.AFFINITY_ENDPOINTS]) == (3 * 200 if shape.get("node_ports") else 0)
    # Each port's learning chain updates its own map (and the local one for this node's
    # endpoints).
    data = (Field.IP_DADDR, Field.TH_DPORT)
    for sp in ports:
        rules = large.rules[n.affinity_learn_chain(sp.ref)]
        assert rules[0].exprs == (
            SetUpdate(n.affinity_clients_map(sp.ref), (Field.IP_SADDR,), None, data),
        )
        if shape.get("local"):
            local_map = n.affinity_local_clients_map(sp.ref)
            assert rules[1].exprs[-1] == SetUpdate(local_map, (Field.IP_SADDR,), None, data)
            local_eps = large.elements[n.affinity_local_endpoints(sp.ref)]
            assert len(local_eps) == 100


def test_an_endpoint_change_is_elements_and_the_choice_rule() -> None:
    before = _ip(_sticky(20, 300))
    after = _ip(_sticky(20, 300, drop=150))
    ops = diff(after, as_programmed(before))
    # The ports' own chains and maps stay; the shared chain of the new count is made and the
    # old count's goes (the one kind of chain named by a count).
    made = [op for op in ops if isinstance(op.obj, Chain | Set | Map) and op.verb is not Verb.FLUSH]
    assert {(op.verb, op.obj.name) for op in made} == {
        (Verb.DELETE, n.dnat_chain(300)),
        (Verb.ADD, n.dnat_chain(299)),
    }
    # Each port: the endpoint's slot goes (the last slot's endpoint moves in), and its new
    # clients' chain jumps to the new count's. Nothing grows with the endpoints.
    assert len(ops) < 20 * 10


def test_a_new_client_may_reach_every_endpoint_and_is_masqueraded_from_off_cluster() -> None:
    rs = _ip(_sticky(2, 5))
    got = trace(rs, ip_address("10.0.0.50"), 6, ip_address(CIP), 8001, local_addrs=[NODE_IP])
    assert got.verdict == "ACCEPT"
    assert got.endpoints == {f"10.1.0.{i}:8001" for i in range(1, 6)}
    assert not got.masquerade
    off = trace(rs, ip_address("192.168.9.9"), 6, ip_address(CIP), 8000, local_addrs=[NODE_IP])
    assert off.endpoints == {f"10.1.0.{i}:8000" for i in range(1, 6)}
    assert off.masquerade


def test_a_known_client_goes_through_its_map_first() -> None:
    rs = _ip(_sticky(1, 3))
    chain = n.affinity_service_chain(_sticky(1, 1)[0].ports[0].ref)
    dnats = [e for c in closure(rs, [chain]) for r in rs.rules[c] for e in r.exprs
             if isinstance(e, DnatMap)]  # fmt: skip
    assert [d.map.split("-")[0] for d in dnats] == ["clients", "backends"]


def _ipv6(eps: int, *, drop: int | None = None) -> tuple[Service, EndpointSlice]:
    ports = [port("b", "v6", node_port=30080)]
    svc = service("b", "v6", "fd00::12", ports, affinity_timeout=600, external_policy_local=True)
    members = [endpoint(f"fd01::{i + 1:x}", NODE if i % 2 else "node2") for i in range(eps)]
    return svc, eps_slice("b", "v6", [m for i, m in enumerate(members) if i != drop])


def test_ipv6_ports_keep_the_address_and_the_port_in_a_map_each() -> None:
    def rs6(eps: int, drop: int | None = None) -> Ruleset:
        svc, sl = _ipv6(eps, drop=drop)
        return plan(snapshot([svc], [sl], node=node([str(NODE_IP)])), CONFIG).rulesets[Family.IP6]

    small, large = rs6(4), rs6(40)
    assert _uncounted(small.chains) == _uncounted(large.chains)
    assert set(small.sets) == set(large.sets)
    assert not [c for c in large.chains if c.startswith("endpoint-")]
    ref = _ipv6(1)[0].ports[0].ref
    addrs, ports = (
        large.sets[n.affinity_clients_map(ref)],
        large.sets[n.affinity_client_ports_map(ref)],
    )
    assert isinstance(addrs, Map)
    assert isinstance(ports, Map)
    assert addrs.data == (DataType.IPV6_ADDR,)
    assert ports.data == (DataType.INET_SERVICE,)
    assert addrs.timeout == ports.timeout == 600
    assert n.affinity_local_client_ports_map(ref) in large.sets
    # A known client: the address from one map, the port from the other, by the same key.
    dnats = [e for r in large.rules[n.affinity_service_chain(ref)] for e in r.exprs
             if isinstance(e, DnatMap)]  # fmt: skip
    assert dnats[0] == DnatMap((Field.IP6_SADDR,), addrs.name, ports.name)
    learned = [e for r in large.rules[n.affinity_learn_chain(ref)] for e in r.exprs
               if isinstance(e, SetUpdate)]  # fmt: skip
    assert learned[:2] == [
        SetUpdate(addrs.name, (Field.IP6_SADDR,), None, (Field.IP6_DADDR,)),
        SetUpdate(ports.name, (Field.IP6_SADDR,), None, (Field.TH_DPORT,)),
    ]
    # The sync forgets a removed endpoint's clients from both maps together.
    maps = client_maps(
        large,
        plan(
            snapshot([_ipv6(40)[0]], [_ipv6(40)[1]], node=node([str(NODE_IP)])), CONFIG
        ).ports.values(),
    )
    assert {len(m) for m in maps} == {3}
    # An endpoint change is elements (and the choice rules' modulus): nothing per endpoint.
    ops = diff(rs6(40, drop=7), as_programmed(large))
    assert not [op for op in ops if isinstance(op.obj, Chain | Set | Map) and op.verb
                is not Verb.FLUSH and not _COUNTED.search(op.obj.name)]  # fmt: skip


def test_client_maps_keep_their_ports_endpoints() -> None:
    svc = _sticky(2, 3, drop=1)
    snap = snapshot([svc[0]], [svc[1]], node=node([str(NODE_IP)]))
    p = plan(snap, CONFIG)
    maps = client_maps(p.rulesets[Family.IP], p.ports.values())
    assert len(maps) == 2
    for m, keep in maps:
        port_no = 8000 + int(m.comment.split(":p")[1].split("/")[0])
        assert sorted(keep) == [(ip_address(a), port_no) for a in ("10.1.0.1", "10.1.0.3")]
    # A port that is gone keeps no client.
    assert all(keep == () for _, keep in client_maps(p.rulesets[Family.IP], []))


def test_changes_of_an_affinity_service_are_made_in_place() -> None:
    """Timeout, endpoints, ports, a node port (to the per-endpoint layout and back) and
    affinity off and on, each updated in place: equal to a fresh plan, and its operations
    leave what the full diff leaves (a redefined clients map with the chains that use it)."""
    state = inc.state_with_node()
    svc, sl = _sticky(2, 3)
    state.apply([upsert(svc), upsert(sl)])
    snap = state.snapshot()
    live = plan(snap, inc.CONFIG)
    assert attach(live, snap)
    programmed = {f: as_programmed(live.rulesets[f]) for f in inc.FAMILIES}
    three = (*svc.ports, port("b", "big", "p2", 8002))
    with_node_port = (msgspec.structs.replace(svc.ports[0], node_port=30080), *svc.ports[1:])
    steps = [
        [upsert(msgspec.structs.replace(svc, affinity_timeout=900))],
        [upsert(_sticky(2, 3, drop=1)[1])],
        [upsert(msgspec.structs.replace(svc, ports=three)), upsert(_sticky(3, 3)[1])],
        [upsert(msgspec.structs.replace(svc, ports=with_node_port))],
        [upsert(svc)],
        [upsert(msgspec.structs.replace(svc, affinity_timeout=None))],
        [upsert(svc)],
    ]
    for i, changes in enumerate(steps):
        state.apply(changes)
        snap = state.snapshot()
        live, deltas = plan_update(live, snap, inc.CONFIG)
        fresh = inc.fresh_like(live, snap, inc.CONFIG)
        assert live.rulesets == fresh.rulesets, i
        assert deltas is not None, f"step {i}: planned afresh"
        programmed = {
            f: inc.check_ops(deltas[f], programmed[f], fresh.rulesets[f]) for f in inc.FAMILIES
        }


def test_a_sync_forgets_the_clients_of_a_removed_endpoint() -> None:
    """The Syncer, on the fakes: the clients the packet path learned for an endpoint that left
    go after the commit; the others, and those of an unchanged Service, stay."""
    nft = FakeNftables(n.TABLE)
    syncer = Syncer(inc.CONFIG, SyncKernel(tables=nft.open, readback=nft, flows=FakeConntrack()))
    state = inc.state_with_node()
    big = _sticky(1, 3)
    other = (
        service("b", "other", CIP2, [port("b", "other", "p0", 8000)], affinity_timeout=600),
        eps_slice("b", "other", [endpoint("10.1.0.2")], [("p0", 8000, "TCP")]),
    )
    state.apply([upsert(big[0]), upsert(big[1]), upsert(other[0]), upsert(other[1])])
    syncer.sync(state.snapshot())
    rs = nft.ruleset(Family.IP)
    assert rs is not None
    maps = {s.comment: name for name, s in rs.sets.items() if name.startswith("clients-")}
    mine, theirs = maps["b/big:p0/TCP"], maps["b/other:p0/TCP"]
    gone, kept = (ip_address("10.1.0.2"), 8000), (ip_address("10.1.0.1"), 8000)
    learned = {mine: {"10.9.0.1": gone, "10.9.0.2": kept}, theirs: {"10.9.0.3": gone}}
    nft.open(rs.table).apply(
        [
            Operation(Verb.ADD, Element(set=m, key=(ip_address(c),), value=ep))
            for m, clients in learned.items()
            for c, ep in clients.items()
        ]
    )
    changed = state.apply([upsert(_sticky(1, 3, drop=1)[1])])
    syncer.sync(state.snapshot(), changed=changed)
    rs = nft.ruleset(Family.IP)  # (a commit replaces the fake's table whole)
    assert rs is not None
    held = {m: {str(k[0]): el.value for k, el in rs.elements[m].items()} for m in learned}
    assert held == {mine: {"10.9.0.2": kept}, theirs: {"10.9.0.3": gone}}


def _binding_rules(before: Ruleset, after: Ruleset) -> list[Rule]:
    """The rules the batch from ``before`` to ``after`` adds that look a named set or map up.

    The kernel binds such a rule's map when it adds it, and binding a map walks every element
    it holds (``nf_tables_bind_set``): the backends maps hold every frontend's endpoints, a
    clients map every client it learned. A rule re-added for every port on each endpoint
    change made one change cost ports x frontends x endpoints in the kernel."""
    ops = diff(after, as_programmed(before))
    added = [op.obj for op in ops if op.verb is Verb.ADD and isinstance(op.obj, Rule)]
    return [r for r in added if any(names(e).sets for e in r.exprs)]


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_an_endpoint_change_binds_no_map_per_port(shape: dict[str, bool]) -> None:
    # One endpoint elsewhere goes (the Cluster choice's count) and one of this node's (the
    # Local choice's count, for a Local policy).
    before = _ip(_sticky(20, 300, **shape))
    after = _ip(_sticky(20, 299, **shape))
    bound = _binding_rules(before, after)
    # At most the new endpoint count's shared chain per backends map, whatever the ports.
    assert len(bound) <= len(GLOBAL_BACKENDS)
    assert {name for r in bound for e in r.exprs for name in names(e).sets} <= GLOBAL_BACKENDS
    assert len(_binding_rules(_ip(_sticky(2, 300, **shape)), _ip(_sticky(2, 299, **shape)))) == len(
        bound
    )
