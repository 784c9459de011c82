"""SCTP Services with real SCTP associations, in an amd64 VM: this machine's kernel has no SCTP,
Debian's has (net/sctp a module, SCTP conntrack built into nf_conntrack).

The image's root file system (``make image``: the .deb installed into Debian bookworm) boots
under Debian bookworm's linux-image-amd64 (vm-tests/amd64/boot.sh: KVM when the machine's is
hardware-assisted, else a software CPU), with iproute2 added. In it, vm-tests/sctp/scenario.py
makes a node with a client namespace and pods on veths, runs ``nlproxy run --manifests`` with a
NodePort Service of protocol SCTP and its EndpointSlice, and makes associations with Python's
``socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP)``; it prints one ``== result NAME JSON`` line per
step, and these tests judge them. The VM runs once for the module.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.packaging.conftest import ROOT

SCENARIO = ROOT / "vm-tests/sctp/scenario.py"
# What the scenario needs that the image's root lacks: ip (netns, veth, addresses, routes).
VM_DEBS = "iproute2"
GATEWAY, CLIENT_POD = "10.244.1.1", "10.244.1.6"
POD_IPS = {"pod-a": "10.244.1.4", "pod-b": "10.244.1.5"}
VIP, PORT = "10.96.0.30", 3868
ASSOCIATIONS = 24


class Vm:
    """The VM's console and the scenario's results."""

    def __init__(self, console: str) -> None:
        self.console = console
        self.results: dict[str, Any] = {}
        for line in console.splitlines():
            if line.startswith("== result "):
                name, _, doc = line.removeprefix("== result ").partition(" ")
                self.results[name] = json.loads(doc)

    def __getitem__(self, step: str) -> Any:
        if step not in self.results:
            pytest.fail(f"the VM printed no result for {step!r}:\n{self.tail()}")
        return self.results[step]

    def tail(self) -> str:
        return self.console[-6000:]


@pytest.fixture(scope="module")
def vm(built: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Vm:
    work = tmp_path_factory.mktemp("sctp-vm")
    script = work / "script.sh"
    script.write_text(
        "cat >/tmp/scenario.py <<'SCENARIO'\n"
        f"{SCENARIO.read_text()}"
        "SCENARIO\n"
        "python3 /tmp/scenario.py\n"
        'echo "== scenario exit $?"\n'
    )
    log = work / "console.log"
    boot = subprocess.run(
        ["bash", str(ROOT / "vm-tests/amd64/boot.sh"), str(built["rootfs"]), str(script), str(log)],
        capture_output=True, text=True, timeout=1800, check=False,
        env={**os.environ, "NLPROXY_VM_DEBS": VM_DEBS},
    )  # fmt: skip
    console = log.read_text(errors="replace").replace("\r\n", "\n") if log.exists() else ""
    assert boot.returncode == 0, boot.stderr + console[-6000:]
    return Vm(console)


def test_the_vm_ran_the_scenario_to_its_end(vm: Vm) -> None:
    assert "== amd64 VM up: x86_64 " in vm.console
    assert "\n== scenario done\n" in vm.console, vm.tail()
    assert "\n== scenario exit 0\n" in vm.console, vm.tail()
    kernel = vm["kernel"]
    assert kernel["sctp_module"], kernel
    # A flow that outlives every wait of the scenario: when it disappears, a deletion did it.
    assert kernel["sctp_established_timeout"] > kernel["bound"], kernel
    daemon = vm["daemon"]
    assert daemon.get("event") == "sync.applied", daemon
    assert daemon["ops"] > 0


def _spread(result: dict[str, Any]) -> dict[str, int]:
    assert result["errors"] == [], result
    assert result["count"] == ASSOCIATIONS
    pods: dict[str, int] = result["pods"]
    assert sum(pods.values()) == ASSOCIATIONS
    return pods


@pytest.mark.parametrize(
    ("step", "source"),
    [
        # Off-cluster clients reach the endpoints masqueraded (detect-local by cluster CIDR; a
        # NodePort of Cluster policy): the pods see the node's address on their side.
        ("clusterip", GATEWAY),
        ("nodeport", GATEWAY),
        # A pod's own address stays: pod to pod through the ClusterIP is not masqueraded.
        ("pod-clusterip", CLIENT_POD),
    ],
)
def test_associations_reach_both_endpoints_with_the_right_source(
    vm: Vm, step: str, source: str
) -> None:
    result = vm[step]
    pods = _spread(result)
    assert set(pods) == set(POD_IPS), result  # both endpoints got associations
    assert result["peers"] == [source], result


FRONTENDS = {"clusterip": (VIP, PORT), "nodeport": ("172.18.0.2", 30868)}


def test_held_associations_have_an_established_sctp_flow(vm: Vm) -> None:
    held = vm["held"]
    assert set(held) == set(FRONTENDS), held
    for frontend, by_pod in held.items():
        assert set(by_pod) == set(POD_IPS), held
        for pod, h in by_pod.items():
            assert h["greeting"]["pod"] == pod
            [flow] = h["flows"]
            assert flow["proto"] == "sctp"
            assert flow["state"] == "ESTABLISHED", flow
            assert (flow["orig"]["dst"], flow["orig"]["dport"]) == FRONTENDS[frontend]
            assert flow["orig"]["sport"] == h["greeting"]["local_port"]
            assert flow["reply"]["src"] == POD_IPS[pod]
            assert "DNAT" in flow["flags"]


def test_a_removed_endpoints_sctp_flows_are_deleted_and_no_other(vm: Vm) -> None:
    removed = vm["removed"]
    gone, kept = removed["gone"], removed["kept"]
    assert removed["gone_flows_deleted"], removed
    assert removed["gone_flows_left"] == {f: [] for f in FRONTENDS}, removed
    # The daemon deleted them after its sync (kube-proxy's stale-flow cleanup: UDP and SCTP).
    flushed = [e for e in removed["events"] if e.get("component") == "sync"]
    assert flushed, removed["events"]
    assert sum(e["flows"] for e in flushed) >= len(FRONTENDS), flushed
    # The remaining endpoint's associations keep their flows, and keep working.
    assert set(removed["kept_flows"]) == set(FRONTENDS)
    for frontend, kept_flows in removed["kept_flows"].items():
        [flow] = kept_flows
        assert flow["reply"]["src"] == POD_IPS[kept], (gone, flow)
        assert flow["state"] == "ESTABLISHED"
        assert removed["kept_echo"][frontend] == {"echo": "still there"}, removed


@pytest.mark.parametrize("step", ["after-clusterip", "after-nodeport"])
def test_new_associations_reach_only_the_remaining_endpoint(vm: Vm, step: str) -> None:
    kept = vm["removed"]["kept"]
    result = vm[step]
    assert _spread(result) == {kept: ASSOCIATIONS}, result
    assert result["peers"] == [GATEWAY], result
