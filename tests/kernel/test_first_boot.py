"""A new node's first boot under the shipped DaemonSet: no proxy rules at all, the API server
reachable only at its own address, the ``kubernetes`` Service's ClusterIP pointing at it.

The kubelet gives the pod ``KUBERNETES_SERVICE_HOST`` = that ClusterIP, which only a service
proxy's rules make reachable: the shipped manifests must lead nlproxy to the real address, on a
kubeadm cluster (kube-proxy's ConfigMap names the control-plane endpoint) and on any other (the
``api-server`` key of nlproxy's ConfigMap). The pod is started from the manifests as shipped
(``tests/kernel/pod.py``); the in-repo API server speaks HTTPS with the service account's CA and
token, in its own namespace behind a veth. The first sync is proven by the traffic it enables:
the node reaches the API server through the ClusterIP.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from nlproxy.netlink import netns
from tests.kernel import pod
from tests.kernel.daemon import http_get
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import TOKEN
from tests.kube.tls import Pki, make_pki
from tests.netns import sh
from tests.objects import endpoint_slice, node, service

NODE = "boot-node"
NODE_IP, API_IP = "172.31.0.1", "172.31.0.2"
CLUSTER_IP = "10.96.0.1"
HEALTHZ = 10256


def kubeadm_kubeconfig(server: str) -> str:
    """The ``kubeconfig.conf`` of kubeadm's kube-proxy ConfigMap: the control-plane endpoint,
    and the pod's own service account token and CA."""
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "default",
                    "cluster": {
                        "certificate-authority": f"{pod.SERVICE_ACCOUNT_DIR}/ca.crt",
                        "server": server,
                    },
                }
            ],
            "contexts": [
                {
                    "name": "default",
                    "context": {"cluster": "default", "namespace": "default", "user": "default"},
                }
            ],
            "current-context": "default",
            "users": [
                {"name": "default", "user": {"tokenFile": f"{pod.SERVICE_ACCOUNT_DIR}/token"}}
            ],
        }
    )


@pytest.fixture
def control_plane(
    make_netns: Callable[[str], str], tmp_path: Path
) -> Iterator[tuple[str, str, ApiServer, Pki]]:
    """(node namespace, control plane's, API server, its PKI): the node has a veth to the
    control plane's namespace and a default route there, and not one nftables rule."""
    node_ns, cp_ns = make_netns("boot"), make_netns("bootcp")
    sh("ip", "link", "add", "eth0", "type", "veth", "peer", "name", "cp0", ns=node_ns)
    sh("ip", "link", "set", "cp0", "netns", cp_ns, ns=node_ns)
    sh("ip", "addr", "add", f"{NODE_IP}/24", "dev", "eth0", ns=node_ns)
    sh("ip", "link", "set", "eth0", "up", ns=node_ns)
    sh("ip", "addr", "add", f"{API_IP}/24", "dev", "cp0", ns=cp_ns)
    sh("ip", "link", "set", "cp0", "up", ns=cp_ns)
    sh("ip", "route", "add", "default", "via", API_IP, ns=node_ns)
    pki = make_pki(tmp_path / "pki", API_IP, CLUSTER_IP)
    api = ApiServer(token=TOKEN, host=API_IP, tls=pki.server_context())
    with netns.entered(cp_ns):  # listening only there, at the API server's own address
        api.start()
    try:
        api.store.put("nodes", node(NODE, ip=NODE_IP))
        api.store.put(
            "services",
            service("kubernetes", CLUSTER_IP, ({"name": "https", "port": 443,
                                                "targetPort": api.port},)),
        )  # fmt: skip
        api.store.put(
            "endpointslices",
            endpoint_slice(
                "kubernetes",
                [{"addresses": [API_IP], "conditions": {"ready": True}}],
                ({"name": "https", "port": api.port},),
            ),
        )
        yield node_ns, cp_ns, api, pki
    finally:
        api.stop()


def readyz_through(ns: str, host: str, port: int, pki: Pki) -> int | None:
    """HTTPS GET /readyz from ``ns`` to ``host:port`` with the pod's token; None: no answer."""
    with netns.entered(ns):
        sock = socket.socket()
    sock.settimeout(2)
    try:
        sock.connect((host, port))
        with pki.client_context().wrap_socket(sock, server_hostname=host) as tls:
            tls.sendall(
                f"GET /readyz HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            return int(tls.recv(64).split()[1])
    except OSError:
        return None
    finally:
        sock.close()


def metrics_ports() -> list[dict[str, Any]]:
    ds = pod.shipped(pod.DAEMONSET, "DaemonSet")
    (proxy,) = ds["spec"]["template"]["spec"]["containers"]
    return list(proxy["ports"])


def http_get_from(ns: str, host: str, port: int, path: str) -> tuple[int, str]:
    with netns.entered(ns):
        conn = http.client.HTTPConnection(host, port, timeout=5)
        conn.connect()
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


class Logs:
    def __init__(self, proc: Any) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: Any) -> None:
        for line in proc.stderr:
            self.lines.append(line.rstrip())

    def close(self, proc: Any) -> None:
        self._thread.join(timeout=10)
        proc.stderr.close()

    def events(self, name: str) -> list[dict[str, Any]]:
        out = []
        for line in list(self.lines):
            with contextlib.suppress(json.JSONDecodeError):
                doc = json.loads(line)
                if isinstance(doc, dict) and doc.get("event") == name:
                    out.append(doc)
        return out


@pytest.mark.parametrize("cluster", ["kubeadm", "api-server-key"])
def test_a_node_without_rules_reaches_its_first_sync(
    control_plane: tuple[str, str, ApiServer, Pki], tmp_path: Path, cluster: str
) -> None:
    node_ns, cp_ns, api, pki = control_plane
    real = f"https://{API_IP}:{api.port}"
    assert sh("nft", "list", "ruleset", ns=node_ns).strip() == ""  # no proxy rules at all
    assert readyz_through(node_ns, API_IP, api.port, pki) == 200
    assert readyz_through(node_ns, CLUSTER_IP, 443, pki) is None  # no rules: no ClusterIP

    ours = dict(pod.shipped(pod.CONFIGMAP, "ConfigMap")["data"])
    configmaps: dict[str, dict[str, str]] = {"nlproxy": ours}
    if cluster == "kubeadm":  # kube-proxy's ConfigMap as kubeadm writes it; our key left empty
        assert ours["api-server"] == ""
        configmaps["kube-proxy"] = {"kubeconfig.conf": kubeadm_kubeconfig(real)}
    else:  # any other cluster: the operator fills in the key, as the ConfigMap says
        ours["api-server"] = real
    spec = pod.daemonset_pod(
        node_name=NODE,
        configmaps=configmaps,
        service_account={
            "token": TOKEN,
            "ca.crt": pki.ca.read_text(),
            "namespace": "kube-system",
        },
        service_env={"KUBERNETES_SERVICE_HOST": CLUSTER_IP, "KUBERNETES_SERVICE_PORT": "443"},
    )
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = pod.start(spec, node_ns, scratch)
    logs = Logs(proc)
    try:
        deadline = time.monotonic() + 90  # generous: a loaded machine, a cold interpreter
        code = 0
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(OSError):
                code = http_get(node_ns, HEALTHZ, "/healthz")[0]
            if code == 200:
                break
            time.sleep(0.2)
        assert code == 200, f"not synced (exit {proc.poll()}): {logs.lines[-8:]}"
        # The rules it programmed carry the node to the API server through the ClusterIP.
        assert readyz_through(node_ns, CLUSTER_IP, 443, pki) == 200
        [starting] = logs.events("daemon.starting")
        if cluster == "kubeadm":
            assert starting["source"] == "kubeconfig /var/lib/kube-proxy/kubeconfig.conf"
        else:
            assert starting["source"] == f"in-cluster, API server {real}"
        paths = {p for p, _ in api.requests}
        assert "/api/v1/services" in paths
        # Prometheus, elsewhere, scrapes the node's address at the DaemonSet's metrics port.
        [port] = [p["containerPort"] for p in metrics_ports() if p["name"] == "metrics"]
        code, text = http_get_from(cp_ns, NODE_IP, port, "/metrics")
        assert code == 200
        assert "kubeproxy_sync_proxy_rules_last_timestamp_seconds" in text
    finally:
        proc.kill()
        proc.wait(timeout=10)
        logs.close(proc)


def test_the_in_cluster_fallback_that_leads_nowhere_says_so(
    control_plane: tuple[str, str, ApiServer, Pki], tmp_path: Path
) -> None:
    """The end state of another proxy's migration guide: kube-proxy's ConfigMap deleted, the
    ``api-server`` key left empty. nlproxy reaches for the ClusterIP, which nothing answers on a
    node without rules: its first line says so in the format asked for (JSON), no line repeats
    the client's retries, and ``/healthz`` gives the reason and the fix."""
    node_ns, _cp_ns, _api, pki = control_plane
    assert readyz_through(node_ns, CLUSTER_IP, 443, pki) is None  # no rules: no ClusterIP
    ours = dict(pod.shipped(pod.CONFIGMAP, "ConfigMap")["data"])
    assert ours["api-server"] == ""
    spec = pod.daemonset_pod(
        node_name=NODE,
        configmaps={"nlproxy": ours},  # no kube-proxy ConfigMap any more
        service_account={
            "token": TOKEN,
            "ca.crt": pki.ca.read_text(),
            "namespace": "kube-system",
        },
        service_env={"KUBERNETES_SERVICE_HOST": CLUSTER_IP, "KUBERNETES_SERVICE_PORT": "443"},
    )
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = pod.start(spec, node_ns, scratch)
    logs = Logs(proc)
    try:
        deadline = time.monotonic() + 90  # a connect timeout, a probe's, a loaded machine
        code = 0
        body: dict[str, Any] = {}
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(OSError):
                code, text = http_get(node_ns, HEALTHZ, "/healthz")
                body = json.loads(text)
            if "reason" in body and logs.events("source.api_unreachable"):
                break
            time.sleep(0.2)
        assert code == 503, f"exit {proc.poll()}: {logs.lines[-8:]}"
        reason = str(body.get("reason"))
        assert f"https://{CLUSTER_IP}:443 (KUBERNETES_SERVICE_HOST" in reason, body
        assert "api-server key" in reason
        assert "NLPROXY_API_SERVER" in reason
        assert "docs/migrating.md" in reason
        [unreachable] = logs.events("source.api_unreachable")
        assert unreachable["reason"] == reason
        # Every line is one JSON object, the first one naming the fallback and its fix.
        docs = [json.loads(line) for line in list(logs.lines)]
        first = docs[0]
        assert first["event"] == "config.api_server_in_cluster", first
        assert first["level"] == "warning"
        assert first["api_server"] == f"https://{CLUSTER_IP}:443"
        assert "clientConnection.kubeconfig" in first["message"]  # why it fell back
        assert "api-server key" in first["message"]
        assert "docs/migrating.md" in first["message"]
        # A failed request is said once (source.api_unreachable), not once per client retry.
        assert not [line for line in logs.lines if "Retrying" in line]
        # /livez: the process is alive (a restart would only try the same address again).
        assert http_get(node_ns, HEALTHZ, "/livez")[0] == 200
    finally:
        proc.kill()
        proc.wait(timeout=10)
        logs.close(proc)
