"""Switching a node from kube-proxy to nlproxy and back, as docs/migrating.md tells it.

kube-proxy's rules are made here as kube-proxy leaves them behind when its pod is stopped: its own
``ip kube-proxy`` table (nftables mode) with the same hooks and priorities as nlproxy's, or its
``KUBE-*`` chains in the iptables-nft ``nat`` table. Its view is deliberately stale (Service ``a``
on pod-a, which nlproxy's manifests have replaced by pod-b), so every new connection tells whose
rules answered it. Real TCP and UDP from pod-c; the guide's nlproxy commands run as a user would.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nlproxy.demo.echo import Result, UdpSession, tcp_request
from nlproxy.demo.testbed import Testbed
from tests.kernel import pod, test_first_boot, topo
from tests.kernel.daemon import VIP_A, Daemon, daemon, http_get, publish, wait_until
from tests.kernel.pod import ROOT
from tests.kernel.test_first_boot import CLUSTER_IP, readyz_through
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import TOKEN
from tests.kube.tls import Pki
from tests.netns import sh

testbed = topo.testbed

PORTS = (
    {"name": "tcp", "port": 80, "targetPort": 8080},
    {"name": "udp", "port": 80, "targetPort": 8080, "protocol": "UDP"},
)
SLICE_PORTS = ({"name": "tcp", "port": 8080}, {"name": "udp", "port": 8080, "protocol": "UDP"})


def objects(tb: Testbed, pod: str) -> list[dict[str, object]]:
    ep = topo.endpoint(str(tb.pod(pod).ipv4), tb.node.name)
    return [
        tb.node_manifest(),
        topo.service("a", VIP_A, PORTS),
        topo.endpoint_slice("a", [ep], SLICE_PORTS),
    ]


def kube_proxy_table(tb: Testbed, pod: str, *, again: bool = False) -> None:
    """kube-proxy's nftables-mode table, reduced to one Service: the same base chains, hooks
    and priorities as kube-proxy's, DNAT of ``a`` to ``pod``; ``again``: deleted first, as
    when kube-proxy starts on a node whose table was removed."""
    if again:
        subprocess.run(
            ["ip", "netns", "exec", tb.node.netns, "nft", "delete", "table", "ip", "kube-proxy"],
            check=True, timeout=30,
        )  # fmt: skip
    target = tb.pod(pod).ipv4
    ruleset = f"""
table ip kube-proxy {{
  comment "rules for kube-proxy"
  chain nat-prerouting {{ type nat hook prerouting priority dstnat; policy accept; jump services; }}
  chain nat-output {{ type nat hook output priority -100; policy accept; jump services; }}
  chain nat-postrouting {{
    type nat hook postrouting priority srcnat; policy accept; jump masquerading;
  }}
  chain masquerading {{
    meta mark & 0x00004000 == 0x00000000 return
    meta mark set meta mark ^ 0x00004000
    masquerade fully-random
  }}
  chain services {{
    ip daddr {VIP_A} tcp dport 80 goto service-a
    ip daddr {VIP_A} udp dport 80 goto service-a
  }}
  chain service-a {{
    meta l4proto tcp dnat ip to {target}:8080
    meta l4proto udp dnat ip to {target}:8080
  }}
}}
"""
    subprocess.run(
        ["ip", "netns", "exec", tb.node.netns, "nft", "-f", "-"],
        input=ruleset, text=True, check=True, timeout=30,
    )  # fmt: skip


def tables(tb: Testbed) -> str:
    out = subprocess.run(
        ["ip", "netns", "exec", tb.node.netns, "nft", "list", "tables"],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return out.stdout


def new_connections(tb: Testbed, n: int = 6) -> set[str]:
    """Who answered ``n`` fresh TCP connections from pod-c to Service ``a``."""
    pods = set()
    for _ in range(n):
        out = tcp_request(tb.pod("pod-c").netns, VIP_A, 80)
        assert out.result is Result.ANSWERED, str(out)
        pods.add(out.pod)
    return pods


def cli(tb: Testbed, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nlproxy", "--netns", tb.node.netns, *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def foreign_gauge(proc: Daemon) -> dict[str, float]:
    _, body = proc.get(proc.metrics, "/metrics")
    out = {}
    for line in body.splitlines():
        if line.startswith("nlproxy_foreign_proxy_tables{"):
            labels, value = line.rsplit(" ", 1)
            out[labels] = float(value)
    return out


def test_from_kube_proxy_to_nlproxy_and_back(testbed: Testbed, tmp_path: Path) -> None:
    pod_c = testbed.pod("pod-c").netns
    # kube-proxy served the node, then its DaemonSet pod was stopped: its rules stay.
    kube_proxy_table(testbed, "pod-a")
    assert new_connections(testbed) == {"pod-a"}
    d = publish(tmp_path / "m", objects(testbed, "pod-b"))
    with UdpSession(pod_c, VIP_A, 80) as stream:
        assert stream.ask().pod == "pod-a"  # an established flow through kube-proxy's rules

        # Step 1: start nlproxy. Its base chains are the newer ones at the same hooks and
        # priorities, so they run first: new connections follow nlproxy's rules. It says whose
        # other rules are there.
        with daemon(testbed, d, "--sync-period", "1s") as proc:
            wait_until(lambda: proc.events("foreign_proxy.detected"), 10, "the warning")
            (warning,) = proc.events("foreign_proxy.detected")
            assert warning["table"] == "ip kube-proxy"
            assert warning["level"] == "warning"
            assert "cleanup --kube-proxy" in warning["error"]
            key = 'nlproxy_foreign_proxy_tables{family="ip",mode="nftables",table="kube-proxy"}'
            assert foreign_gauge(proc) == {key: 1.0}
            assert new_connections(testbed) == {"pod-b"}
            # kube-proxy's flow is to pod-a, no endpoint of a's in the cluster nlproxy reads:
            # nlproxy's start-up sweep deletes it, as kube-proxy's cleanup would have, and the
            # same socket goes on through nlproxy's rules. From here on that flow keeps its
            # translation whoever's rules answer new connections.
            wait_until(
                lambda: [e["deleted"] for e in proc.events("conntrack.swept")] == [1],
                10,
                "the stale UDP flow swept",
            )
            assert stream.ask().pod == "pod-b"
            explained = cli(testbed, "explain", "default/a")
            assert "another proxy's rules: table ip kube-proxy" in explained.stdout
            inspected = cli(testbed, "inspect")
            assert "warning: another proxy's rules: table ip kube-proxy" in inspected.stderr

            # The hazard: a kube-proxy that starts again on the node (its pod not yet moved
            # off it) makes its table anew, and the newer chains win.
            kube_proxy_table(testbed, "pod-a", again=True)
            assert new_connections(testbed) == {"pod-a"}

            # Step 2: remove kube-proxy's rules. New connections follow nlproxy's rules; the
            # established flow keeps its translation in conntrack.
            cleaned = cli(testbed, "cleanup", "--kube-proxy")
            assert cleaned.returncode == 0, cleaned.stderr
            assert "removed: table ip kube-proxy (kube-proxy, nftables mode)" in cleaned.stdout
            assert "kube-proxy" not in tables(testbed)
            assert "table ip nlproxy" in tables(testbed)
            assert new_connections(testbed) == {"pod-b"}
            assert stream.ask().pod == "pod-b"
            wait_until(lambda: foreign_gauge(proc) == {}, 10, "the gauge to clear")
            assert proc.events("foreign_proxy.gone")
            again = cli(testbed, "cleanup", "--kube-proxy")  # idempotent
            assert again.returncode == 0
            assert again.stdout.strip() == "no kube-proxy rules found"

            # Rollback, step 1: stop nlproxy; its rules stay, so traffic does not stop.
            assert proc.stop() == 0
        assert new_connections(testbed) == {"pod-b"}
        # Step 2: kube-proxy starts and makes its table (with its own view: pod-a here);
        # its chains are the newer ones and answer at once.
        kube_proxy_table(testbed, "pod-a")
        assert new_connections(testbed) == {"pod-a"}
        # Step 3: `nlproxy cleanup` removes nlproxy's tables only.
        done = cli(testbed, "cleanup")
        assert done.returncode == 0, done.stderr
        assert "nlproxy" not in tables(testbed)
        assert "table ip kube-proxy" in tables(testbed)
        assert new_connections(testbed) == {"pod-a"}
        assert stream.ask().pod == "pod-b"


def test_replace_kube_proxy_removes_its_rules_after_the_first_sync(
    testbed: Testbed, tmp_path: Path
) -> None:
    kube_proxy_table(testbed, "pod-a")
    d = publish(tmp_path / "m", objects(testbed, "pod-b"))
    with daemon(testbed, d, "--replace-kube-proxy", "--sync-period", "1s") as proc:
        wait_until(lambda: proc.events("foreign_proxy.removed"), 10, "the removal")
        (removed,) = proc.events("foreign_proxy.removed")
        assert removed["table"] == "ip kube-proxy"
        assert "kube-proxy" not in tables(testbed)
        assert new_connections(testbed) == {"pod-b"}
        # kube-proxy still running somewhere on the node would write it again: removed again.
        kube_proxy_table(testbed, "pod-a")
        wait_until(lambda: len(proc.events("foreign_proxy.removed")) == 2, 10, "the 2nd removal")
        assert new_connections(testbed) == {"pod-b"}
        assert not proc.events("foreign_proxy.detected")
        # The gauge is back to 0 by any scrape; the removals say a proxy keeps coming back.
        status, body = proc.get(proc.metrics, "/metrics")
        assert status == 200
        removals = {
            (sample.labels["table"], sample.labels["mode"]): sample.value
            for family in text_string_to_metric_families(body)
            for sample in family.samples
            if sample.name == "nlproxy_foreign_proxy_removals_total"
        }
        assert removals == {("ip kube-proxy", "nftables"): 2.0}


def test_replace_kube_proxy_acts_on_the_notification_not_the_period(
    testbed: Testbed, tmp_path: Path
) -> None:
    """kube-proxy back on the node (``kubeadm upgrade apply`` restores it) is noticed from the
    nftables notifications the daemon already receives: removed long before the next periodic
    look (60 s at the default sync period), in either mode."""
    d = publish(tmp_path / "m", objects(testbed, "pod-b"))
    with daemon(testbed, d, "--replace-kube-proxy") as proc:
        wait_until(lambda: proc.events("foreign_proxy.check_failed") or _looked(proc), 30, "a look")
        kube_proxy_table(testbed, "pod-a")
        took = wait_until(
            lambda: "kube-proxy" not in tables(testbed), 15, "the table's removal on its notice"
        )
        print(f"nftables-mode table removed after {took:.3f} s")
        # One transaction, as kube-proxy's iptables-restore writes (a chain made alone is
        # gone before a second command could add a rule to it).
        subprocess.run(
            ["ip", "netns", "exec", testbed.node.netns, "iptables-nft-restore", "--noflush"],
            input="*nat\n:KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n",
            text=True, check=True, timeout=30,
        )  # fmt: skip
        took = wait_until(lambda: "KUBE-SERVICES" not in iptables_save(testbed), 15, "the chain")
        print(f"iptables-nft chain removed after {took:.3f} s")
        assert new_connections(testbed) == {"pod-b"}
        assert not proc.events("foreign_proxy.check_failed")


def test_status_stops_listing_removed_tables_at_once(testbed: Testbed, tmp_path: Path) -> None:
    """The guide says to check ``nlproxy status`` right after ``cleanup --kube-proxy``: the
    gauge it reads clears on the removal's notification, not at the next look (60 s)."""
    kube_proxy_table(testbed, "pod-a")
    d = publish(tmp_path / "m", objects(testbed, "pod-b"))
    with daemon(testbed, d) as proc:
        wait_until(lambda: foreign_gauge(proc), 30, "the gauge")
        cleaned = cli(testbed, "cleanup", "--kube-proxy")
        assert cleaned.returncode == 0, cleaned.stderr
        took = wait_until(lambda: foreign_gauge(proc) == {}, 10, "the gauge to clear")
        print(f"gauge cleared {took:.3f} s after cleanup returned")


def _looked(proc: Daemon) -> bool:
    """The daemon has made its first look for foreign rules (nothing found, nothing logged:
    the gauge is set by then)."""
    _, body = proc.get(proc.metrics, "/metrics")
    return "nlproxy_foreign_proxy_tables" in body


def iptables_save(tb: Testbed) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", tb.node.netns, "iptables-nft-save"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout  # fmt: skip


def iptables(tb: Testbed, *args: str) -> None:
    subprocess.run(
        ["ip", "netns", "exec", tb.node.netns, "iptables-nft", *args],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip


def test_iptables_nft_chains_are_found_and_only_kube_proxys_removed(
    testbed: Testbed, tmp_path: Path
) -> None:
    """kube-proxy's iptables mode on the iptables-nft backend: its chains in the shared nat and
    filter tables. Cleanup removes them and the rules that jump to them, nothing else: the
    kubelet's chains and a CNI's rules in the same tables stay."""
    pod_a = str(testbed.pod("pod-a").ipv4)
    for chain in (
        "KUBE-SERVICES",
        "KUBE-SVC-NPX46M4PTMTKRN6Y",
        "KUBE-SEP-TCOU7JCQXEZGVUNU",
        "KUBE-POSTROUTING",
    ):
        iptables(testbed, "-t", "nat", "-N", chain)
    for rule in (
        "-A PREROUTING -m comment --comment portals -j KUBE-SERVICES",
        "-A OUTPUT -j KUBE-SERVICES",
        "-A POSTROUTING -j KUBE-POSTROUTING",
        f"-A KUBE-SERVICES -d {VIP_A} -p tcp --dport 80 -j KUBE-SVC-NPX46M4PTMTKRN6Y",
        "-A KUBE-SVC-NPX46M4PTMTKRN6Y -j KUBE-SEP-TCOU7JCQXEZGVUNU",
        f"-A KUBE-SEP-TCOU7JCQXEZGVUNU -p tcp -j DNAT --to-destination {pod_a}:8080",
        # Not kube-proxy's: the kubelet's chains and a CNI's SNAT rule.
        "-N KUBE-KUBELET-CANARY",
        "-A POSTROUTING -s 10.244.0.0/16 ! -d 10.244.0.0/16 -j MASQUERADE",
    ):
        iptables(testbed, "-t", "nat", *rule.split())
    iptables(testbed, "-t", "filter", "-N", "KUBE-FIREWALL")
    iptables(testbed, "-t", "filter", "-A", "INPUT", "-j", "KUBE-FIREWALL")
    # A user's chain that only starts like kube-proxy's per-service firewall chains.
    iptables(testbed, "-t", "filter", "-N", "KUBE-FW-USER")
    iptables(testbed, "-t", "filter", "-A", "INPUT", "-j", "KUBE-FW-USER")
    assert new_connections(testbed) == {"pod-a"}

    d = publish(tmp_path / "m", objects(testbed, "pod-b"))
    with daemon(testbed, d, "--sync-period", "1s") as proc:
        wait_until(lambda: proc.events("foreign_proxy.detected"), 10, "the warning")
        (warning,) = proc.events("foreign_proxy.detected")
        assert warning["table"] == "ip nat"
        assert warning["mode"] == "iptables-nft"
        assert warning["chains"] == 4
        cleaned = cli(testbed, "cleanup", "--kube-proxy")
        assert cleaned.returncode == 0, cleaned.stderr
        assert "removed: 4 KUBE-* chains in table ip nat" in cleaned.stdout
        assert new_connections(testbed) == {"pod-b"}
        wait_until(lambda: foreign_gauge(proc) == {}, 10, "the gauge to clear")

    saved = subprocess.run(
        ["ip", "netns", "exec", testbed.node.netns, "iptables-nft-save"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout  # fmt: skip
    for gone in (
        "KUBE-SERVICES",
        "KUBE-SVC-NPX46M4PTMTKRN6Y",
        "KUBE-SEP-TCOU7JCQXEZGVUNU",
        "KUBE-POSTROUTING",
    ):
        assert gone not in saved
    assert ":KUBE-KUBELET-CANARY" in saved
    assert "-A INPUT -j KUBE-FIREWALL" in saved
    assert "-A INPUT -j KUBE-FW-USER" in saved
    assert "-A POSTROUTING -s 10.244.0.0/16 ! -d 10.244.0.0/16 -j MASQUERADE" in saved


# The end state (the last section of docs/migrating.md), on a node of its own: the shipped
# DaemonSet's container in a namespace whose only way to the API server is its own address.
control_plane = test_first_boot.control_plane
KUBEADM_CONFIG = ROOT / "tests/data/config/kubeadm-kube-proxy.conf"


@contextlib.contextmanager
def synced_pod(
    spec: pod.PodSpec, node_ns: str, scratch: Path
) -> Iterator[tuple[test_first_boot.Logs, int]]:
    """The pod started on the node, once its /healthz says it has synced (its log, its pid);
    killed at the end."""
    scratch.mkdir()
    proc = pod.start(spec, node_ns, scratch)
    logs = test_first_boot.Logs(proc)
    try:
        deadline = time.monotonic() + 90  # generous: a loaded machine, a cold interpreter
        code = 0
        while time.monotonic() < deadline and proc.poll() is None and code != 200:
            with contextlib.suppress(OSError):
                code = http_get(node_ns, test_first_boot.HEALTHZ, "/healthz")[0]
            time.sleep(0.2)
        assert code == 200, f"not synced (exit {proc.poll()}): {logs.lines[-8:]}"
        yield logs, proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=10)
        logs.close(proc)


def end_state_pod(api: ApiServer, pki: Pki, configmaps: dict[str, dict[str, str]]) -> pod.PodSpec:
    return pod.daemonset_pod(
        node_name=test_first_boot.NODE,
        configmaps=configmaps,
        service_account={"token": TOKEN, "ca.crt": pki.ca.read_text(), "namespace": "kube-system"},
        service_env={"KUBERNETES_SERVICE_HOST": CLUSTER_IP, "KUBERNETES_SERVICE_PORT": "443"},
    )


def resident_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    [kib] = [line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")]
    return int(kib) / 1024


def memory_request_mib() -> float:
    ds = pod.shipped(pod.DAEMONSET, "DaemonSet")
    [proxy] = ds["spec"]["template"]["spec"]["containers"]
    request = str(proxy["resources"]["requests"]["memory"])
    assert request.endswith("Mi"), request
    return float(request.removesuffix("Mi"))


def scrape_from(ns: str) -> int | None:
    """The status of GET /metrics at the node's address, port 10249, from ``ns``; None: no
    answer (nothing listens there)."""
    try:
        return test_first_boot.http_get_from(ns, test_first_boot.NODE_IP, 10249, "/metrics")[0]
    except OSError:
        return None


def test_the_end_state_syncs_after_a_reboot(
    control_plane: tuple[str, str, ApiServer, Pki], tmp_path: Path
) -> None:
    """Step 1 of the end state done (``api-server`` in nlproxy's ConfigMap), kube-proxy's
    ConfigMap deleted as step 3 allows: the node syncs, and after a reboot (every rule gone,
    the pod started again) it syncs again, through the API server's own address."""
    node_ns, cp_ns, api, pki = control_plane
    real = f"https://{test_first_boot.API_IP}:{api.port}"
    ours = dict(pod.shipped(pod.CONFIGMAP, "ConfigMap")["data"])
    ours["api-server"] = real  # the guide's `kubectl patch configmap nlproxy`
    spec = end_state_pod(api, pki, {"nlproxy": ours})  # no kube-proxy ConfigMap at all
    for boot in ("before", "after"):
        if boot == "after":  # a reboot: no rules at all, and so no ClusterIP
            sh("nft", "flush", "ruleset", ns=node_ns)
            assert readyz_through(node_ns, CLUSTER_IP, 443, pki) is None
        with synced_pod(spec, node_ns, tmp_path / boot) as (logs, pid):
            assert readyz_through(node_ns, CLUSTER_IP, 443, pki) == 200, boot
            # The guide's checks of a node.
            [starting] = logs.events("daemon.starting")
            assert starting["source"] == f"in-cluster, API server {real}", boot
            assert CLUSTER_IP not in starting["source"]
            tables = sh("nft", "list", "tables", ns=node_ns).split("\n")
            assert {t.strip() for t in tables if t.strip()} == {
                "table ip nlproxy",
                "table ip6 nlproxy",
            }, boot
            status = subprocess.run(
                ["ip", "netns", "exec", node_ns, sys.executable, "-m", "nlproxy", "status"],
                capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
            )  # fmt: skip
            assert status.returncode == 0, status.stdout + status.stderr
            assert scrape_from(cp_ns) == 200, boot
            # The DaemonSet asks for what an idle daemon of a small cluster holds, at least.
            assert resident_mib(pid) < memory_request_mib(), boot


@pytest.mark.parametrize("metrics", ["as kubeadm writes it", "as the guide sets it"])
def test_kube_proxys_config_conf_needs_the_metrics_address(
    control_plane: tuple[str, str, ApiServer, Pki], tmp_path: Path, metrics: str
) -> None:
    """``--config /var/lib/kube-proxy/config.conf``, kubeadm's file: its ``metricsBindAddress:
    ""`` keeps metrics on the node's loopback, out of Prometheus' reach; the guide's
    ``0.0.0.0:10249`` brings them back."""
    node_ns, cp_ns, api, pki = control_plane
    real = f"https://{test_first_boot.API_IP}:{api.port}"
    config = KUBEADM_CONFIG.read_text()
    assert 'metricsBindAddress: ""' in config
    if metrics == "as the guide sets it":
        config = config.replace('metricsBindAddress: ""', "metricsBindAddress: 0.0.0.0:10249")
    configmaps = {
        "nlproxy": dict(pod.shipped(pod.CONFIGMAP, "ConfigMap")["data"]),
        "kube-proxy": {
            "config.conf": config,
            "kubeconfig.conf": test_first_boot.kubeadm_kubeconfig(real),
        },
    }
    spec = end_state_pod(api, pki, configmaps)
    at = spec.argv.index("/etc/nlproxy/config.conf")
    spec.argv[at] = "/var/lib/kube-proxy/config.conf"  # the guide's tip of step 1
    with synced_pod(spec, node_ns, tmp_path / "pod"):
        assert readyz_through(node_ns, CLUSTER_IP, 443, pki) == 200
        code, _ = test_first_boot.http_get_from(node_ns, "127.0.0.1", 10249, "/metrics")
        assert code == 200  # served either way, on loopback at least
        if metrics == "as kubeadm writes it":
            assert scrape_from(cp_ns) is None
        else:
            assert scrape_from(cp_ns) == 200
