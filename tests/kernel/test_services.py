"""``nlproxy services`` on rules ``nlproxy run --once`` programmed in a test bed's node.

Services: ``web`` (NodePort, externalTrafficPolicy Local; a local and a remote ready endpoint,
and a terminating one nlproxy does not use), ``sticky`` (ClientIP affinity, 300 s), ``empty``
(no endpoints: rejected) and ``inner`` (internalTrafficPolicy Local, only a remote endpoint:
dropped). What the kernel alone tells is checked without ``--manifests``, the conditions and
policies the kernel cannot tell with it, and reachability after a pod's veth goes down.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from nlproxy.cli import main
from nlproxy.demo.testbed import Testbed
from nlproxy.log import configure
from tests.kernel import topo

testbed = topo.testbed
EXIT_USAGE = 2


@pytest.fixture(autouse=True)
def _log_to_this_tests_stderr() -> None:
    """``cli.main`` binds structlog to the stderr of the test that called it; rebind it here."""
    configure(level="warning")


def _objects(tb: Testbed) -> list[dict[str, Any]]:
    def ep(pod: str, **kw: bool) -> dict[str, Any]:
        p = tb.pod(pod)
        return topo.endpoint(str(p.ipv4), p.node, **kw)

    return [
        topo.service(
            "web",
            "10.96.0.10",
            ports=({"name": "tcp", "port": 80, "targetPort": 8080, "nodePort": 30080},),
            type="NodePort",
            externalTrafficPolicy="Local",
        ),
        topo.endpoint_slice(
            "web", [ep("pod-a"), ep("pod-r"), ep("pod-b", ready=False, terminating=True)]
        ),
        topo.service(
            "sticky",
            "10.96.0.11",
            sessionAffinity="ClientIP",
            sessionAffinityConfig={"clientIP": {"timeoutSeconds": 300}},
        ),
        topo.endpoint_slice("sticky", [ep("pod-c")]),
        topo.service("empty", "10.96.0.12"),
        topo.service("inner", "10.96.0.13", internalTrafficPolicy="Local"),
        topo.endpoint_slice("inner", [ep("pod-r")]),
    ]


@pytest.fixture
def programmed(testbed: Testbed, tmp_path: Path) -> Path:
    d = tmp_path / "m"
    topo.apply(testbed, d, _objects(testbed))
    return d


def services(
    capsys: pytest.CaptureFixture[str], tb: Testbed, *extra: str
) -> dict[str, dict[str, Any]]:
    """``services --json`` as frontend label → row."""
    assert main(["--netns", tb.node.netns, "services", "--json", *extra]) == 0
    return {row["frontend"]: row for row in json.loads(capsys.readouterr().out)}


def _backends(row: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{b['address']}:{b['port']}": b for b in row["backends"]}


def test_what_the_kernel_tells(
    testbed: Testbed, programmed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, r, c = (f"{testbed.pod(p).ipv4}:8080" for p in ("pod-a", "pod-r", "pod-c"))
    rows = services(capsys, testbed)
    assert set(rows) == {
        "10.96.0.10:80/TCP",
        "nodeport:30080/TCP",
        "10.96.0.11:80/TCP",
        "10.96.0.12:80/TCP",
        "10.96.0.13:80/TCP",
    }
    web = rows["10.96.0.10:80/TCP"]
    assert (web["port"], web["type"], web["state"]) == (
        "default/web:tcp/TCP",
        "ClusterIP",
        "dispatch",
    )
    got = _backends(web)
    assert set(got) == {a, r}  # the terminating pod-b is not used while others are ready
    assert (got[a]["state"], got[a]["where"], got[a]["reachable"]) == ("in use", "local", True)
    assert (got[r]["where"], got[r]["reachable"]) == ("remote", True)
    assert web["internal_traffic_policy"] is None  # the kernel cannot tell Cluster here
    assert web["session_affinity"] == "None"

    node_port = rows["nodeport:30080/TCP"]
    assert node_port["type"] == "NodePort"
    assert node_port["external_traffic_policy"] == "Local"
    assert set(_backends(node_port)) == {a}  # outside clients reach the local endpoint only
    assert set(node_port["cluster_backends"]) == {a, r}

    sticky = rows["10.96.0.11:80/TCP"]
    assert (sticky["session_affinity"], sticky["affinity_timeout_seconds"]) == ("ClientIP", 300)
    assert set(_backends(sticky)) == {c}

    assert (rows["10.96.0.12:80/TCP"]["state"], rows["10.96.0.12:80/TCP"]["backends"]) == (
        "reject",
        [],
    )
    assert rows["10.96.0.13:80/TCP"]["internal_traffic_policy"] == "Local"
    assert rows["10.96.0.13:80/TCP"]["state"] == "drop"


def test_manifests_add_conditions_and_policies(
    testbed: Testbed, programmed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = (f"{testbed.pod(p).ipv4}:8080" for p in ("pod-a", "pod-b"))
    rows = services(capsys, testbed, "--manifests", str(programmed), "--service", "default/web")
    assert set(rows) == {"10.96.0.10:80/TCP", "nodeport:30080/TCP"}
    web = rows["10.96.0.10:80/TCP"]
    got = _backends(web)
    assert (got[a]["state"], got[a]["programmed"], got[a]["node"]) == ("ready", True, "node1")
    assert (got[b]["state"], got[b]["programmed"]) == ("serving,terminating", False)
    assert web["internal_traffic_policy"] == "Cluster"
    assert rows["nodeport:30080/TCP"]["external_traffic_policy"] == "Local"


def test_unreachable_backend_and_table(
    testbed: Testbed, programmed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topo.sh(testbed.node.netns, "ip", "link", "set", testbed.pod("pod-c").host_veth, "down")
    c = f"{testbed.pod('pod-c').ipv4}:8080"
    rows = services(capsys, testbed, "--service", "default/sticky")
    (row,) = rows.values()
    assert _backends(row)[c]["reachable"] is False
    assert main(["--netns", testbed.node.netns, "services"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].split() == ["FRONTEND", "TYPE", "SERVICE", "PORT", "POLICY", "BACKENDS"]
    sticky = next(line for line in text if line.startswith("10.96.0.11:80/TCP"))
    assert "affinity=ClientIP/300s" in sticky
    assert f"1 => {c} (in use, UNREACHABLE: route {c[:-5]} dev " in sticky
    empty = next(line for line in text if line.startswith("10.96.0.12:80/TCP"))
    assert empty.endswith("(no backends: reject)")


@pytest.mark.parametrize(
    ("service", "message"),
    [
        pytest.param(
            "default/nope",
            "nlproxy: service default/nope: unknown: nothing is programmed for it "
            "(no --manifests given)\n",
            id="unknown",
        ),
        pytest.param(
            "web",
            "nlproxy: service 'web': is not NAMESPACE/NAME (lowercase DNS names)\n",
            id="not-ns-name",
        ),
    ],
)
def test_bad_service_exits_2(
    testbed: Testbed,
    programmed: Path,
    capsys: pytest.CaptureFixture[str],
    service: str,
    message: str,
) -> None:
    assert main(["--netns", testbed.node.netns, "services", "--service", service]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == message


def test_manifests_show_what_is_not_programmed(
    testbed: Testbed, programmed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    late = topo.service("late", "10.96.0.14", externalIPs=["192.0.2.14"])
    (programmed / "late.yaml").write_text(yaml.safe_dump(late))
    rows = services(capsys, testbed, "--manifests", str(programmed), "--service", "default/late")
    assert {label: (r["type"], r["state"]) for label, r in rows.items()} == {
        "10.96.0.14:80/TCP": ("ClusterIP", "not programmed"),
        "192.0.2.14:80/TCP": ("ExternalIP", "not programmed"),
    }
    assert main(["--netns", testbed.node.netns, "services", "--service", "default/late"]) == 2
    assert "unknown: nothing is programmed for it" in capsys.readouterr().err
