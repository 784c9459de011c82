"""Services cannot take traffic that is not theirs (CVE-2020-8554 and worse), with real packets.

Before: an externalIP equal to another Service's ClusterIP took that Service's traffic, a
duplicate ClusterIP went to whichever Service was written last (exit 0, no log), and an
externalIP of 127.0.0.1 took the node's own listener on that port. Now the older Service keeps a
frontend, addresses no Service may take are refused, each is named, ``run --once`` exits 3, and
everything else is programmed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nlproxy.demo.echo import EchoServer, Result, tcp_request
from nlproxy.demo.testbed import Testbed
from tests.kernel import topo

testbed = topo.testbed

OLD, NEW = "2024-01-01T00:00:00Z", "2025-06-01T00:00:00Z"
DNS = "10.96.0.10"


def svc(
    tb: Testbed, name: str, vip: str, pod: str, created: str, **spec: Any
) -> list[dict[str, Any]]:
    service = topo.service(name, vip, **spec)
    service["metadata"]["creationTimestamp"] = created
    ep = topo.endpoint(str(tb.pod(pod).ipv4), tb.node.name)
    return [service, topo.endpoint_slice(name, [ep])]


def who(tb: Testbed, ns: str, addr: str, n: int = 6) -> set[str]:
    out = set()
    for _ in range(n):
        o = tcp_request(ns, addr, 80, timeout=1.0)
        out.add(o.pod if o.result is Result.ANSWERED else str(o.result))
    return out


def test_conflicts_and_special_addresses_are_refused_and_named(
    testbed: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    listener = EchoServer(testbed.node.netns, "node-listener", [80])
    listener.start()
    try:
        objects = [
            testbed.node_manifest(),
            *svc(testbed, "dns", DNS, "pod-a", OLD),
            # Younger: an externalIP that is dns's ClusterIP, and a copy of dns's ClusterIP.
            *svc(testbed, "thief", "10.96.0.20", "pod-b", NEW, externalIPs=[DNS]),
            *svc(testbed, "copy", DNS, "pod-c", NEW),
            # The node's own loopback listener on port 80.
            *svc(testbed, "lo", "10.96.0.30", "pod-b", NEW, externalIPs=["127.0.0.1"]),
        ]
        d = topo.write_manifests(tmp_path / "m", objects)
        assert topo.run_once(testbed, d) == 3
        err = capsys.readouterr().err
        assert (
            "left out: Service default/thief: spec.externalIPs: 10.96.0.10 is the ClusterIP of "
            "Service default/dns; 10.96.0.10 left out" in err
        )
        assert (
            "left out: Service default/copy: ClusterIP 10.96.0.10 is also Service default/dns's "
            "(older); left out" in err
        )
        assert "Service default/lo: spec.externalIPs: 127.0.0.1 is a loopback address" in err
        client = testbed.pod("pod-r").netns
        assert who(testbed, client, DNS) == {"pod-a"}  # dns keeps its traffic
        assert who(testbed, client, "10.96.0.20") == {"pod-b"}  # thief's own ClusterIP works
        assert who(testbed, client, "10.96.0.30") == {"pod-b"}
        assert who(testbed, testbed.node.netns, "127.0.0.1") == {"node-listener"}
    finally:
        listener.stop()


def test_external_ip_cidrs_allow_only_their_ranges(
    testbed: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    objects = [
        testbed.node_manifest(),
        *svc(testbed, "ok", "10.96.0.40", "pod-a", OLD, externalIPs=["203.0.113.7"]),
        *svc(testbed, "no", "10.96.0.41", "pod-b", OLD, externalIPs=["198.51.100.7"]),
    ]
    d = topo.write_manifests(tmp_path / "m", objects)
    assert topo.run_once(testbed, d, "--external-ip-cidrs", "203.0.113.0/24") == 3
    err = capsys.readouterr().err
    assert (
        "Service default/no: spec.externalIPs: 198.51.100.7 is outside --external-ip-cidrs" in err
    )
    client = testbed.pod("pod-c").netns
    assert who(testbed, client, "203.0.113.7") == {"pod-a"}
    assert "pod-b" not in who(testbed, client, "198.51.100.7", n=2)
    assert who(testbed, client, "10.96.0.41") == {"pod-b"}  # the rest of the Service works
    # Without the flag, as kube-proxy: any address outside the special ones.
    assert topo.run_once(testbed, d) == 0
    assert who(testbed, client, "198.51.100.7") == {"pod-b"}


def test_a_bad_range_is_a_usage_error(
    testbed: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = topo.write_manifests(tmp_path / "m", [testbed.node_manifest()])
    assert topo.run_once(testbed, d, "--external-ip-cidrs", "203.0.113.0/33") == 2
    assert "--external-ip-cidrs" in capsys.readouterr().err


def test_the_daemon_names_each_refusal_once_and_gives_it_back(
    testbed: Testbed, tmp_path: Path
) -> None:
    from tests.kernel.daemon import daemon, publish, wait_until

    dns = svc(testbed, "dns", DNS, "pod-a", OLD)
    thief = svc(testbed, "thief", "10.96.0.20", "pod-b", NEW, externalIPs=[DNS])
    d = publish(tmp_path / "m", [testbed.node_manifest(), *dns, *thief])
    client = testbed.pod("pod-r").netns
    with daemon(testbed, d) as proc:
        assert who(testbed, client, DNS) == {"pod-a"}
        (said,) = proc.events("service.refused")
        assert said["error"].startswith("Service default/thief: spec.externalIPs: 10.96.0.10")
        metrics = proc.get(proc.metrics, "/metrics")[1]
        assert "nlproxy_refused_service_frontends 1.0" in metrics
        # dns goes: the address is free, and thief takes it.
        publish(d, [testbed.node_manifest(), *thief])
        wait_until(lambda: who(testbed, client, DNS, 2) == {"pod-b"}, 5, "thief takes the address")
        assert "nlproxy_refused_service_frontends 0.0" in proc.get(proc.metrics, "/metrics")[1]
        assert len(proc.events("service.refused")) == 1
