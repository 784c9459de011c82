"""``nlproxy compare`` against real kube-proxy v1.36.3 rulesets (tests/data): each loaded
with ``nft -f`` into a namespace and compared with nlproxy's plan of the objects kube-proxy was
served; then the same rules against deliberately changed objects, every change found."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from nlproxy.cli import main
from tests.netns import sh

REFERENCE = Path(__file__).parent.parent / "data" / "kube-proxy-rulesets"
FLAGS = ["--node-name", "kind-worker", "--cluster-cidr", "10.244.0.0/16,fd00:10:244::/56"]


@pytest.fixture(scope="module")
def reference() -> Path:
    if not (REFERENCE / "api-objects.yaml").is_file():
        pytest.fail(f"test data missing: {REFERENCE} (kube-proxy's reference rulesets)")
    return REFERENCE


def kube_proxy_node(make_netns: Callable[[str], str], reference: Path, run: str) -> str:
    ns = make_netns("cmp")
    sh("nft", "-f", str(reference / run / "ruleset.nft"), ns=ns)
    return ns


def compare(ns: str, objects: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, Any]:
    capsys.readouterr()
    status = main(["--netns", ns, "compare", "--manifests", str(objects), "--json", *FLAGS])
    return status, json.loads(capsys.readouterr().out)


def served(reference: Path, directory: Path) -> Path:
    directory.mkdir()
    shutil.copy(reference / "api-objects.yaml", directory / "objects.yaml")
    return directory


def test_nftables_mode_is_equivalent(
    make_netns: Callable[[str], str],
    reference: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ns = kube_proxy_node(make_netns, reference, "nftables")
    status, cert = compare(ns, served(reference, tmp_path / "m"), capsys)
    assert status == 0, cert["summary"]
    assert cert["equivalent"] is True
    assert cert["kube_proxy_tables"] == ["ip", "ip6"]
    assert not [o for o in cert["outcomes"] if o["differs"]]
    outcomes = cert["outcomes"]
    # What was compared: every kind of frontend and client, and outcomes of every kind.
    assert {o["frontend"] for o in outcomes} == {
        "cluster-ip", "node-port", "external-ip", "load-balancer",
    }  # fmt: skip
    assert {o["client"] for o in outcomes} >= {
        "a pod on this node", "a pod on another node", "the node itself",
        "a client outside the cluster", "an outside client in loadBalancerSourceRanges",
    }  # fmt: skip
    assert {o["kube_proxy"]["verdict"] for o in outcomes} == {"ACCEPT", "REJECT", "DROP"}
    assert {o["family"] for o in outcomes} == {"ip", "ip6"}
    local = [
        o
        for o in outcomes
        if o["service"] == "shop/ingress-local:https/TCP"
        and o["frontend"] == "node-port"
        and o["client"] == "a client outside the cluster"
    ]
    assert [o["kube_proxy"]["endpoints"] for o in local] == [["10.244.1.8:8443"]]
    assert cert["summary"].endswith(": equivalent")


def test_masquerade_all_differs_only_by_design(
    make_netns: Callable[[str], str],
    reference: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ns = kube_proxy_node(make_netns, reference, "nftables-masquerade-all")
    status, cert = compare(ns, served(reference, tmp_path / "m"), capsys)
    assert status == 0, cert["summary"]
    designed = [o for o in cert["outcomes"] if o["differs"]]
    assert designed
    for o in designed:
        assert "--masquerade-all" in o["by_design"]
        assert o["kube_proxy"]["masquerade"] is True
        assert o["nlproxy"]["masquerade"] is False
        assert o["client"] in ("a pod on this node", "a pod on another node")
        assert o["kube_proxy"]["endpoints"] == o["nlproxy"]["endpoints"]
    assert "differences by design" in cert["summary"]


def test_changed_objects_are_found_different_frontend_by_frontend(
    make_netns: Callable[[str], str],
    reference: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ns = kube_proxy_node(make_netns, reference, "nftables")
    docs = [d for d in yaml.safe_load_all((reference / "api-objects.yaml").read_text()) if d]
    for d in docs:
        name = d["metadata"]["name"]
        if d["kind"] == "EndpointSlice" and name == "frontend-7kq2x":
            d["endpoints"][1]["conditions"] = {"ready": False, "serving": False}
        if d["kind"] == "Service" and name == "storefront-lb":
            d["spec"]["loadBalancerSourceRanges"].append("192.0.2.0/24")
        if d["kind"] == "Service" and name == "web-nodeport":
            d["spec"]["externalTrafficPolicy"] = "Local"
    changed = tmp_path / "changed"
    changed.mkdir()
    (changed / "objects.yaml").write_text(yaml.safe_dump_all(docs))
    status, cert = compare(ns, changed, capsys)
    assert status == 4
    assert cert["equivalent"] is False
    differ = [o for o in cert["outcomes"] if o["differs"]]
    assert {o["service"] for o in differ} == {
        "shop/frontend:http/TCP", "shop/storefront-lb:http/TCP", "shop/web-nodeport:http/TCP",
    }  # fmt: skip
    assert not [o for o in differ if "by_design" in o]
    frontend = [o for o in differ if o["service"] == "shop/frontend:http/TCP"]
    assert len(frontend) == 4  # every kind of client of its one frontend
    assert all(o["nlproxy"]["endpoints"] == ["10.244.1.5:8080"] for o in frontend)
    assert all("10.244.2.7 is not ready" in o["words"] for o in frontend)
    [lb] = [o for o in differ if o["service"] == "shop/storefront-lb:http/TCP"]
    assert (lb["client"], lb["kube_proxy"]["verdict"], lb["nlproxy"]["verdict"]) == (
        "a client outside the cluster", "DROP", "ACCEPT",
    )  # fmt: skip
    outside = [o for o in differ if o["service"] == "shop/web-nodeport:http/TCP"
               and o["client"] == "a client outside the cluster"]  # fmt: skip
    assert [o["nlproxy"]["endpoints"] for o in outside] == [["10.244.1.7:8080"]]
    # The text names each difference in words, and sums up.
    capsys.readouterr()
    assert main(["--netns", ns, "compare", "--manifests", str(changed), *FLAGS]) == 4
    text = capsys.readouterr().out.splitlines()
    assert text[-1].endswith(f": {len(differ)} differ")
    assert (
        "differs: shop/frontend:http/TCP from a pod on this node (10.244.1.254) to ClusterIP "
        "10.96.10.10:80: kube-proxy sends to 2 endpoints (10.244.1.5:8080, 10.244.2.7:8080), "
        "nlproxy sends to 1 endpoint (10.244.1.5:8080) (10.244.2.7 is not ready, on node "
        "kind-worker2)"
    ) in text


def test_a_node_without_kube_proxy_is_one_line(
    make_netns: Callable[[str], str],
    reference: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ns = make_netns("cmp-none")
    capsys.readouterr()
    objects = served(reference, tmp_path / "m")
    assert main(["--netns", ns, "compare", "--manifests", str(objects), *FLAGS]) == 1
    err = capsys.readouterr().err
    assert err == "nlproxy: compare: no kube-proxy nftables table on this node\n"


def test_iptables_mode_is_named_and_declined(
    make_netns: Callable[[str], str],
    reference: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ns = make_netns("cmp-ipt")
    rules = (reference / "iptables" / "iptables-save.txt").read_text()
    sh("iptables-restore", ns=ns, input_=rules)
    capsys.readouterr()
    objects = served(reference, tmp_path / "m")
    assert main(["--netns", ns, "compare", "--manifests", str(objects), *FLAGS]) == 1
    err = capsys.readouterr().err
    assert err.startswith("nlproxy: compare: kube-proxy runs in iptables (or IPVS) mode")
    assert "KUBE-* chains in table ip nat" in err
    assert err.endswith("compare reads kube-proxy's nftables mode only\n")
