"""One connection budget for every HTTP server of the daemon: sized from the descriptor limit,
at most 16 per client address, and a client with few connections takes a slot from the
greediest one when all are held (a probe is answered however many addresses hold idle ones)."""

from __future__ import annotations

import resource

import trio

from nlproxy.serve.http import MAX_PER_CLIENT, ConnectionBudget


def test_the_budget_follows_the_descriptor_limit() -> None:
    """A quarter of the soft limit, read as it is now, between 16 and MAX_CONNECTIONS."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    budget = ConnectionBudget()
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (400, hard))
        assert budget.total == 100
        resource.setrlimit(resource.RLIMIT_NOFILE, (40, hard))
        assert budget.total == 16
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_servers_share_it_and_a_small_client_takes_from_the_greediest() -> None:
    budget = ConnectionBudget(total=20)  # shared: /healthz, /metrics, health-check ports
    greedy = [trio.CancelScope() for _ in range(MAX_PER_CLIENT)]
    assert all(budget.take("10.0.0.1", s) for s in greedy)
    assert not budget.take("10.0.0.1", trio.CancelScope())  # its own cap
    others = [trio.CancelScope() for _ in range(4)]
    assert all(budget.take("10.0.0.2", s) for s in others)
    assert budget.held == 20
    probe = trio.CancelScope()
    assert budget.take("10.0.0.3", probe)  # full: the greediest's oldest goes
    assert greedy[0].cancel_called
    assert not any(s.cancel_called for s in greedy[1:] + others)
    assert budget.held == 20
    budget.give("10.0.0.1", greedy[0])  # its handler unwinds: already given back
    assert budget.held == 20
    # Two clients holding as many: neither takes from the other.
    even = ConnectionBudget(total=2)
    assert even.take("a", trio.CancelScope())
    assert even.take("b", trio.CancelScope())
    assert not even.take("b", trio.CancelScope())
    for client, scopes in list(budget.per_client.items()):
        for s in list(scopes):
            budget.give(client, s)
    assert budget.held == 0
    assert budget.per_client == {}
