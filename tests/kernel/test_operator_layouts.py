"""Every operator command over one Service of each layout, programmed by ``run --once``.

A ClientIP-affinity port keeps its endpoints in per-endpoint chains (``dnat to addr:port``), a
round-robin or consistent-hash port in its own map, a Local-policy port in ``backends-local``:
a command that reads only the global ``backends`` map sees none of them. Each command must name
each Service's endpoint, and an unreachable one must be reported by inspect and explain alike.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nlproxy.cli import main
from nlproxy.demo.testbed import Testbed
from tests.kernel.daemon import daemon, publish, wait_until
from tests.kernel.topo import answers, apply, ask, sh
from tests.objects import endpoint, endpoint_slice, service

EXIT_OK, EXIT_PROBLEM = 0, 4
LB = "nlproxy.io/load-balancing"

# Service name -> (cluster IP, the pod that is its one endpoint, extra spec, annotations)
LAYOUTS: dict[str, tuple[str, str, dict[str, Any], dict[str, str]]] = {
    "plain": ("10.96.5.1", "pod-a", {}, {}),
    "affinity": ("10.96.5.2", "pod-b", {"sessionAffinity": "ClientIP"}, {}),
    "local": (
        "10.96.5.3",
        "pod-c",
        {"type": "NodePort", "externalTrafficPolicy": "Local"},
        {},
    ),
    "hashed": ("10.96.5.4", "pod-a", {}, {LB: "consistent-hash"}),
    "rr": ("10.96.5.5", "pod-c", {}, {LB: "round-robin"}),
}
BROKEN = "affinity"  # its pod's veth goes down


def layouts(tb: Testbed) -> list[dict[str, Any]]:
    """One Service of each layout, with its EndpointSlice."""
    objects: list[dict[str, Any]] = []
    for i, (name, (vip, pod, spec, notes)) in enumerate(LAYOUTS.items()):
        ports = [{"name": "tcp", "port": 80, "targetPort": 8080}]
        if spec.get("type") == "NodePort":
            ports[0]["nodePort"] = 30500 + i
        svc = service(name, vip, ports, **spec)
        svc["metadata"]["annotations"] = notes
        p = tb.pod(pod)
        slice_ports = [{"name": "tcp", "port": 8080, "protocol": "TCP"}]
        objects += [svc, endpoint_slice(name, [endpoint(str(p.ipv4), p.node)], slice_ports)]
    return objects


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Testbed]:
    with Testbed(tag="lay") as tb:
        apply(tb, tmp_path / "m", layouts(tb))
        yield tb


def endpoint_of(tb: Testbed, name: str) -> str:
    return f"{tb.pod(LAYOUTS[name][1]).ipv4}:8080"


def cli(capsys: pytest.CaptureFixture[str], tb: Testbed, *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["--netns", tb.node.netns, *argv])
    out = capsys.readouterr().out
    return code, out


def test_every_command_sees_every_layouts_endpoints(
    node: Testbed, capsys: pytest.CaptureFixture[str]
) -> None:
    tb = node
    client = tb.pod("pod-r")  # on the other node: its flows are DNAT'd on this one
    for name, (vip, pod, _, _) in LAYOUTS.items():
        assert pod in answers(ask("tcp", client.netns, vip, 80, n=2)), name

    code, out = cli(capsys, tb, "rules")
    assert code == EXIT_OK
    for name in LAYOUTS:
        assert f"{tb.pod(LAYOUTS[name][1]).ipv4}" in out, name

    code, out = cli(capsys, tb, "services", "--json")
    assert code == EXIT_OK
    rows = json.loads(out)
    for name in LAYOUTS:
        backends = {
            f"{b['address']}:{b['port']}"
            for r in rows
            if r["service"] == f"default/{name}"
            for b in r["backends"]
            if b["programmed"]
        }
        assert backends == {endpoint_of(tb, name)}, name

    code, out = cli(capsys, tb, "inspect", "--json")
    assert code == EXIT_OK, out
    seen = {(r["service"], r["endpoint"]) for r in json.loads(out)}
    for name in LAYOUTS:
        assert (f"default/{name}", endpoint_of(tb, name)) in seen, (name, seen)

    for name in LAYOUTS:
        code, out = cli(capsys, tb, "explain", f"default/{name}", "--json")
        assert code == EXIT_OK, (name, out)
        assert endpoint_of(tb, name) in out, (name, out)

    code, out = cli(capsys, tb, "conntrack", "list", "--json")
    assert code == EXIT_OK
    for name in LAYOUTS:
        assert LAYOUTS[name][0] in out, name
        assert str(tb.pod(LAYOUTS[name][1]).ipv4) in out, name

    # One endpoint becomes unreachable: inspect and explain both name it.
    broken = tb.pod(LAYOUTS[BROKEN][1])
    sh(tb.node.netns, "ip", "link", "set", broken.host_veth, "down")
    code, out = cli(capsys, tb, "inspect", "--json")
    assert code == EXIT_PROBLEM, out
    bad = {(r["service"], r["endpoint"]) for r in json.loads(out) if not r["reachable"]}
    assert bad == {(f"default/{BROKEN}", endpoint_of(tb, BROKEN))}
    code, out = cli(capsys, tb, "inspect")
    assert code == EXIT_PROBLEM
    assert f"default/{BROKEN}:tcp/TCP\n  (no endpoints)" not in out
    code, out = cli(capsys, tb, "explain", f"default/{BROKEN}")
    assert endpoint_of(tb, BROKEN) in out
    assert "device is down" in out, out


def test_status_inspect_and_explain_agree_on_the_unreachable_endpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with (
        Testbed(tag="lays") as tb,
        daemon(tb, publish(tmp_path, [tb.node_manifest(), *layouts(tb)])) as d,
    ):
        broken = tb.pod(LAYOUTS[BROKEN][1])
        sh(tb.node.netns, "ip", "link", "set", broken.host_veth, "down")
        address = (
            *("--metrics-address", f"127.0.0.1:{d.metrics}"),
            *("--healthz-address", f"127.0.0.1:{d.healthz}"),
        )

        def unreachable() -> bool:
            code, out = cli(capsys, tb, "status", "--json", *address)
            return code == EXIT_OK and json.loads(out)["unreachable_endpoints"] >= 1

        wait_until(unreachable, 20, "status reports an unreachable endpoint")
        code, out = cli(capsys, tb, "status", "--json", *address)
        rows = json.loads(out)["unreachable"]
        assert [(r["service"], r["endpoint"].rsplit(":", 1)[0]) for r in rows] == [
            (f"default/{BROKEN}:tcp/TCP", str(broken.ipv4))
        ]
        code, out = cli(capsys, tb, "inspect", "--json")
        assert code == EXIT_PROBLEM
        bad = [
            (r["service"], r["port"], r["endpoint"]) for r in json.loads(out) if not r["reachable"]
        ]
        assert bad == [(f"default/{BROKEN}", "tcp/TCP", endpoint_of(tb, BROKEN))]
        code, out = cli(capsys, tb, "explain", f"default/{BROKEN}", "--json")
        unreachable_eps = [e for e in json.loads(out)["endpoints"] if not e["reachable"]]
        assert [e["endpoint"] for e in unreachable_eps] == [endpoint_of(tb, BROKEN)], out
