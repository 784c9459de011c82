"""The daemon under a role without ServiceCIDRs: it programs everything else at once, and the
drop rule for unallocated ClusterIPs appears when the permission is granted while it runs.
Under a role without EndpointSlices it says so once and programs nothing until granted; a watch
refused later makes /healthz not ready, with the reason, until granted again.

The in-repo API server answers 403 on ServiceCIDRs as kube-apiserver's RBAC authorizer does;
no ``--service-cidr`` is given, so the ServiceCIDR objects are the only source of the ranges.
Real TCP from a pod: an unallocated address inside the range is answered by a decoy until the
drop rule exists, and times out after.
"""

from __future__ import annotations

from pathlib import Path

from nlproxy.demo.echo import Result, tcp_request
from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import VIP_A, Daemon, answered_by, daemon, put_service, wait_until
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import TOKEN, write_kubeconfig
from tests.objects import service_cidr

testbed = topo.testbed

UNALLOCATED = "10.96.200.200"


def unallocated_result(tb: Testbed) -> Result:
    return tcp_request(tb.pod("pod-a").netns, UNALLOCATED, 80, timeout=1.0).result


def test_forbidden_service_cidrs_then_granted(testbed: Testbed, tmp_path: Path) -> None:
    api = ApiServer(token=TOKEN)
    api.start()
    try:
        api.store.put("nodes", testbed.node_manifest())
        api.store.put("servicecidrs", service_cidr("kubernetes", "10.96.0.0/16"))
        put_service(api, testbed, "a", VIP_A, ["pod-a", "pod-b"])
        api.forbid("servicecidrs")
        topo.decoy(testbed, UNALLOCATED)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api)
        # No --service-cidr: only the (forbidden) ServiceCIDR objects would give the ranges.
        with daemon(testbed, None, "--kubeconfig", str(kubeconfig), "--service-cidr", "") as d:
            assert answered_by(testbed, VIP_A, 20) == {"pod-a", "pod-b"}
            [said] = [e for e in d.events("source.kind_unavailable") if e["level"] == "warning"]
            assert (said["kind"], said["verb"], said["reason"]) == (
                "ServiceCIDR",
                "list",
                "forbidden",
            )
            assert "no drop rule" in said["meanwhile"]
            assert unallocated_result(testbed) is Result.REFUSED  # reached the decoy
            code, text = d.get(d.metrics, "/metrics")
            assert code == 200
            assert (
                'nlproxy_source_unavailable_kinds{kind="ServiceCIDR",reason="forbidden",'
                'verb="list"} 1.0' in text
            )
            assert d.get(d.healthz, "/healthz")[0] == 200  # an optional kind: still ready
            api.allow("servicecidrs")
            wait_until(
                lambda: unallocated_result(testbed) is Result.TIMEOUT,
                40.0,
                "drop rule for unallocated ClusterIPs after the grant",
            )
            assert d.events("source.kind_available")
            assert "nlproxy_source_unavailable_kinds{" not in d.get(d.metrics, "/metrics")[1]
            assert answered_by(testbed, VIP_A, 20) == {"pod-a", "pod-b"}
    finally:
        api.stop()


def test_forbidden_endpoint_slices_are_said_once_then_granted(
    testbed: Testbed, tmp_path: Path
) -> None:
    api = ApiServer(token=TOKEN)
    api.start()
    d = None
    try:
        api.store.put("nodes", testbed.node_manifest())
        put_service(api, testbed, "a", VIP_A, ["pod-a"])
        api.forbid("endpointslices", "list")
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api)
        d = Daemon(testbed, None, "--kubeconfig", str(kubeconfig))
        slices = "/apis/discovery.k8s.io/v1/endpointslices"
        wait_until(lambda: sum(p == slices for p, _ in api.requests) >= 3, 20.0, "retries")
        said = [e for e in d.events("source.kind_unavailable") if e["level"] != "debug"]
        assert [(e["level"], e["kind"], e["verb"]) for e in said] == [
            ("error", "EndpointSlice", "list")
        ]
        assert not d.events("sync.applied")  # nothing programmed from a partial view
        assert answered_by(testbed, VIP_A, 2) == set()
        api.allow("endpointslices")
        d.wait_ready(timeout=40)
        assert answered_by(testbed, VIP_A, 4) == {"pod-a"}
        assert d.events("source.kind_available")
        # Refused later (the watch, after a reconnect): not ready once the refusal outlasts
        # the grace (REFUSAL_GRACE, 10 s), with the reason; the rules stay and traffic flows;
        # ready again once granted.
        api.forbid("endpointslices", "watch")
        api.drop_connections()
        wait_until(lambda: d.get(d.healthz, "/healthz")[0] == 503, 40.0, "not ready")
        assert "EndpointSlice: watch forbidden" in d.get(d.healthz, "/healthz")[1]
        assert answered_by(testbed, VIP_A, 2) == {"pod-a"}
        api.allow("endpointslices")
        wait_until(lambda: d.get(d.healthz, "/healthz")[0] == 200, 40.0, "ready again")
    finally:
        if d is not None:
            d.kill()
        api.stop()
