"""Recovery after an API server outage: every kind is back within about a probe interval of the
server, however long it was down, and the server is not hammered meanwhile.

Runs the source with its production retry settings against the in-repo API server, which goes
away and comes back on the same port. The times are printed (``-s``) and bounded only loosely:
the bound proves "about a second", not "the backoff grown during the outage" (13 s was seen
against a real kube-apiserver).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
from structlog.testing import capture_logs

from nlproxy.cluster.kube_http import Http, Unreachable
from nlproxy.cluster.model import Replace
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import eventually, is_upsert_of, populate, start_source
from tests.objects import service

OUTAGE = 12.0
# Generous: recovery takes about one probe interval (at most 1 s) plus a list; grown per-kind
# backoffs would leave kinds asleep for 4-16 s after an outage this long.
BOUND = 3.0
KINDS = {"Service", "EndpointSlice", "Node", "ServiceCIDR"}


async def test_outage_recovery_is_prompt_and_probes_gently(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver)
    # Production settings: per-kind backoff 0.5 s doubling to 30 s, probes 0.1 s to 1 s.
    feed, _ = await start_source(
        nursery, api_client, backoff_initial=0.5, backoff_max=30.0, watch_timeout=300
    )
    await eventually(lambda: apiserver.active_watches == 4)
    with capture_logs() as logs:
        apiserver.stop()
        await trio.sleep(OUTAGE)
        # Changes while down, history compacted: every kind must relist to see them.
        apiserver.store.delete("services", "default", "svc-0")
        apiserver.store.compact()
        apiserver.unready_for = 0.3  # /readyz says 500 for a moment, as a starting server does
        apiserver.start()
        back = trio.current_time()
        relisted: dict[str, float] = {}
        services: set[str] = set()
        with trio.fail_after(BOUND + 7):
            while set(relisted) != KINDS:
                for change in await feed.batch():
                    if isinstance(change, Replace):
                        relisted.setdefault(change.kind, trio.current_time() - back)
                        if change.kind == "Service":
                            services = {c.ref.name for c in change.changes}
        apiserver.store.put("services", service("after", cluster_ip="10.96.1.1"))
        changed = trio.current_time()
        await feed.until(is_upsert_of("after"), within=BOUND + 7)
        seen_after = trio.current_time() - changed
    figures = {k: round(v, 3) for k, v in sorted(relisted.items())}
    print(f"outage {OUTAGE}s: relisted after {figures}; change seen after {seen_after:.3f}s")
    assert max(relisted.values()) <= BOUND, figures
    assert seen_after <= BOUND
    # One probe loop for all kinds, at most about one probe a second while down.
    [back_log] = [e for e in logs if e["event"] == "source.api_back"]
    assert back_log["probes"] <= 2 * OUTAGE, back_log
    assert len([e for e in logs if e["event"] == "source.api_unreachable"]) == 1
    assert services == {"svc-1", "svc-2"}  # the relist applied the deletion made while down


async def test_dropped_connections_resume_without_waiting_for_a_probe_cycle(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    # The server is up; a load balancer resets every connection. Resumes at once, repeatedly,
    # and the retries stay spaced (the probe interval grows until a request is answered).
    populate(apiserver)
    feed, source = await start_source(nursery, api_client)
    for i in range(3):
        await eventually(lambda: apiserver.active_watches == 4)
        apiserver.drop_connections()
        apiserver.store.put("services", service(f"web-{i}", cluster_ip=f"10.96.1.{i + 1}"))
        seen = await feed.until(is_upsert_of(f"web-{i}"), within=BOUND)
        assert not feed.replaces(seen)
    assert source.link.outages >= 3


def test_probe_is_one_quiet_attempt(
    apiserver: ApiServer, api_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    http = Http(api_client)
    assert http.probe() == 200
    apiserver.unready_for = 60.0
    apiserver.stop()
    apiserver.start()
    assert http.probe() == 500  # up, not ready: the link keeps probing
    apiserver.stop()
    with caplog.at_level(logging.DEBUG, logger="urllib3"), pytest.raises(Unreachable):
        http.probe()
    retries = [r for r in caplog.records if "Retrying" in r.getMessage()]
    assert retries == []  # one attempt, not the client's four with a warning each
