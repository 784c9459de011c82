"""The daemon on the Kubernetes API (the in-repo API server, the real client): rules follow the
API, survive an outage untouched, and converge after a relist that includes deletions."""

from __future__ import annotations

import time
from pathlib import Path

from nlproxy.demo.echo import Result, tcp_request
from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import VIP_A, VIP_B, Probe, answered_by, daemon, put_service, wait_until
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import TOKEN, write_kubeconfig

testbed = topo.testbed


def test_rules_follow_the_api_and_survive_an_outage(testbed: Testbed, tmp_path: Path) -> None:
    api = ApiServer(token=TOKEN)
    api.start()
    try:
        api.store.put("nodes", testbed.node_manifest())
        put_service(api, testbed, "a", VIP_A, ["pod-a"])
        put_service(api, testbed, "b", VIP_B, ["pod-c"])
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api)
        with daemon(testbed, None, "--kubeconfig", str(kubeconfig)) as proc:
            assert answered_by(testbed, VIP_A, 4) == {"pod-a"}
            # A watch event: a new endpoint takes traffic within a second.
            put_service(api, testbed, "a", VIP_A, ["pod-a", "pod-b"])
            wait_until(lambda: answered_by(testbed, VIP_A) == {"pod-a", "pod-b"}, 1.0, "watch")
            # Outage: the API goes away; rules stay and traffic keeps flowing.
            with Probe(testbed, VIP_B) as probe:
                api.stop()
                time.sleep(2.0)
                assert proc.proc.poll() is None
            assert probe.failures == []
            assert probe.ok > 5
            # Meanwhile service b is deleted and history compacted: the watch must relist,
            # and the relist must apply the deletion.
            api.store.delete("endpointslices", "default", "b-ipv4")
            api.store.delete("services", "default", "b")
            api.store.compact()
            api.start()
            wait_until(
                lambda: (
                    tcp_request(testbed.pod("pod-a").netns, VIP_B, 80, timeout=0.5).result
                    is not Result.ANSWERED
                ),
                15.0,
                "service b removed after the relist",
            )
            assert answered_by(testbed, VIP_A) == {"pod-a", "pod-b"}
            assert proc.events("source.relist") or proc.events("source.listed")
    finally:
        api.stop()
