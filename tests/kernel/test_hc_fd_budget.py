"""Health-check listeners within the descriptor budget: a daemon started under a low hard
``RLIMIT_NOFILE`` with more ``externalTrafficPolicy: Local`` Services than its descriptors allow
listeners for serves the health checks that fit, names every Service whose check does not
(``healthcheck.over_budget``) and counts them, and stays whole: ``/livez`` and ``/healthz``
answer, changes apply, a deleted table is repaired, and a place freed by a removed Service is
taken by a waiting check."""

from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Any

from nlproxy.demo.testbed import Testbed
from nlproxy.serve.budget import DescriptorBudget
from tests.kernel import topo
from tests.kernel.daemon import (
    VIP_A,
    Daemon,
    answered_by,
    hc_get,
    nft,
    objects,
    publish,
    scrape,
    wait_until,
)
from tests.objects import endpoint, endpoint_slice, service

testbed = topo.testbed

LIMIT = 256
"""The daemon's descriptor limit, soft and hard, from its start (a container runtime's)."""
SERVICES = 300
"""Local Services, each with its own health-check node port: more than ``LIMIT`` allows."""
HC_BASE = 31000


def _local_services(tb: Testbed, which: range) -> list[dict[str, Any]]:
    pod = tb.pod("pod-a")
    out: list[dict[str, Any]] = []
    for i in which:
        name = f"lb-{i}"
        out.append(
            service(
                name,
                f"10.96.{10 + i // 250}.{1 + i % 250}",
                ({"name": "tcp", "port": 80, "targetPort": 8080, "nodePort": 30000 + i},),
                type="LoadBalancer",
                externalTrafficPolicy="Local",
                healthCheckNodePort=HC_BASE + i,
            )
        )
        out.append(endpoint_slice(name, [endpoint(str(pod.ipv4), pod.node)]))
    return out


def _started_under(limit: int, *args: Any) -> Daemon:
    """A daemon whose descriptor limit is ``limit``, soft and hard, from its start: set as soon
    as it is forked (before its own start-up raises the soft limit to the hard one, or after:
    both end at ``limit``)."""
    proc = Daemon(*args)
    resource.prlimit(proc.proc.pid, resource.RLIMIT_NOFILE, (limit, limit))
    return proc


def _over_budget(proc: Daemon) -> float:
    fam = scrape(proc).get("nlproxy_healthcheck_over_budget")
    assert fam is not None, "no nlproxy_healthcheck_over_budget family"
    return fam.samples[0].value


def test_local_services_past_the_descriptor_limit_are_named_and_nothing_wedges(
    testbed: Testbed, tmp_path: Path
) -> None:
    budget = DescriptorBudget(limit=LIMIT)
    fit = budget.share - budget.connection_floor - 2  # /healthz and /metrics listen too
    assert 0 < fit < SERVICES
    base = objects(testbed, ["pod-a"])
    d = publish(tmp_path / "m", [*base, *_local_services(testbed, range(SERVICES))])
    proc = _started_under(LIMIT, testbed, d)
    try:
        proc.wait_ready(timeout=60)
        assert resource.prlimit(proc.proc.pid, resource.RLIMIT_NOFILE) == (LIMIT, LIMIT)
        # The daemon is whole: probes answered, changes applied, a deleted table repaired.
        assert proc.get(proc.healthz, "/livez")[0] == 200
        assert proc.get(proc.healthz, "/healthz")[0] == 200
        publish(d, [*objects(testbed, ["pod-b"]), *_local_services(testbed, range(SERVICES))])
        wait_until(lambda: answered_by(testbed, VIP_A, 3) == {"pod-b"}, 10, "the change")
        nft(testbed, "delete", "table", "ip", "nlproxy")
        wait_until(lambda: answered_by(testbed, VIP_A, 3) == {"pod-b"}, 10, "the repair")

        # What does not fit is named and counted; the lowest ports are served.
        wait_until(
            lambda: len(proc.events("healthcheck.over_budget")) == SERVICES - fit,
            30,
            "every Service past the budget named",
        )
        named = {e["service"] for e in proc.events("healthcheck.over_budget")}
        assert named == {f"default/lb-{i}" for i in range(fit, SERVICES)}
        assert _over_budget(proc) == SERVICES - fit
        served = [i for i in range(SERVICES) if hc_get(proc, HC_BASE + i)[0] == 200]
        assert served == list(range(fit))
        fds = len(os.listdir(f"/proc/{proc.proc.pid}/fd"))
        assert fds <= LIMIT - budget.kept // 2, f"{fds} of {LIMIT} descriptors held"

        # The first Services go: the checks that waited take the places freed.
        now = range(20, fit + 20)
        publish(d, [*objects(testbed, ["pod-b"]), *_local_services(testbed, now)])
        wait_until(lambda: _over_budget(proc) == 0, 10, "no check over budget")
        served = [i for i in range(SERVICES) if hc_get(proc, HC_BASE + i)[0] == 200]
        assert served == list(now)
        within = {e["service"] for e in proc.events("healthcheck.within_budget")}
        assert within == {f"default/lb-{i}" for i in range(fit, fit + 20)}
        assert proc.get(proc.healthz, "/livez")[0] == 200
        assert proc.proc.poll() is None
    finally:
        proc.kill()
