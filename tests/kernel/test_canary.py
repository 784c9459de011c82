"""A canary beside kube-proxy (``--service-proxy-name nlproxy``), with real packets.

kube-proxy v1.36.3's own nftables ruleset (tests/data/kube-proxy-rulesets) is loaded into the
test bed's node, whose address (172.18.0.2) and pod IPs are those kube-proxy programmed, less
the rules of the Service labelled ``service.kubernetes.io/service-proxy-name: nlproxy``, as
kube-proxy skips it. nlproxy runs in the same namespace with the name: the labelled Service
answers through nlproxy's table, the others through kube-proxy's. Relabelling moves a Service
between the two (kube-proxy's side as kube-proxy would change its rules: the Service's chain
and elements go or come back), and no connection to another Service is lost meanwhile: fresh
connections keep being answered, and one held open keeps echoing.
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from nlproxy.demo.echo import Result, tcp_request
from nlproxy.demo.testbed import Testbed
from nlproxy.netlink import netns
from tests.kernel.daemon import daemon, nft, publish, wait_until
from tests.kernel.test_daemon_config_change import EchoAll
from tests.netns import sh

REFERENCE = Path(__file__).parent.parent / "data" / "kube-proxy-rulesets"
RULESET = REFERENCE / "nftables" / "ruleset.nft"
LABEL = "service.kubernetes.io/service-proxy-name"
GRPC = 9000  # shop/api's grpc port's target, where a held connection echoes


@dataclass(frozen=True)
class KubeProxyService:
    """What kube-proxy programmed for one Service in the reference ruleset (``ip`` family)."""

    name: str
    cluster_ip: str
    ports: tuple[tuple[int, str], ...]  # (port, its service chain)
    hairpin: tuple[str, ...]

    def skipped(self) -> str:
        """The nft script of kube-proxy dropping the Service (labelled for another proxy)."""
        t = "ip kube-proxy"
        lines = [f"delete element {t} service-ips {{ {self.cluster_ip} . tcp . {p} }}"
                 for p, _ in self.ports]  # fmt: skip
        lines += [f"delete element {t} cluster-ips {{ {self.cluster_ip} }}"]
        lines += [f"delete element {t} hairpin-connections {{ {h} }}" for h in self.hairpin]
        lines += [f"delete chain {t} {chain}" for _, chain in self.ports]
        return "\n".join(lines) + "\n"

    def served(self, ruleset: str) -> str:
        """The nft script of kube-proxy programming the Service again (its label removed):
        its chains with the rules of the reference ruleset, and its elements."""
        t = "ip kube-proxy"
        lines: list[str] = []
        for _, chain in self.ports:
            lines.append(f"add chain {t} {chain}")
            lines += [f"add rule {t} {chain} {rule}" for rule in _chain_rules(ruleset, chain)]
        lines += [f"add element {t} cluster-ips {{ {self.cluster_ip} }}"]
        lines += [f"add element {t} hairpin-connections {{ {h} }}" for h in self.hairpin]
        lines += [f"add element {t} service-ips {{ {self.cluster_ip} . tcp . {p} : goto {c} }}"
                  for p, c in self.ports]  # fmt: skip
        return "\n".join(lines) + "\n"


FRONTEND = KubeProxyService(
    "frontend",
    "10.96.10.10",
    ((80, "service-SFDBSQB2-shop/frontend/tcp/http"),),
    ("10.244.1.5 . 10.244.1.5 . tcp . 8080",),
)
API = KubeProxyService(
    "api",
    "10.96.10.20",
    ((80, "service-WEZGB4Y6-shop/api/tcp/http"), (9090, "service-R6NSGCUN-shop/api/tcp/grpc")),
    ("10.244.1.6 . 10.244.1.6 . tcp . 8080", "10.244.1.6 . 10.244.1.6 . tcp . 9000"),
)
WEB = "10.96.10.30"  # shop/web-nodeport: kube-proxy's throughout
# The pods at the addresses kube-proxy's ruleset sends to: the test bed numbers a node's pods
# from .4 on, so fillers take the addresses no Service here uses.
LOCAL_PODS = ("client", "frontend-1", "api-1", "web-1")  # 10.244.1.4 - .7
REMOTE_PODS = ("r4", "r5", "r6", "frontend-2", "api-2", "web-2")  # 10.244.2.4 - .9
PODS = {
    FRONTEND.cluster_ip: {"frontend-1", "frontend-2"},
    API.cluster_ip: {"api-1", "api-2"},
    WEB: {"web-1", "web-2"},
}


def _chain_rules(ruleset: str, chain: str) -> list[str]:
    found = re.search(rf"\tchain {re.escape(chain)} {{\n(.*?)\n\t}}", ruleset, re.S)
    assert found is not None, chain
    return [line.strip() for line in found.group(1).splitlines() if line.strip()]


def _objects(tb: Testbed, labelled: set[str]) -> list[dict[str, Any]]:
    """The objects kube-proxy was served (this node's Node instead of kind-worker), with the
    ``labelled`` Services and their slices carrying the canary's label, as the EndpointSlice
    controller copies a Service's labels to its slices."""
    docs = [d for d in yaml.safe_load_all((REFERENCE / "api-objects.yaml").read_text()) if d]
    out: list[dict[str, Any]] = [tb.node_manifest()]
    for d in docs:
        if d["kind"] == "Node":
            continue
        meta = d["metadata"]
        labels = meta.get("labels") or {}
        service = (
            meta["name"] if d["kind"] == "Service" else labels.get("kubernetes.io/service-name")
        )
        if meta.get("namespace") == "shop" and service in labelled:
            meta["labels"] = {**labels, LABEL: "nlproxy"}
        out.append(d)
    return out


def _table_has(tb: Testbed, table: str, vip: str) -> bool:
    """Whether ``ip <table>``'s ClusterIP dispatch holds ``vip``."""
    listed = nft(tb, "list", "map", "ip", table, "service-ips")
    return re.search(rf"\b{re.escape(vip)} \. tcp \. 80\b", listed) is not None


def _answered_by(tb: Testbed, vip: str, n: int = 10) -> set[str]:
    pods = set()
    for _ in range(n):
        out = tcp_request(tb.pod("client").netns, vip, 80)
        assert out.result is Result.ANSWERED, f"{vip}: {out}"
        pods.add(out.pod)
    return pods


class Probes:
    """Fresh TCP connections from a pod to each of some Services, in a loop; every failure is
    kept with the Service it was for."""

    def __init__(self, tb: Testbed, vips: list[str]) -> None:
        self.tb, self.vips = tb, vips
        self.answered: dict[str, int] = dict.fromkeys(vips, 0)
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for vip in self.vips:
                out = tcp_request(self.tb.pod("client").netns, vip, 80, timeout=2.0)
                if out.result is Result.ANSWERED and out.pod in PODS[vip]:
                    self.answered[vip] += 1
                else:
                    self.failures.append(f"{vip}: {out}")

    def __enter__(self) -> Probes:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def more(self) -> dict[str, int]:
        """Wait until every Service answered again (so a step was crossed with traffic)."""
        before = dict(self.answered)
        wait_until(lambda: all(self.answered[v] > before[v] for v in self.vips), 10, "probes")
        return dict(self.answered)


class Held:
    """One TCP connection from the client pod to ``vip:port``, kept open, echoing."""

    def __init__(self, tb: Testbed, vip: str, port: int) -> None:
        with netns.entered(tb.pod("client").netns):
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        self.sock.connect((vip, port))

    def echoes(self, data: bytes) -> bool:
        self.sock.sendall(data)
        got = b""
        while len(got) < len(data):
            chunk = self.sock.recv(4096)
            if not chunk:
                break
            got += chunk
        return got == data

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def node() -> Iterator[Testbed]:
    if not RULESET.is_file():
        pytest.fail(f"test data missing: {RULESET} (kube-proxy's reference ruleset)")
    with Testbed(local_pods=LOCAL_PODS, remote_pods=REMOTE_PODS, tag="can") as tb:
        assert str(tb.node.ipv4) == "172.18.0.2"  # kube-proxy's node address in the ruleset
        assert str(tb.pod("frontend-1").ipv4) == "10.244.1.5"
        assert str(tb.pod("web-2").ipv4) == "10.244.2.9"
        yield tb


def test_a_labelled_service_is_served_beside_kube_proxy_and_moves_without_loss(
    node: Testbed, tmp_path: Path
) -> None:
    tb = node
    ruleset = RULESET.read_text()
    servers = [EchoAll(tb.pod(p).netns, GRPC) for p in ("api-1", "api-2")]
    # kube-proxy's rules, less the canary's (kube-proxy skips a labelled Service).
    sh("nft", "-f", str(RULESET), ns=tb.node.netns)
    sh("nft", "-f", "-", ns=tb.node.netns, input_=FRONTEND.skipped())
    manifests = publish(tmp_path / "m", _objects(tb, {"frontend"}))
    held: Held | None = None
    try:
        with daemon(tb, manifests, "--service-proxy-name", "nlproxy") as d:
            wait_until(lambda: _table_has(tb, "nlproxy", FRONTEND.cluster_ip), 10, "canary")
            # The canary answers through nlproxy (kube-proxy has no rule for it), the others
            # through kube-proxy (nlproxy has none for them).
            assert not _table_has(tb, "kube-proxy", FRONTEND.cluster_ip)
            assert _answered_by(tb, FRONTEND.cluster_ip) <= PODS[FRONTEND.cluster_ip]
            for vip in (API.cluster_ip, WEB):
                assert not _table_has(tb, "nlproxy", vip)
                assert _answered_by(tb, vip) <= PODS[vip]
            held = Held(tb, API.cluster_ip, 9090)  # through kube-proxy's DNAT
            assert held.echoes(b"before\n")

            with Probes(tb, [FRONTEND.cluster_ip, WEB]) as probes:
                probes.more()
                # shop/api is labelled: nlproxy takes it, then kube-proxy drops it.
                publish(manifests, _objects(tb, {"frontend", "api"}))
                wait_until(lambda: _table_has(tb, "nlproxy", API.cluster_ip), 10, "api moved in")
                sh("nft", "-f", "-", ns=tb.node.netns, input_=API.skipped())
                probes.more()
                assert _answered_by(tb, API.cluster_ip) <= PODS[API.cluster_ip]
                assert probes.failures == []
            assert held.echoes(b"api moved to nlproxy\n")

            with Probes(tb, [API.cluster_ip, WEB]) as probes:
                probes.more()
                # shop/frontend loses its label: kube-proxy serves it again, nlproxy lets go.
                sh("nft", "-f", "-", ns=tb.node.netns, input_=FRONTEND.served(ruleset))
                publish(manifests, _objects(tb, {"api"}))
                wait_until(
                    lambda: not _table_has(tb, "nlproxy", FRONTEND.cluster_ip), 10, "moved out"
                )
                probes.more()
                assert probes.failures == []
            assert _table_has(tb, "kube-proxy", FRONTEND.cluster_ip)
            assert _answered_by(tb, FRONTEND.cluster_ip) <= PODS[FRONTEND.cluster_ip]
            assert held.echoes(b"frontend moved back\n")

            # kube-proxy's tables were seen and left alone: expected beside a canary.
            assert {e["table"] for e in d.events("foreign_proxy.beside")} >= {"ip kube-proxy"}
            assert not d.events("foreign_proxy.detected")
            assert not d.events("foreign_proxy.removed")
            # ... and reported as beside it, not as foreign (the foreign-tables alert stays quiet).
            _, body = d.get(d.metrics, "/metrics")
            beside = [
                ln for ln in body.splitlines() if ln.startswith("nlproxy_beside_proxy_tables{")
            ]
            assert any('table="kube-proxy"' in ln and ln.endswith(" 1.0") for ln in beside), beside
            assert not [
                ln for ln in body.splitlines() if ln.startswith("nlproxy_foreign_proxy_tables{")
            ]
        tables = nft(tb, "list", "tables")
        assert "table ip kube-proxy" in tables
        assert "table ip6 kube-proxy" in tables
    finally:
        if held is not None:
            held.close()
        for server in servers:
            server.close()
