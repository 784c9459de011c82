"""A node upgraded from the per-endpoint ClientIP-affinity layout, with real packets.

An older nlproxy gave each affinity port a dynamic set and a chain per endpoint: the port's
``service-…`` chain sent a client found in an endpoint's set ``affinity-…`` to that endpoint's
chain ``endpoint-…``, a new one to a random endpoint chain, and the endpoint chain added the
client to its set and DNAT'd. The names are still built by ``proxy/naming.py`` (only to read
such tables). Here that layout is written into the node's table with nlproxy's own encoder, as
the older version left it (a client even learned in it), then ``run --once`` syncs the same
cluster: the per-endpoint objects must be gone, the clients-map layout in place, and a client
must keep one pod.

pod-a (the client), pod-b, pod-c are on node1 (where nlproxy runs), pod-r on node2.
"""

from __future__ import annotations

from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

from nlproxy.cluster.model import Protocol, ServicePortRef
from nlproxy.demo.testbed import Testbed
from nlproxy.nft.backend import NftBackend
from nlproxy.nft.ir import (
    Chain,
    Cmp,
    DataType,
    Dnat,
    Element,
    Family,
    Field,
    InlineVMap,
    L4Proto,
    Lookup,
    Map,
    Numgen,
    Operation,
    Rule,
    Set,
    SetFlag,
    SetUpdate,
    Table,
    Value,
    Verb,
    Verdict,
    goto,
)
from nlproxy.proxy import naming as n
from tests.kernel import topo
from tests.kernel.topo import PORTS, SLICE_PORTS, SVC_PORT, answers, apply, ask
from tests.objects import endpoint, endpoint_slice, service

testbed = topo.testbed

VIP = "10.96.0.12"
TARGET = 8080
TIMEOUT = 10800
PODS = ("pod-b", "pod-c", "pod-r")
STICKY = {"sessionAffinity": "ClientIP"}


def _web(tb: Testbed, **extra: Any) -> list[dict[str, Any]]:
    eps = [endpoint(str(tb.pod(p).ipv4), tb.pod(p).node) for p in PODS]
    return [
        service("web", VIP, PORTS, **extra),
        endpoint_slice("web", eps, SLICE_PORTS),
    ]


def _ref(name: str) -> ServicePortRef:
    return ServicePortRef(
        namespace="default", name="web", port_name=name, protocol=Protocol(name.upper())
    )


def _old_port(ref: ServicePortRef, port: int, eps: list[IPv4Address]) -> list[Operation]:
    """One port's objects as the per-endpoint layout wrote them, and its ClusterIP's dispatch
    element turned to its ``service-…`` chain. (The older version also masqueraded sources
    from outside the pods there; the client here is a pod.)"""
    add, comment = Verb.ADD, str(ref)
    proto = L4Proto[ref.protocol.value]
    ops: list[Operation] = []
    targets = []
    for ip in eps:
        sticky = n.affinity_set(ref, ip, TARGET)
        chain = n.affinity_endpoint_chain(ref, ip, TARGET)
        flags = SetFlag.TIMEOUT | SetFlag.EVAL
        s = Set(
            name=sticky, key=(DataType.IPV4_ADDR,), flags=flags, timeout=TIMEOUT, comment=comment
        )
        ops += [
            Operation(add, s),
            Operation(add, Chain(name=chain, comment=comment)),
            Operation(add, Rule(chain=chain, exprs=(SetUpdate(sticky, (Field.IP_SADDR,)),))),
            Operation(
                add,
                Rule(chain=chain, exprs=(Cmp(Field.META_L4PROTO, proto), Dnat(ip, TARGET))),
            ),
        ]
        targets.append((sticky, chain))
    service = n.affinity_service_chain(ref)
    ops.append(Operation(add, Chain(name=service, comment=comment)))
    for sticky, chain in targets:
        rule = Rule(chain=service, exprs=(Lookup((Field.IP_SADDR,), sticky), goto(chain)))
        ops.append(Operation(add, rule))
    entries: tuple[tuple[tuple[Value, ...], Verdict], ...] = tuple(
        ((i,), goto(chain)) for i, (_, chain) in enumerate(targets)
    )
    choose = Rule(chain=service, exprs=(InlineVMap((Numgen(len(targets)),), entries),))
    key = (IPv4Address(VIP), proto, port)
    return [
        *ops,
        Operation(add, choose),
        Operation(Verb.DELETE, Element(set=n.SERVICE_IPS, key=key)),
        Operation(add, Element(set=n.SERVICE_IPS, key=key, value=goto(service), comment=comment)),
    ]


def _declared(tb: Testbed) -> tuple[set[str], dict[str, Set | Map]]:
    """The chain names and the sets of the node's ``ip nlproxy`` table, as the kernel lists
    them."""
    with NftBackend(Table(family=Family.IP, name=n.TABLE), netns=tb.node.netns) as backend:
        rs = backend.read_declarations()
    return set(rs.chains), dict(rs.sets)


def test_a_per_endpoint_table_is_replaced_and_clients_keep_one_pod(
    testbed: Testbed, tmp_path: Path
) -> None:
    # The cluster without affinity first (the table and its shared maps), then the older
    # version's affinity objects for both ports, in one batch.
    apply(testbed, tmp_path, _web(testbed))
    eps = [testbed.pod(p).ipv4 for p in PODS]
    old: list[Operation] = []
    for name, port in SVC_PORT.items():
        old += _old_port(_ref(name), port, eps)
    with NftBackend(Table(family=Family.IP, name=n.TABLE), netns=testbed.node.netns) as backend:
        backend.apply(old)
    old_chains = {
        op.obj.name
        for op in old
        if isinstance(op.obj, Chain) and op.obj.name.startswith(f"{n.AFFINITY_ENDPOINT}-")
    }
    old_sets = {op.obj.name for op in old if isinstance(op.obj, Set)}
    chains, sets = _declared(testbed)
    assert len(old_chains) == len(old_sets) == 2 * len(PODS)
    assert old_chains <= chains
    assert old_sets <= set(sets)
    # The old layout works: a client sticks to one pod.
    a = testbed.pod("pod-a")
    before = answers(ask("tcp", a.netns, VIP, 80))
    assert len(before) == 1, f"one client, one pod under the old layout: {before}"

    apply(testbed, tmp_path, _web(testbed, **STICKY))
    chains, sets = _declared(testbed)
    assert not old_chains & chains, "the per-endpoint chains are gone"
    assert not old_sets & set(sets), "the per-endpoint sets are gone"
    assert not [c for c in chains if c.startswith(f"{n.AFFINITY_ENDPOINT}-")]
    for name in SVC_PORT:
        ref = _ref(name)
        clients = sets.get(n.affinity_clients_map(ref))
        assert isinstance(clients, Map), f"{ref}: the clients map is in place"
        assert clients.flags & SetFlag.EVAL
        assert clients.timeout == TIMEOUT
        assert n.affinity_learn_chain(ref) in chains
        assert n.affinity_new_chain(ref, local=False) in chains
        assert n.affinity_service_chain(ref) in chains
    # Real traffic under the new layout: each client keeps one pod, TCP and UDP.
    for proto in ("tcp", "udp"):
        got = answers(ask(proto, a.netns, VIP, SVC_PORT[proto]))
        assert len(got) == 1, f"{proto}: one client, one pod after the upgrade: {got}"
        again = answers(ask(proto, a.netns, VIP, SVC_PORT[proto]))
        assert again == got, f"{proto}: the client stays on its pod"
