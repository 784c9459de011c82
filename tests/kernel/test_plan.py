"""``nlproxy plan`` on the real kernel: it prints the very batch the following ``run --once``
sends, the flows that run then deletes, nothing for an up-to-date kernel, and it changes nothing
(tables, generation, flows) itself."""

from __future__ import annotations

import copy
import json
import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from nlproxy.cli import main
from nlproxy.config import Flags, Settings, build_settings
from nlproxy.conntrack.kernel import Conntrack
from nlproxy.nft.backend import NftBackend
from nlproxy.nft.ir import Chain, Family, Operation, Rule, Ruleset, Table
from nlproxy.nft.readback import KernelReadBack, read_ruleset
from nlproxy.nft.reconcile import count_ops
from nlproxy.nft.tables import Tables
from nlproxy.operate.plan import dry_run
from nlproxy.operate.plan_render import report_json
from nlproxy.operate.plan_report import report
from nlproxy.operate.run import run_once
from nlproxy.proxy.naming import TABLE
from nlproxy.sync.fingerprint import RECORD_CHAIN
from nlproxy.sync.kernel import SyncKernel
from nlproxy.sync.result import as_programmed
from tests.kernel import topo
from tests.kernel.test_commands import NODE, world
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import TOKEN, write_kubeconfig
from tests.netns import sh

FLAGS = ["--node-name", NODE, "--cluster-cidr", "10.244.0.0/16", "--service-cidr", "10.96.0.0/16"]
Batch = tuple[Family, list[Operation]]


class Recording:
    """A real table that keeps each batch it commits."""

    def __init__(self, real: NftBackend, batches: list[Batch]) -> None:
        self.real, self.table, self.batches = real, real.table, batches

    def apply(self, ops: Sequence[Operation], known: Ruleset | None = None) -> object:
        done = self.real.apply(ops, known)
        self.batches.append((self.table.family, list(ops)))
        return done

    def check(self, ops: Sequence[Operation], known: Ruleset | None = None) -> None:
        self.real.check(ops, known)

    def known(self) -> Ruleset:
        return self.real.known()

    def forget(self) -> None:
        self.real.forget()

    def close(self) -> None:
        self.real.close()


def recording_kernel(ns: str, batches: list[Batch]) -> SyncKernel:
    def tables(table: Table) -> Tables:
        return Recording(NftBackend(table, netns=ns), batches)

    return SyncKernel(tables=tables, readback=KernelReadBack(TABLE, ns), flows=Conntrack(ns))


def settings(ns: str, directory: Path) -> Settings:
    return build_settings(
        Flags(
            manifests=directory,
            netns=ns,
            node_name=NODE,
            cluster_cidr="10.244.0.0/16",
            service_cidr="10.96.0.0/16",
        )
    )


def without_records(batches: Sequence[Batch]) -> list[Batch]:
    """The batches less the restart record's operations (the plan's sync keeps no record)."""
    out: list[Batch] = []
    for family, ops in batches:
        mine = [
            op
            for op in ops
            if not (isinstance(op.obj, Chain) and op.obj.name == RECORD_CHAIN)
            and not (isinstance(op.obj, Rule) and op.obj.chain == RECORD_CHAIN)
        ]
        if mine:
            out.append((family, mine))
    return out


def changed(objs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], tuple[str, str, str]]:
    """``objs`` with a UDP endpoint gone, a Service gone, one added and one given ClientIP
    affinity; and the gone endpoint's frontend (ClusterIP, port, endpoint)."""
    out = copy.deepcopy(objs)
    services = {o["metadata"]["name"]: o for o in out if o["kind"] == "Service"}
    slices = {o["metadata"]["labels"]["kubernetes.io/service-name"]: o for o in out
              if o["kind"] == "EndpointSlice"}  # fmt: skip
    udp = next(
        name
        for name, svc in services.items()
        if any(p.get("protocol") == "UDP" for p in svc["spec"]["ports"])
        and slices[name]["endpoints"]
    )
    gone = slices[udp]["endpoints"].pop(0)["addresses"][0]
    frontend = (services[udp]["spec"]["clusterIP"], "53", gone)
    last = sorted(services)[-1]
    if last != udp:
        out.remove(services.pop(last))
        out.remove(slices.pop(last))
    plain = next(n for n, s in services.items() if "sessionAffinity" not in s["spec"] and n != udp)
    services[plain]["spec"]["sessionAffinity"] = "ClientIP"
    out.append(topo.service("added", "10.96.9.9"))
    out.append(topo.endpoint_slice("added", [topo.endpoint("10.244.1.99", NODE)]))
    return out, frontend


def insert_flow(ns: str, dst: str, dport: str, endpoint: str, sport: int) -> None:
    sh(
        "conntrack", "-I", "-p", "udp", "-s", "192.168.0.9", "-d", dst, "--sport", str(sport),
        "--dport", dport, "-r", endpoint, "-q", "192.168.0.9", "--reply-port-src", "53",
        "--reply-port-dst", str(sport), "-t", "120", ns=ns,
    )  # fmt: skip


def kernel_state(ns: str) -> tuple[str, str, int]:
    """The whole ruleset as nft lists it, the conntrack table (each flow without the seconds it
    has left, which count down between two reads), and the ruleset's generation."""
    rb = KernelReadBack(TABLE, ns)
    try:
        gen = rb.generation()
    finally:
        rb.close()
    lines = sh("conntrack", "-L", ns=ns).splitlines()
    flows = sorted(re.sub(r"^(\S+\s+\d+\s+)\d+\s", r"\1", line) for line in lines)
    return sh("nft", "list", "ruleset", ns=ns), "\n".join(flows), gen


def plan_json(ns: str, directory: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    status = main(["--netns", ns, "plan", "--manifests", str(directory), "--json", *FLAGS])
    assert status == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_plan_is_the_batch_the_next_sync_sends(
    make_netns: Callable[[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = make_netns("plan-exact")
    first, second = tmp_path / "first", tmp_path / "second"
    objs = world(random.Random(7), 10)
    topo.write_manifests(first, objs)
    later, (vip, port, gone) = changed(objs)
    topo.write_manifests(second, later)

    # From nothing: the plan is every object of the first sync.
    planned = dry_run(settings(ns, first))
    sent: list[Batch] = []
    assert run_once(settings(ns, first), kernel=recording_kernel(ns, sent)) == 0
    assert planned.batches
    assert without_records(sent) == list(planned.batches)

    for sport in (4001, 4002):
        insert_flow(ns, vip, port, gone, sport)
    # Not a frontend's flow: neither the cleanup's nor the start-up sweep's, which deletes a
    # frontend's flows answered by anything but its endpoints (``sync/cleanup.py``).
    insert_flow(ns, "10.96.250.250", port, "10.244.200.1", 4003)

    # A change: the plan (as the command prints it) is what the next sync commits.
    before = {f: read_ruleset(f, TABLE, netns=ns) for f in (Family.IP, Family.IP6)}
    state = kernel_state(ns)
    shown = plan_json(ns, second, capsys)
    planned = dry_run(settings(ns, second))
    assert kernel_state(ns) == state, "the plan changed the kernel"
    sent = []
    assert run_once(settings(ns, second), kernel=recording_kernel(ns, sent)) == 0
    applied = without_records(sent)
    assert applied == list(planned.batches)
    after = {f: read_ruleset(f, TABLE, netns=ns) for f in (Family.IP, Family.IP6)}
    for rs in (*before.values(), *after.values()):
        assert rs is not None
        rs.chains.pop(RECORD_CHAIN, None)
        rs.rules.pop(RECORD_CHAIN, None)
    rendered = report_json(
        report(applied, before, {f: rs for f, rs in after.items() if rs is not None})
    )
    assert shown["batches"] == rendered["batches"]
    assert shown["changes"] is True
    counts: dict[str, int] = {}
    for family, ops in applied:
        counts[str(family)] = counts.get(str(family), 0) + count_ops(ops)
    assert shown["operations"] == counts

    # Its conntrack cleanup: the two flows answered by the removed endpoint, not the third.
    assert shown["conntrack_flows"] == 2
    [cleanup] = [c for s in shown["services"] for c in s["conntrack"] if c["flows"]]
    assert f"reply-src={gone}" in cleanup["filter"]
    remaining = sh("conntrack", "-L", "-p", "udp", ns=ns)
    assert gone not in remaining
    assert "10.244.200.1" in remaining

    # Per Service: the added one, the removed one, and the one given affinity are named.
    by_service = {s["service"]: s for s in shown["services"]}
    assert "default/added" in by_service
    assert {c["change"] for c in by_service["default/added"]["changes"]} == {"add"}


def test_an_up_to_date_kernel_has_no_changes_and_nothing_changes(
    make_netns: Callable[[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = make_netns("plan-same")
    d = tmp_path / "m"
    topo.write_manifests(d, world(random.Random(11), 8))
    assert run_once(settings(ns, d)) == 0
    state = kernel_state(ns)
    capsys.readouterr()
    assert main(["--netns", ns, "plan", "--manifests", str(d), "--exit-code", *FLAGS]) == 0
    assert capsys.readouterr().out.startswith("No changes:")
    assert plan_json(ns, d, capsys)["batches"] == []
    # A change is shown, and --exit-code says so; the kernel is as it was all along.
    topo.write_manifests(d, world(random.Random(12), 8))
    assert main(["--netns", ns, "plan", "--manifests", str(d), "--exit-code", *FLAGS]) == 1
    text = capsys.readouterr().out
    assert text.startswith("The next sync would send ")
    assert "Service default/s0" in text
    assert kernel_state(ns) == state


def test_config_previews_a_configuration_change(
    make_netns: Callable[[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = make_netns("plan-config")
    d = tmp_path / "m"
    topo.write_manifests(d, world(random.Random(13), 6))
    assert run_once(settings(ns, d)) == 0
    state = kernel_state(ns)
    new = tmp_path / "new.yaml"
    new.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
        "clusterCIDR: 10.244.0.0/16,10.248.0.0/16\n"
    )
    capsys.readouterr()
    args = ["--netns", ns, "plan", "--manifests", str(d), "--node-name", NODE,
            "--service-cidr", "10.96.0.0/16", "--config", str(new), "--json"]  # fmt: skip
    assert main(args) == 0
    shown = json.loads(capsys.readouterr().out)
    [shared] = [s for s in shown["services"] if s["service"] is None]
    assert {"change": "add", "kind": "element", "family": "ip",
            "object": "cluster-cidrs { 10.248.0.0/16 }"} in shared["changes"]  # fmt: skip
    assert kernel_state(ns) == state


def test_the_api_server_is_a_source_like_a_manifests_directory(
    make_netns: Callable[[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same objects from the API server and from files plan the same batch; an API server
    that cannot be reached is one line and exit 1."""
    ns = make_netns("plan-api")
    objs = world(random.Random(17), 6)
    d = topo.write_manifests(tmp_path / "m", objs)
    plural = {"Service": "services", "EndpointSlice": "endpointslices", "Node": "nodes"}
    api = ApiServer(token=TOKEN)
    api.start()
    try:
        for obj in objs:
            api.store.put(plural[obj["kind"]], obj)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api)
        from_files = plan_json(ns, d, capsys)
        capsys.readouterr()
        args = ["--netns", ns, "plan", "--kubeconfig", str(kubeconfig), "--json", *FLAGS]
        assert main(args) == 0
        from_api = json.loads(capsys.readouterr().out)
    finally:
        api.stop()
    assert from_api["changes"] is True
    assert from_api["batches"] == from_files["batches"]
    assert main(["--netns", ns, "plan", "--kubeconfig", str(kubeconfig), *FLAGS]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err


def test_a_table_a_running_daemon_owns_is_planned_all_the_same(
    make_netns: Callable[[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --owned-table only the daemon's socket may write the table, and the kernel refuses
    even a check from another: the batch is validated instead, and said so. The daemon's next
    sync (in place, from its last plan: its batch may be grouped otherwise) programs exactly
    the tables the plan planned."""
    from nlproxy.operate.inputs import cluster_inputs
    from nlproxy.operate.plan import source_changes
    from nlproxy.sync.syncer import Syncer

    ns = make_netns("plan-owned")
    first, second = tmp_path / "first", tmp_path / "second"
    objs = world(random.Random(23), 8)
    topo.write_manifests(first, objs)
    topo.write_manifests(second, changed(objs)[0])

    def snapshot(directory: Path) -> Any:
        s = settings(ns, directory)
        changes, errors, _ = source_changes(s)
        return cluster_inputs(s, changes, errors).snapshot

    sent: list[Batch] = []
    daemon = Syncer(settings(ns, first).proxy, recording_kernel(ns, sent), owner=True)
    try:
        daemon.sync(snapshot(first))
        state = kernel_state(ns)
        shown = plan_json(ns, second, capsys)
        planned = dry_run(settings(ns, second))
        assert kernel_state(ns) == state
        assert shown["changes"] is True
        assert [w for w in shown["warnings"] if "is owned by another process" in w]
        sent.clear()
        assert daemon.sync(snapshot(second)).incremental
        assert sent
        for family, rs in planned.after.items():
            now = read_ruleset(family, TABLE, netns=ns)
            assert now is not None
            want = as_programmed(rs)
            assert now.chains == want.chains
            assert now.sets == want.sets
            assert now.rules == want.rules
            assert {k: dict(v) for k, v in now.elements.items()} == {
                k: dict(v) for k, v in want.elements.items()
            }
    finally:
        daemon.close()
