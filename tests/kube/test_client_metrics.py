"""client-go's ``rest_client_*`` metrics, as the kube source's requests to the in-repo API
server make them: every list and watch is counted with its answer's code, its method and the
server's ``host:port``, and timed."""

from __future__ import annotations

from typing import Any

import trio
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from nlproxy.serve.metrics import Metrics
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import eventually, start_source


def _samples(metrics: Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for s in family.samples
        if s.name == name
    }


async def test_requests_are_counted_by_code_and_timed(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    metrics = Metrics(CollectorRegistry())
    host = f"{apiserver.host}:{apiserver.port}"
    await start_source(nursery, api_client, on_request=metrics.kube_request)
    ok = (("code", "200"), ("host", host), ("method", "GET"))
    # The initial lists of every kind, and their watches once opened.
    assert _samples(metrics, "rest_client_requests_total")[ok] >= 3
    timed = _samples(metrics, "rest_client_request_duration_seconds_count")
    assert timed[(("host", host), ("verb", "GET"))] >= 3

    # A role losing its grant: the refused lists are counted with their code.
    apiserver.forbid("services")
    apiserver.drop_connections()
    refused = (("code", "403"), ("host", host), ("method", "GET"))
    await eventually(lambda: _samples(metrics, "rest_client_requests_total").get(refused, 0) >= 1)
