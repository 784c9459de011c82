"""run --once, rules and cleanup on the real kernel: convergence, zero-op re-runs, coexistence with
other software's tables, idempotent cleanup."""

from __future__ import annotations

import json
import random
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nlproxy.cli import main
from nlproxy.nft.ir import Family, Ruleset
from nlproxy.nft.readback import read_ruleset
from nlproxy.sync.fingerprint import take_record
from tests.kernel import topo

NODE = "node-x"

FOREIGN = """\
table ip nat {
    chain AWS-SNAT-CHAIN-0 {
        ip daddr != 10.244.0.0/16 counter snat to 192.168.50.2 fully-random
    }
    chain POSTROUTING {
        type nat hook postrouting priority srcnat; policy accept;
        jump AWS-SNAT-CHAIN-0
    }
}
table inet firewalld {
    set allowed { type ipv4_addr; elements = { 192.168.50.10 } }
    chain filter_INPUT {
        type filter hook input priority filter + 10; policy accept;
        ct state established,related accept
        ip saddr @allowed tcp dport 22 accept
    }
}
table ip filter {
    chain FORWARD { type filter hook forward priority filter; policy accept; }
}
"""


def node() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE, "labels": {"topology.kubernetes.io/zone": "z1"}},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.50.2"}]},
    }


def world(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """``n`` services of assorted kinds with random endpoints (a deterministic world)."""
    objs: list[dict[str, Any]] = [node()]
    for i in range(n):
        name = f"s{i}"
        kind = rng.choice(["ClusterIP", "NodePort", "LoadBalancer"])
        ports = [{"name": "tcp", "port": 80, "targetPort": 8080}]
        if rng.random() < 0.5:
            ports.append({"name": "dns", "port": 53, "targetPort": 53, "protocol": "UDP"})
        spec: dict[str, Any] = {"type": kind}
        if kind != "ClusterIP":
            for j, p in enumerate(ports):
                p["nodePort"] = 30000 + i * 2 + j
        if kind == "LoadBalancer":
            spec["status"] = {"loadBalancer": {"ingress": [{"ip": f"203.0.113.{i + 1}"}]}}
            spec["externalTrafficPolicy"] = rng.choice(["Cluster", "Local"])
        if rng.random() < 0.2:
            spec["sessionAffinity"] = "ClientIP"
        objs.append(topo.service(name, f"10.96.1.{i + 1}", ports, **spec))
        eps = [
            topo.endpoint(f"10.244.{rng.choice([1, 2])}.{rng.randint(2, 250)}", NODE)
            for _ in range(rng.randint(0, 4))
        ]
        slice_ports = [{"name": p["name"], "port": p["targetPort"]} for p in ports]
        for p, sp in zip(ports, slice_ports, strict=True):
            if "protocol" in p:
                sp["protocol"] = p["protocol"]
        objs.append(topo.endpoint_slice(name, eps, slice_ports))
    return objs


def run_once(netns: str, directory: Path, capture: pytest.CaptureFixture[str] | None = None) -> int:
    return main(
        [
            "--netns", netns, "--log-format", "json", "run", "--once",
            "--manifests", str(directory), "--node-name", NODE,
            "--cluster-cidr", "10.244.0.0/16", "--service-cidr", "10.96.0.0/16",
        ]
    )  # fmt: skip


def table(netns: str, family: Family) -> Ruleset:
    """The table without its restart record (whose generation differs between namespaces)."""
    rs = read_ruleset(family, "nlproxy", netns=netns)
    assert rs is not None
    assert take_record(rs) is not None
    return rs


def same(a: Ruleset, b: Ruleset) -> None:
    assert a.chains == b.chains
    assert a.sets == b.sets
    assert a.elements == b.elements
    assert a.rules == b.rules  # handles are not part of equality


def nft(netns: str, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", netns, "nft", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def ops_logged(capsys: pytest.CaptureFixture[str]) -> list[int]:
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines() if x.startswith("{")]
    return [x["ops"] for x in lines if x.get("event") == "sync.applied"]


def test_a_sequence_of_changes_converges_to_a_fresh_sync(
    make_netns: Callable[[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    changed, fresh = make_netns("conv"), make_netns("fresh")
    rng = random.Random(7)
    d = tmp_path / "m"
    for step in range(6):
        topo.write_manifests(d, world(rng, rng.randint(5, 25)))
        assert run_once(changed, d) == 0, f"step {step}"
    assert run_once(fresh, d) == 0
    for family in (Family.IP, Family.IP6):
        same(table(changed, family), table(fresh, family))
    capsys.readouterr()
    assert run_once(changed, d) == 0
    assert ops_logged(capsys) == [0]  # unchanged: nothing sent


def test_other_tables_are_never_touched(
    make_netns: Callable[[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = make_netns("foreign")
    nft(ns, "-f", "-", stdin=FOREIGN)
    before = nft(ns, "list", "ruleset")
    d = tmp_path / "m"
    topo.write_manifests(d, world(random.Random(1), 10))
    assert run_once(ns, d) == 0
    topo.write_manifests(d, world(random.Random(2), 4))
    assert run_once(ns, d) == 0
    listing = nft(ns, "list", "ruleset")
    for name in ("table ip nat", "table inet firewalld", "table ip filter"):
        assert _table_text(listing, name) == _table_text(before, name)
    assert main(["--netns", ns, "cleanup"]) == 0
    assert "removed: ip nlproxy, ip6 nlproxy" in capsys.readouterr().out
    assert nft(ns, "list", "ruleset") == before
    assert main(["--netns", ns, "cleanup"]) == 0  # idempotent
    assert "nothing to remove" in capsys.readouterr().out


def _table_text(listing: str, header: str) -> str:
    start = listing.index(header)
    end = listing.find("\ntable ", start + 1)
    return listing[start : end if end != -1 else None].strip()


def test_rules_prints_what_is_programmed(
    make_netns: Callable[[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = make_netns("rules")
    d = tmp_path / "m"
    objs = [
        node(),
        topo.service("web", "10.96.2.1"),
        topo.endpoint_slice("web", [topo.endpoint("10.244.1.7", NODE)]),
    ]
    topo.write_manifests(d, objs)
    assert run_once(ns, d) == 0
    capsys.readouterr()
    assert main(["--netns", ns, "rules"]) == 0
    text = capsys.readouterr().out
    assert "table ip nlproxy" in text
    assert "10.96.2.1 . tcp . 80" in text
    assert "10.244.1.7 . 8080" in text
    assert main(["--netns", ns, "rules", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {t["table"]["family"] for t in doc} == {"ip", "ip6"}


def test_empty_namespace_has_nothing_programmed(
    make_netns: Callable[[str], str], capsys: pytest.CaptureFixture[str]
) -> None:
    ns = make_netns("empty")
    assert main(["--netns", ns, "rules"]) == 0
    assert "programmed nothing" in capsys.readouterr().out


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--once"]) == 2
    assert "needs --manifests" in capsys.readouterr().err
    assert main(["run", "--once", "--manifests", str(tmp_path / "nope")]) == 2
    assert (
        main(["run", "--once", "--manifests", str(tmp_path), "--cluster-cidr", "10.0.0.0/33"]) == 2
    )
    assert "--cluster-cidr" in capsys.readouterr().err
    assert main(["--netns", "nlp-no-such-ns", "rules"]) == 2


def applied(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines() if x.startswith("{")]
    return [x for x in lines if x.get("event") == "sync.applied"]


def test_an_unchanged_restart_trusts_the_record_and_sends_nothing(
    make_netns: Callable[[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = make_netns("record")
    d = tmp_path / "m"
    topo.write_manifests(d, world(random.Random(3), 12))
    assert run_once(ns, d) == 0
    [first] = applied(capsys)
    assert first["ops"] > 0
    assert not first["unchanged"]
    before = {f: table(ns, f) for f in (Family.IP, Family.IP6)}
    assert run_once(ns, d) == 0
    [again] = applied(capsys)
    assert again["unchanged"]  # the records vouched for the tables: nothing planned or read
    assert again["ops"] == 0
    assert again["plan_ms"] == 0
    for family in (Family.IP, Family.IP6):
        same(table(ns, family), before[family])


def test_another_writer_between_runs_is_detected_and_repaired(
    make_netns: Callable[[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ns, fresh = make_netns("rec-drift"), make_netns("rec-fresh")
    d = tmp_path / "m"
    topo.write_manifests(d, world(random.Random(4), 12))
    assert run_once(ns, d) == 0
    assert run_once(fresh, d) == 0
    nft(ns, "delete", "element", "ip", "nlproxy", "cluster-ips", "{ 10.96.1.1 }")
    capsys.readouterr()
    assert run_once(ns, d) == 0
    [repair] = applied(capsys)
    assert not repair["unchanged"]
    assert repair["ops"] == 1  # read back, and the element put back
    for family in (Family.IP, Family.IP6):
        same(table(ns, family), table(fresh, family))
    # A write to another table only moves the generation: read back, nothing to repair.
    nft(ns, "add", "table", "ip", "someone-else")
    assert run_once(ns, d) == 0
    [other] = applied(capsys)
    assert (other["unchanged"], other["ops"]) == (False, 0)
    assert run_once(ns, d) == 0
    [trusted] = applied(capsys)  # the read-back wrote a fresh record
    assert (trusted["unchanged"], trusted["ops"]) == (True, 0)


def test_changed_manifests_are_not_taken_for_the_recorded_ones(
    make_netns: Callable[[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = make_netns("rec-change")
    d = tmp_path / "m"
    objs = world(random.Random(5), 8)
    topo.write_manifests(d, objs)
    assert run_once(ns, d) == 0
    eps = [topo.endpoint("10.244.1.77", NODE)]
    objs[-1] = topo.endpoint_slice("s7", eps, [{"name": "tcp", "port": 8080}])
    topo.write_manifests(d, objs)
    capsys.readouterr()
    assert run_once(ns, d) == 0
    [changed] = applied(capsys)
    assert not changed["unchanged"]
    assert changed["ops"] > 0
    assert "10.244.1.77" in nft(ns, "list", "map", "ip", "nlproxy", "backends")


def record_comment(ns: str) -> str:
    return nft(ns, "list", "chain", "ip", "nlproxy", "restart-record")


def test_other_files_of_the_same_cluster_are_recorded_for_the_next_run(
    make_netns: Callable[[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Files rewritten with the same objects (another format, a comment) plan the same: the run
    sends nothing and records their digest, so the next run need not parse them."""
    ns = make_netns("rec-files")
    d = tmp_path / "m"
    topo.write_manifests(d, world(random.Random(7), 6))
    assert run_once(ns, d) == 0
    first = record_comment(ns)
    for path in sorted(d.iterdir()):
        path.write_bytes(b"# rewritten\n" + path.read_bytes())
    capsys.readouterr()
    assert run_once(ns, d) == 0
    [same_plan] = applied(capsys)
    assert (same_plan["unchanged"], same_plan["ops"]) == (True, 0)
    second = record_comment(ns)
    assert second != first  # the new files' digest
    assert run_once(ns, d) == 0
    [again] = applied(capsys)
    assert (again["unchanged"], again["ops"]) == (True, 0)
    assert record_comment(ns) == second


def test_a_run_with_something_to_report_reports_it_again_when_restarted(
    make_netns: Callable[[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only a run with nothing to warn about lets the next one skip parsing: left-out objects
    are named on every run."""
    ns = make_netns("rec-bad")
    d = tmp_path / "m"
    objs = world(random.Random(6), 4)
    objs.append(topo.service("bad", "10.96.1.200", [{"name": "tcp", "port": 70000}]))
    topo.write_manifests(d, objs)
    assert run_once(ns, d) == 3
    first = capsys.readouterr().err
    assert "bad" in first
    assert "left out" in first
    for _ in range(2):
        assert run_once(ns, d) == 3
        again = capsys.readouterr().err
        assert "left out" in again
        assert "bad" in again


def test_a_cluster_ip_outside_the_service_range_is_refused_and_the_others_kept(
    make_netns: Callable[[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A manifest's ClusterIP of 8.8.8.8 would take that address from every pod on the node:
    outside ``--service-cidr`` it is named and left out, and the other Services are programmed."""
    ns = make_netns("out-of-range")
    d = tmp_path / "m"
    objs = world(random.Random(3), 3)
    objs.append(topo.service("rogue", "8.8.8.8", [{"name": "tcp", "port": 53}]))
    topo.write_manifests(d, objs)
    assert run_once(ns, d) == 3
    err = capsys.readouterr().err
    refused = [line for line in err.splitlines() if "8.8.8.8" in line]
    assert len(refused) == 1, err
    assert (
        "Service default/rogue: spec.clusterIP: 8.8.8.8 is outside the service ranges"
        in (refused[0])
    )
    listing = nft(ns, "list", "table", "ip", "nlproxy")
    assert "8.8.8.8" not in listing
    for i in range(3):
        assert f"10.96.1.{i + 1}" in listing
