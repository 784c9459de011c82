"""``nlproxy status`` without a daemon: addresses, metric parsing, rendering, and the answers a
daemon gives when it is not ready or not nlproxy, from a small HTTP server on loopback."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from nlproxy.cli import main
from nlproxy.errors import ConfigError
from nlproxy.log import configure
from nlproxy.operate.status import DaemonStatus, from_samples, parse_metrics, parse_port, query
from nlproxy.operate.status_render import render_text, to_json

# What a daemon exports with kube-proxy 1.36's labels, and the foreign-table gauge.
METRICS_136 = """\
# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds The last time proxy rules were synced
# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7e9
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 1.70000001e9
# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 3
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv4"} 0.03
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 3
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="+Inf"} 1
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv6"} 0.01
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"} 1
# TYPE kubeproxy_sync_full_proxy_rules_duration_seconds histogram
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_sum{ip_family="IPv4"} 0.02
kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"} 1
# TYPE kubeproxy_sync_partial_proxy_rules_duration_seconds histogram
kubeproxy_sync_partial_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 2
kubeproxy_sync_partial_proxy_rules_duration_seconds_sum{ip_family="IPv4"} 0.01
kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv4"} 2
# TYPE kubeproxy_sync_proxy_rules_nftables_sync_failures_total counter
kubeproxy_sync_proxy_rules_nftables_sync_failures_total 2
# TYPE kubeproxy_sync_proxy_rules_service_changes_pending gauge
kubeproxy_sync_proxy_rules_service_changes_pending 1
# TYPE kubeproxy_sync_proxy_rules_endpoint_changes_pending gauge
kubeproxy_sync_proxy_rules_endpoint_changes_pending 4
# TYPE nlproxy_rejected_services gauge
nlproxy_rejected_services 1
# TYPE nlproxy_invalid_objects gauge
nlproxy_invalid_objects 2
# TYPE nlproxy_drift_repairs counter
nlproxy_drift_repairs_total{writer="nft"} 2
nlproxy_drift_repairs_total{writer="iptables-nft"} 1
# TYPE nlproxy_unreachable_endpoints gauge
nlproxy_unreachable_endpoints 1
# TYPE nlproxy_endpoint_unreachable gauge
nlproxy_endpoint_unreachable{service="default/web:http/TCP",endpoint="10.244.1.9:8080",\
reason="link down"} 1
# TYPE nlproxy_nodeport_addresses_missing gauge
nlproxy_nodeport_addresses_missing{ip_family="IPv4"} 0
nlproxy_nodeport_addresses_missing{ip_family="IPv6"} 1
# TYPE nlproxy_foreign_proxy_tables gauge
nlproxy_foreign_proxy_tables{family="ip",table="kube-proxy"} 1
nlproxy_foreign_proxy_tables{family="ip6",table="kube-proxy"} 0
"""

# What nlproxy exported before kube-proxy's labels: no ip_family, its own failure counter, and
# no foreign-table gauge at all.
METRICS_OLD = """\
# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds 1.7e9
# TYPE nlproxy_sync_failures counter
nlproxy_sync_failures_total 0
# TYPE nlproxy_drift_repairs counter
"""

M = parse_port("--metrics-address", "127.0.0.1:10249", 10249)
H = parse_port("--healthz-address", "0.0.0.0:10256", 10256)


@pytest.fixture(autouse=True)
def _log_to_this_tests_stderr() -> None:
    configure(level="warning")


@pytest.mark.parametrize(
    ("text", "dialled"),
    [
        pytest.param("0.0.0.0:10256", "127.0.0.1:10256", id="ipv4-wildcard"),
        pytest.param("[::]:10256", "[::1]:10256", id="ipv6-wildcard"),
        pytest.param(":10249", "127.0.0.1:10249", id="no-host"),
        pytest.param("10.0.0.5:9000", "10.0.0.5:9000", id="address"),
        pytest.param("[fd00::5]:9000", "[fd00::5]:9000", id="ipv6-address"),
        pytest.param("0.0.0.0", "127.0.0.1:10256", id="host-alone-default-port"),
        pytest.param("::", "[::1]:10256", id="ipv6-host-alone"),
        pytest.param("fd00::5", "[fd00::5]:10256", id="ipv6-address-alone"),
    ],
)
def test_bind_address_to_dial(text: str, dialled: str) -> None:
    assert parse_port("--healthz-address", text, 10256).address == dialled


@pytest.mark.parametrize("text", ["10256", "localhost", "1.2.3.4:0", "1.2.3.4:70000", "a:b"])
def test_bad_address_names_the_flag(text: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_port("--metrics-address", text, 10249)
    assert str(err.value) == f"--metrics-address: {text!r} is not HOST:PORT"


def test_kube_proxy_136_labels_are_summed_per_fact() -> None:
    st = from_samples(parse_metrics(METRICS_136), M, H, code=200, body={"lastUpdated": "x"})
    assert st.ok
    assert st.sync.last == datetime.fromtimestamp(1.70000001e9, UTC)  # the newest family
    # Every sync is recorded under each family: the busiest family's count, not the sum.
    assert (st.sync.count, st.sync.failures) == (3, 2)
    assert st.sync.mean_seconds == pytest.approx(0.01)
    assert st.sync.full is not None
    assert st.sync.partial is not None
    assert (st.sync.full.count, st.sync.partial.count) == (1, 2)
    assert st.sync.partial.mean_seconds == pytest.approx(0.005)
    assert (st.sync.pending_services, st.sync.pending_endpoints) == (1, 4)
    assert (st.rejected_services, st.invalid_objects, st.unreachable_count) == (1, 2, 1)
    assert st.drift_repairs == {"nft": 2, "iptables-nft": 1}
    assert st.foreign_tables == (("ip", "kube-proxy"),)  # 0: no longer there
    assert st.nodeport_missing == ("IPv6",)
    (u,) = st.unreachable
    assert (u.service, u.endpoint, u.reason) == (
        "default/web:http/TCP",
        "10.244.1.9:8080",
        "link down",
    )


def test_older_daemon_shows_what_it_does_not_export_as_unknown() -> None:
    st = from_samples(parse_metrics(METRICS_OLD), M, H, code=200, body={})
    assert st.sync.failures == 0
    assert st.drift_repairs == {}  # exported, no writer yet
    assert st.foreign_tables is None
    assert st.invalid_objects is None
    text = render_text(st, datetime.fromtimestamp(1.7e9 + 90, UTC))
    assert "last sync              2023-11-14 22:13:20 UTC (90s ago)" in text
    assert "foreign proxy tables   unknown (not exported)" in text
    assert "drift repairs          0" in text
    assert "nodeport addresses     unknown (not exported)" in text
    doc = to_json(st)
    assert doc["foreign_proxy_tables"] is None
    assert doc["drift_repairs"] == {}


def test_text_lists_problems() -> None:
    st = from_samples(
        parse_metrics(METRICS_136), M, H, code=503, body={"lastUpdated": "", "nodeEligible": False}
    )
    text = render_text(st, datetime.fromtimestamp(1.7e9, UTC))
    assert "ready                  NO (healthz 503, node NOT eligible" in text
    assert "drift repairs          3 (iptables-nft: 1, nft: 2)" in text
    assert "pending changes        1 service, 4 endpoint events" in text
    assert (
        "sync duration          mean 10.0 ms over 3 syncs (full mean 20.0 ms over 1 syncs; "
        "partial mean 5.0 ms over 2 syncs)"
    ) in text
    assert "  default/web:http/TCP  10.244.1.9:8080  link down" in text
    assert "  ip kube-proxy" in text
    assert (
        "nodeport addresses     IPv6 NodePorts REFUSED: nodePortAddresses selects no IPv6 address"
    ) in text
    assert text.splitlines()[-1] == (
        "nlproxy is not ready: --healthz-address answered 503 "
        "(the Node is being deleted or drained: load balancers should not use it)"
    )


# A canary (run --service-proxy-name) beside kube-proxy: its tables are expected there. The
# daemon names them in the beside gauge; a table also in the foreign gauge is still the canary's.
METRICS_CANARY = """\
# TYPE nlproxy_foreign_proxy_tables gauge
nlproxy_foreign_proxy_tables{family="ip",table="kube-proxy",mode="nftables"} 1
nlproxy_foreign_proxy_tables{family="ip",table="nat",mode="iptables"} 1
# TYPE nlproxy_beside_proxy_tables gauge
nlproxy_beside_proxy_tables{family="ip",table="kube-proxy",mode="nftables"} 1
nlproxy_beside_proxy_tables{family="ip6",table="kube-proxy",mode="nftables"} 1
"""


def test_a_canary_does_not_count_the_proxy_it_runs_beside_as_foreign() -> None:
    st = from_samples(parse_metrics(METRICS_CANARY), M, H, code=200, body={"lastUpdated": "x"})
    assert st.beside_tables == (("ip", "kube-proxy"), ("ip6", "kube-proxy"))
    assert st.foreign_tables == (("ip", "nat"),)  # not the canary's: still foreign
    text = render_text(st, datetime.fromtimestamp(1.7e9, UTC))
    assert "foreign proxy tables   ip nat\n" in text
    assert "beside (canary)        ip kube-proxy, ip6 kube-proxy\n" in text
    foreign, beside = text.split("another service proxy's tables")[1].split("runs beside")
    assert "ip kube-proxy" not in foreign
    assert "  ip kube-proxy\n  ip6 kube-proxy" in beside
    doc = to_json(st)
    assert doc["foreign_proxy_tables"] == [{"family": "ip", "table": "nat"}]
    assert doc["beside_proxy_tables"] == [
        {"family": "ip", "table": "kube-proxy"},
        {"family": "ip6", "table": "kube-proxy"},
    ]


def test_not_a_canary_has_no_beside_tables() -> None:
    st = from_samples(parse_metrics(METRICS_136), M, H, code=200, body={})
    assert st.beside_tables is None
    assert "beside" not in render_text(st, datetime.fromtimestamp(1.7e9, UTC))
    assert to_json(st)["beside_proxy_tables"] is None


class _Canned(BaseHTTPRequestHandler):
    answers: dict[str, tuple[int, str]] = {}

    def do_GET(self) -> None:
        code, body = self.answers.get(self.path, (404, "not found"))
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, dict[str, tuple[int, str]]]]:
    """A loopback HTTP server on an ephemeral port answering what the test puts in the dict."""
    answers: dict[str, tuple[int, str]] = {}
    handler = type("Handler", (_Canned,), {"answers": answers})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{httpd.server_address[1]}", answers
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def _query(addr: str) -> DaemonStatus:
    return query(
        parse_port("--metrics-address", addr, 10249),
        parse_port("--healthz-address", addr, 10256),
        timeout=2,
    )


def test_not_ready_daemon_exits_1(
    server: tuple[str, dict[str, tuple[int, str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    addr, answers = server
    answers["/healthz"] = (503, json.dumps({"lastUpdated": "", "nodeEligible": True}))
    answers["/metrics"] = (200, METRICS_136)
    st = _query(addr)
    assert st.up
    assert not st.ready
    assert st.problem == "not ready: --healthz-address answered 503 (no successful sync yet)"
    argv = ["status", "--metrics-address", addr, "--healthz-address", addr, "--json"]
    assert main(argv) == 1
    assert json.loads(capsys.readouterr().out)["problem"] == st.problem


def test_ready_daemon_exits_0(
    server: tuple[str, dict[str, tuple[int, str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    addr, answers = server
    answers["/healthz"] = (200, json.dumps({"lastUpdated": "2026-01-01T00:00:00+00:00"}))
    answers["/metrics"] = (200, METRICS_136)
    assert main(["status", "--metrics-address", addr, "--healthz-address", addr]) == 0
    out = capsys.readouterr().out
    assert "ready                  yes (healthz 200, last updated 2026-01-01T00:00:00+00:00)" in out
    assert "nlproxy is" not in out


@pytest.mark.parametrize(
    ("metrics", "error"),
    [
        pytest.param((404, "no"), "/metrics: HTTP 404", id="no-metrics-path"),
        pytest.param((200, "this is { not prometheus"), "/metrics: not Prometheus text", id="junk"),
    ],
)
def test_metrics_port_that_is_not_nlproxy(
    server: tuple[str, dict[str, tuple[int, str]]], metrics: tuple[int, str], error: str
) -> None:
    addr, answers = server
    answers["/healthz"] = (200, "{}")
    answers["/metrics"] = metrics
    st = _query(addr)
    assert st.ready
    assert not st.ok
    assert st.metrics_error is not None
    assert error in st.metrics_error
    assert st.problem is not None
    assert st.problem.startswith("metrics port not reachable: --metrics-address")


@pytest.mark.parametrize(
    ("body", "why"),
    [
        pytest.param({"lastUpdated": ""}, "no successful sync yet", id="never-synced"),
        pytest.param(
            {"lastUpdated": "2026-01-01T00:00:00+00:00", "nodeEligible": True},
            "a change has waited longer than the grace period without a successful sync",
            id="stale",
        ),
        pytest.param(
            {"lastUpdated": "2026-01-01T00:00:00+00:00", "nodeEligible": False},
            "the Node is being deleted or drained: load balancers should not use it",
            id="node-not-eligible",
        ),
        pytest.param(
            {"lastUpdated": "", "reason": "API server https://10.96.0.1:443 does not answer"},
            "API server https://10.96.0.1:443 does not answer",
            id="nlproxy-says-why",
        ),
    ],
)
def test_what_a_503_means(body: dict[str, object], why: str) -> None:
    st = from_samples(parse_metrics(METRICS_OLD), M, H, code=503, body=body)
    assert st.problem == f"not ready: --healthz-address answered 503 ({why})"


def test_one_sync_of_the_daemon_counts_as_one() -> None:
    """What nlproxy's own metrics say after one sync (both families recorded): one sync."""
    from prometheus_client import CollectorRegistry

    from nlproxy.serve.metrics import Metrics

    m = Metrics(CollectorRegistry())
    for family in ("IPv4", "IPv6"):  # as SyncLoop._record does for one sync
        m.sync_duration.labels(ip_family=family).observe(0.004)
        m.partial_sync_duration.labels(ip_family=family).observe(0.004)
        m.last_sync.labels(ip_family=family).set(1.7e9)
    samples = parse_metrics(m.exposition().decode())
    st = from_samples(samples, M, H, code=200, body={"lastUpdated": "x"})
    assert st.sync.count == 1
    assert st.sync.partial is not None
    assert st.sync.partial.count == 1
    assert st.sync.mean_seconds == pytest.approx(0.004)
    assert st.sync.failures == 0


@pytest.mark.parametrize("timeout", ["-1", "0", "nan", "inf", "1e308", "soon"])
def test_a_bad_timeout_is_a_usage_error(timeout: str, capsys: pytest.CaptureFixture[str]) -> None:
    from nlproxy.cli import main

    assert main(["status", "--timeout", timeout]) == 2
    err = capsys.readouterr().err
    assert "--timeout" in err
    assert "internal error" not in err
