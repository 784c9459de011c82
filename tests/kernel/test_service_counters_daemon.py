"""The daemon with ``--service-counters``: ``/metrics`` reports each service port's packets and
bytes, read from the kernel at scrape time; without the flag the two families are absent."""

from __future__ import annotations

import re
from pathlib import Path

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import VIP_A, answered_by, daemon, objects, publish

testbed = topo.testbed

N = 6
_SAMPLE = re.compile(r"^(nlproxy_service_(?:packets|bytes)_total)\{([^}]*)\} (\S+)$", re.M)


def _samples(body: str) -> dict[tuple[str, str], float]:
    """(metric, labels) -> value of the two service counter families."""
    return {(m[1], m[2]): float(m[3]) for m in _SAMPLE.finditer(body)}


def test_metrics_count_service_traffic(testbed: Testbed, tmp_path: Path) -> None:
    manifests = publish(tmp_path / "manifests", objects(testbed, ["pod-b"]))
    with daemon(testbed, manifests, "--service-counters") as d:
        status, body = d.get(d.metrics, "/metrics")
        assert status == 200
        assert "# TYPE nlproxy_service_packets_total counter" in body
        assert "# TYPE nlproxy_service_bytes_total counter" in body
        a, b = 'service="default/a:tcp/TCP"', 'service="default/b:tcp/TCP"'
        assert _samples(body) == {
            ("nlproxy_service_packets_total", a): 0.0,
            ("nlproxy_service_bytes_total", a): 0.0,
            ("nlproxy_service_packets_total", b): 0.0,
            ("nlproxy_service_bytes_total", b): 0.0,
        }
        assert answered_by(testbed, VIP_A, n=N) == {"pod-b"}
        status, body = d.get(d.metrics, "/metrics")
        got = _samples(body)
        # Each request: at least SYN, ACK, data from the client, SYN-ACK and data back.
        assert got[("nlproxy_service_packets_total", a)] >= 5 * N
        assert got[("nlproxy_service_bytes_total", a)] >= 5 * N * 40
        assert got[("nlproxy_service_packets_total", b)] == 0.0
        assert d.stop() == 0
    assert not [e for e in d.lines if e.get("event") == "metrics.counters_failed"]


def test_metrics_without_the_flag_have_no_service_counters(
    testbed: Testbed, tmp_path: Path
) -> None:
    manifests = publish(tmp_path / "manifests", objects(testbed, ["pod-b"]))
    with daemon(testbed, manifests) as d:
        status, body = d.get(d.metrics, "/metrics")
        assert status == 200
        assert "kubeproxy_sync_proxy_rules_last_timestamp_seconds" in body
        assert "nlproxy_service_packets" not in body
        assert "nlproxy_service_bytes" not in body
        text = topo.nft_ruleset(testbed)
        assert "service-counters" not in text
