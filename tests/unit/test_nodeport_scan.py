"""``addresses.any_nodeport`` (the walk ``nodeport_gaps`` makes over every Service of a node
without addresses of a family) answers what the generator expressions it replaced answered: a
differential test over random Services, ports and families."""

from __future__ import annotations

import random
from collections.abc import Iterable

import pytest

from nlproxy.cluster.model import Service
from nlproxy.proxy.addresses import any_nodeport
from tests.unit.builders import port, service


def plain(services: Iterable[Service], version: int) -> bool:
    """The expression ``nodeport_gaps`` used before."""
    return any(
        any(p.node_port for p in svc.ports) and any(ip.version == version for ip in svc.cluster_ips)
        for svc in services
    )


def random_service(rng: random.Random, i: int) -> Service:
    ips = rng.choice(
        [["10.96.0.1"], ["fd00::1"], ["10.96.0.1", "fd00::1"], ["fd00::1", "10.96.0.1"], []]
    )
    ports = [
        port("ns", f"s{i}", f"p{k}", 80 + k, node_port=rng.choice([None, 30000 + k]))
        for k in range(rng.randrange(0, 3))
    ]
    return service("ns", f"s{i}", ips, ports)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("version", [4, 6])
def test_it_answers_as_the_generator_expressions(seed: int, version: int) -> None:
    rng = random.Random(seed)
    services = [random_service(rng, i) for i in range(rng.randrange(0, 12))]
    assert any_nodeport(services, version) == plain(services, version)
    assert any_nodeport(iter(services), version) == plain(services, version)
