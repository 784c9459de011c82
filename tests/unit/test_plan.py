"""``nlproxy plan``'s report, from two plans diffed as a sync diffs them, and its usage errors
(one line and exit 2, before any kernel is asked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nlproxy.cli import main
from nlproxy.nft.ir import Family, Ruleset
from nlproxy.nft.reconcile import count_ops, diff
from nlproxy.operate.plan_render import render_text, report_json
from nlproxy.operate.plan_report import Report, report
from nlproxy.proxy import naming as n
from nlproxy.proxy.planner import plan
from nlproxy.sync.result import as_programmed
from tests.unit.builders import endpoint, eps_slice, node, port, service, snapshot
from tests.world import config

FAMILY = Family.IP


def _web(*ips: str) -> tuple[object, object]:
    return service("default", "web", "172.30.0.10"), eps_slice(
        "default", "web", [endpoint(ip) for ip in ips]
    )


def _planned(services: list[object], slices: list[object]) -> Ruleset:
    snap = snapshot(services, slices, node=node())  # type: ignore[arg-type]
    return plan(snap, config()).rulesets[FAMILY]


def _report(old: Ruleset | None, new: Ruleset) -> Report:
    have = as_programmed(old) if old is not None else None  # as read back: rules stamped
    ops = diff(new, have)
    return report([(FAMILY, ops)] if ops else [], {FAMILY: have}, {FAMILY: new})


def _changes(rep: Report, owner: str) -> set[tuple[str, str, str]]:
    [group] = [g for g in rep.groups if g.owner == owner]
    return {(c.sign, c.kind, c.name) for c in group.changes}


def test_an_endpoint_going_changes_its_service_and_a_service_going_is_removed() -> None:
    web, web_eps = _web("10.0.0.1", "10.0.0.2")
    gone = service("default", "gone", "172.30.0.20", [port("default", "gone", "dns", 53, "UDP")])
    gone_eps = eps_slice("default", "gone", [endpoint("10.0.0.9")], [("dns", 53, "UDP")])
    aff = service("default", "aff", "172.30.0.30")
    old = _planned([web, gone], [web_eps, gone_eps])
    web1, web1_eps = _web("10.0.0.1")
    new = _planned([web1, aff], [web1_eps])
    rep = _report(old, new)

    web_changes = _changes(rep, "default/web")
    assert ("~", "element", "service-ips") in web_changes  # goto cluster-ip-2 → cluster-ip-1
    assert ("-", "element", "backends") in web_changes  # the second endpoint's slot
    assert ("-", "element", "hairpin") in web_changes  # the endpoint's, so the Service's
    assert all(sign == "-" for sign, _, _ in _changes(rep, "default/gone"))
    assert ("-", "element", "service-ips") in _changes(rep, "default/gone")
    assert ("+", "element", "no-endpoint-services") in _changes(rep, "default/aff")
    # Shared dispatch chains follow the endpoint counts: none is any one Service's.
    assert ("-", "chain", "cluster-ip-2") in _changes(rep, "")
    assert ("-", "rule", "cluster-ip-2") in _changes(rep, "")
    assert not any(kind == "chain" for _, kind, _ in _changes(rep, "default/web"))

    # Every kernel operation of the batch is one step, each given to one owner.
    [(_, steps)] = rep.batches
    assert len(steps) == count_ops(diff(new, as_programmed(old)))
    assert rep.operations == {FAMILY: len(steps)}

    text = render_text(rep)
    assert text.startswith(f"The next sync would send {len(steps)} operations (ip {len(steps)})")
    assert "Service default/web\n" in text
    assert "      was { 172.30.0.10 . tcp . 80 " in text
    assert "fp=" not in text  # fingerprints are bookkeeping
    assert text.index("Service default/web") < text.index("Shared objects")
    shown = report_json(rep)
    assert shown["changes"] is True
    assert [s["service"] for s in shown["services"]][-1] is None
    assert sum(len(b["operations"]) for b in shown["batches"]) == len(steps)


@pytest.mark.parametrize("node_port", [None, 30080], ids=["clusterip", "node-port"])
def test_affinity_objects_belong_to_their_service_and_rules_show_what_differs(
    node_port: int | None,
) -> None:
    ports = [port("default", "sticky", "p80", 80, node_port=node_port)]
    two = eps_slice("default", "sticky", [endpoint("10.0.0.1"), endpoint("10.0.0.2")])
    one = eps_slice("default", "sticky", [endpoint("10.0.0.1")])
    sticky = service("default", "sticky", "172.30.0.40", ports, affinity_timeout=300)
    old = _planned([sticky], [two])
    new = _planned([sticky], [one])
    rep = _report(old, new)
    mine = _changes(rep, "default/sticky")
    # An endpoint is an element of the backends maps (and of the node port's learning map).
    assert ("-", "element", n.BACKENDS) in mine
    if node_port is not None:
        assert ("-", "element", n.NODEPORT_BACKENDS) in mine
        assert ("-", "element", n.AFFINITY_ENDPOINTS) in mine
    assert not any(kind in ("chain", "set") for _, kind, _ in mine)
    [group] = [g for g in rep.groups if g.owner == "default/sticky"]
    rules = [c for c in group.changes if c.kind == "rule"]
    # The new clients' chain is flushed and refilled: only the rules that differ (the jumps to
    # the shared chains of the endpoint count) are changes.
    assert rules
    assert all("10.0.0.2" in c.text or "dnat-2" in c.text or "dnat-1" in c.text for c in rules)
    assert not any(c.text.endswith("jump mark-for-masquerade") for c in rules if c.sign == "+")


def test_no_changes() -> None:
    web, web_eps = _web("10.0.0.1")
    rs = _planned([web], [web_eps])
    rep = _report(rs, rs)
    assert not rep.changed
    assert rep.groups == ()
    assert render_text(rep).startswith("No changes: ")
    assert report_json(rep)["batches"] == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        pytest.param(
            ["--manifests", "/nonexistent/dir"],
            "--manifests: /nonexistent/dir is not a directory",
            id="no-manifests-dir",
        ),
        pytest.param(
            ["--manifests", ".", "--config", "/nonexistent.yaml"],
            "/nonexistent.yaml",
            id="no-config-file",
        ),
        pytest.param(["--manifests", ".", "--masquerade-bit", "40"], "masquerade", id="bad-flag"),
        pytest.param(
            ["--kubeconfig", "/nonexistent/kubeconfig"],
            "/nonexistent/kubeconfig",
            id="no-kubeconfig",
        ),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["plan", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert says in err
    assert "Traceback" not in err


def test_bad_config_contents_are_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
        "clusterCIDR: not-a-cidr\n"
    )
    assert main(["plan", "--manifests", str(tmp_path), "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "'not-a-cidr' is not a CIDR" in err
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_no_source_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["plan"]) == 2
    assert "--kubeconfig: none given" in capsys.readouterr().err
