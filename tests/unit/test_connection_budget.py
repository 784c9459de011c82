"""One descriptor budget for every HTTP server of the daemon: sized from the descriptor limit,
listeners and connections together; a connection is admitted by evicting the oldest idle
connection of the client holding the most, so a new client is always answered."""

from __future__ import annotations

import resource

import pytest

from nlproxy.serve.budget import (
    LOOPBACK_CLIENT,
    MAX_PER_CLIENT,
    MIN_CONNECTIONS,
    Connection,
    DescriptorBudget,
    client_of,
)


def test_the_budget_follows_the_descriptor_limit() -> None:
    """Read as it is now: a quarter (at least 64) kept for the rest of the daemon."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    budget = DescriptorBudget()
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (400, hard))
        assert (budget.kept, budget.share, budget.total) == (100, 300, 300)
        resource.setrlimit(resource.RLIMIT_NOFILE, (96, hard))
        assert (budget.kept, budget.share, budget.total) == (64, 32, 32)
        resource.setrlimit(resource.RLIMIT_NOFILE, (40, hard))
        assert (budget.share, budget.total) == (0, MIN_CONNECTIONS)
        assert not budget.try_listener()  # no health-check listener when nothing is left
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_health_check_listeners_stop_short_of_the_connections_floor() -> None:
    budget = DescriptorBudget(limit=400)  # share 300, connections keep 75
    budget.open_listener()  # /healthz
    budget.open_listener()  # /metrics
    optional = 0
    while budget.try_listener():
        optional += 1
    assert optional == 300 - 75 - 2
    assert budget.total == budget.connection_floor == 75
    budget.open_listener()  # an essential one is never refused...
    assert budget.listeners == 226
    assert budget.total == 74  # ...and comes out of the connections
    budget.close_listener()
    budget.close_listener()
    assert budget.try_listener()  # a place given back is taken again
    assert not budget.try_listener()


def _fill(budget: DescriptorBudget, clients: list[str]) -> list[Connection]:
    conns = [budget.take(c) for c in clients]
    assert all(c is not None for c in conns)
    return [c for c in conns if c is not None]


async def test_a_new_client_is_admitted_when_every_address_holds_one() -> None:
    """The shape that starved probes: as many addresses as the budget, one connection each."""
    budget = DescriptorBudget(limit=96)  # 32 connections
    held = _fill(budget, [f"10.0.0.{i}" for i in range(1, 33)])
    assert budget.held == 32
    for n in range(20):  # twenty probes in a row, each from a new address
        probe = budget.take(f"10.1.0.{n}")
        assert probe is not None
        assert budget.held == 32
        assert held[n].scope.cancel_called  # the oldest of the holders of one goes
        assert held[n].evicted
        budget.give(probe)  # answered and closed
        budget.give(held[n])  # the evicted one unwinds: nothing more to give back
        assert budget.held == 31
        budget.take(f"10.0.0.{n + 1}")  # the attacker opens it again
    assert not any(c.scope.cancel_called for c in held[20:])


async def test_the_greediest_client_pays_its_oldest_idle_connection() -> None:
    budget = DescriptorBudget(limit=96)
    greedy = _fill(budget, ["10.0.0.1"] * 5)
    others = _fill(budget, [f"10.0.1.{i}" for i in range(27)])
    greedy[0].busy = True  # its handler is at work: spared
    probe = budget.take("10.0.2.1")
    assert probe is not None
    assert not greedy[0].scope.cancel_called
    assert greedy[1].scope.cancel_called
    assert not any(c.scope.cancel_called for c in greedy[2:] + others)
    assert budget.clients()["10.0.0.1"] == 4
    # Every connection at work: nothing can go, the newcomer is refused.
    for c in [*greedy, *others, probe]:
        c.busy = True
    assert budget.take("10.0.2.2") is None
    assert budget.refusals == 1


async def test_a_client_at_its_cap_replaces_its_own_oldest() -> None:
    budget = DescriptorBudget(limit=4096)
    mine = _fill(budget, ["10.0.0.1"] * MAX_PER_CLIENT)
    other = budget.take("10.0.0.2")
    assert other is not None
    again = budget.take("10.0.0.1")
    assert again is not None
    assert mine[0].scope.cancel_called
    assert not other.scope.cancel_called
    assert budget.clients() == {"10.0.0.1": MAX_PER_CLIENT, "10.0.0.2": 1}


@pytest.mark.parametrize(
    ("address", "client"),
    [
        pytest.param("127.0.0.1", LOOPBACK_CLIENT, id="loopback"),
        pytest.param("127.45.3.9", LOOPBACK_CLIENT, id="any-of-127/8"),
        pytest.param("::ffff:127.0.0.7", LOOPBACK_CLIENT, id="mapped-loopback"),
        pytest.param("::ffff:10.1.2.3", "10.1.2.3", id="mapped"),
        pytest.param("::1", "::1", id="ipv6-loopback-is-one-address"),
        pytest.param("10.1.2.3", "10.1.2.3", id="plain"),
        pytest.param("fe80::1%eth0", "fe80::1", id="scoped"),
        pytest.param("?", "?", id="unknown"),
    ],
)
def test_clients_by_address(address: str, client: str) -> None:
    assert client_of(address) == client


async def test_loopback_addresses_hold_no_more_than_one_client() -> None:
    """A local user binding many 127.0.0.0/8 addresses is one client: capped, and each of its
    new connections replaces one of its own, never another client's."""
    budget = DescriptorBudget(limit=96)
    prober = budget.take("10.0.0.9")
    assert prober is not None
    for i in range(500):
        assert budget.take(f"127.0.{i // 250}.{2 + i % 250}") is not None
    assert budget.clients() == {LOOPBACK_CLIENT: MAX_PER_CLIENT, "10.0.0.9": 1}
    assert not prober.scope.cancel_called
    for conn in list(budget._clients[LOOPBACK_CLIENT]):
        budget.give(conn)
    budget.give(prober)
    assert budget.held == 0
    assert budget.clients() == {}


async def test_a_connection_whose_request_waits_is_not_idle() -> None:
    """Bytes in its socket that the server has not read yet: a client waiting for an answer,
    spared as a busy one is."""
    budget = DescriptorBudget(limit=96)
    waiting = budget.take("10.0.0.1", spoke=lambda: True)
    silent = budget.take("10.0.0.1", spoke=lambda: False)
    assert waiting is not None
    assert silent is not None
    _fill(budget, [f"10.0.1.{i}" for i in range(30)])
    assert budget.take("10.0.2.1") is not None
    assert not waiting.scope.cancel_called
    assert silent.scope.cancel_called
