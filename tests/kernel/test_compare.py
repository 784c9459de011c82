"""``nlproxy compare`` against real kube-proxy v1.36.3 rulesets (tests/data): each loaded
with ``nft -f`` into a namespace and compared with nlproxy's plan of the objects kube-proxy was
served; then the same rules against deliberately changed objects, every change found."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
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


KUBE_PROXY_COMMAND_LINE = [
    "--hostname-override=kind-worker", "--proxy-mode=iptables",
    "--cluster-cidr=10.244.0.0/16,fd00:10:244::/56", "--conntrack-max-per-core=0",
    "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0", "--v=2",
]  # fmt: skip
"""The flags kube-proxy made the iptables rulesets with (the reference's runs.json)."""


@dataclass(frozen=True, slots=True)
class Comparer:
    """What each comparison here uses: namespaces made for the test, kube-proxy's reference
    rulesets and the objects it was served, a directory, and what ``compare`` prints."""

    make_netns: Callable[[str], str]
    reference: Path
    tmp_path: Path
    capsys: pytest.CaptureFixture[str]

    def nftables_node(self, run: str) -> str:
        """A namespace holding kube-proxy's nftables rules of ``run``."""
        ns = self.make_netns("cmp")
        sh("nft", "-f", str(self.reference / run / "ruleset.nft"), ns=ns)
        return ns

    def iptables_node(self, run: str, extra: str = "") -> str:
        """A namespace holding kube-proxy's iptables-mode rules of ``run`` (and ``extra``
        lines, iptables-restore input for table nat, loaded after them without a flush)."""
        ns = self.make_netns("cmp-ipt")
        for name in NFACCT:
            sh("nfacct", "add", name, ns=ns)
        run_dir = self.reference / run
        sh("iptables-restore", ns=ns, input_=(run_dir / "iptables-save.txt").read_text())
        sh("ip6tables-restore", ns=ns, input_=(run_dir / "ip6tables-save.txt").read_text())
        if extra:
            sh("iptables-restore", "--noflush", ns=ns, input_=extra)
        return ns

    def node(self, mode: str, run: str) -> str:
        """A namespace holding kube-proxy's rules of ``mode`` for the reference's ``run`` (its
        suffix: ``""`` or ``"-masquerade-all"``)."""
        if mode == "iptables":
            return self.iptables_node(f"iptables{run}")
        return self.nftables_node(f"nftables{run}")

    def served(self) -> Path:
        """The objects kube-proxy was served, as a manifests directory."""
        directory = self.tmp_path / "m"
        if not directory.is_dir():
            directory.mkdir()
            shutil.copy(self.reference / "api-objects.yaml", directory / "objects.yaml")
        return directory

    def compare(
        self, ns: str, objects: Path | None = None, flags: list[str] = FLAGS
    ) -> tuple[int, Any]:
        """``compare --json`` in ``ns`` of ``objects`` (else the served ones): (status, its
        certificate)."""
        status, out, _ = self.text(ns, objects, "--json", *flags)
        return status, json.loads(out)

    def text(self, ns: str, objects: Path | None = None, *flags: str) -> tuple[int, str, str]:
        """``compare`` in ``ns`` of ``objects`` (else the served ones): (status, out, err)."""
        self.capsys.readouterr()
        where = str(objects or self.served())
        status = main(["--netns", ns, "compare", "--manifests", where, *(flags or FLAGS)])
        out = self.capsys.readouterr()
        return status, out.out, out.err


@pytest.fixture
def cmp(
    make_netns: Callable[[str], str],
    reference: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> Comparer:
    return Comparer(make_netns, reference, tmp_path, capsys)


def test_nftables_mode_is_equivalent(cmp: Comparer) -> None:
    status, cert = cmp.compare(cmp.nftables_node("nftables"))
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


def changed_objects(reference: Path, tmp_path: Path, *, cart_port: int | None = None) -> Path:
    """The reference objects with three deliberate changes (a not-ready endpoint of frontend, a
    source range more on storefront-lb, a Local policy on web-nodeport) and, with
    ``cart_port``, cart's port moved: a manifests directory of them."""
    docs = [d for d in yaml.safe_load_all((reference / "api-objects.yaml").read_text()) if d]
    for d in docs:
        name = d["metadata"]["name"]
        if d["kind"] == "EndpointSlice" and name == "frontend-7kq2x":
            d["endpoints"][1]["conditions"] = {"ready": False, "serving": False}
        if d["kind"] == "Service" and name == "storefront-lb":
            d["spec"]["loadBalancerSourceRanges"].append("192.0.2.0/24")
        if d["kind"] == "Service" and name == "web-nodeport":
            d["spec"]["externalTrafficPolicy"] = "Local"
        if d["kind"] == "Service" and name == "cart" and cart_port is not None:
            d["spec"]["ports"][0]["port"] = cart_port
    changed = tmp_path / "changed"
    changed.mkdir()
    (changed / "objects.yaml").write_text(yaml.safe_dump_all(docs))
    return changed


def test_a_node_without_kube_proxy_is_one_line(cmp: Comparer) -> None:
    status, _, err = cmp.text(cmp.make_netns("cmp-none"))
    assert status == 1
    assert err == (
        "nlproxy: compare: no kube-proxy rules on this node (neither its nftables tables nor "
        "its iptables chains)\n"
    )


# ---------------------------------------------------------------------------------------------
# iptables mode, through iptables-nft: the same comparison over the compat expressions

NFACCT = ("ct_state_invalid_dropped_pkts", "localhost_nps_accepted_pkts")
"""The counters kube-proxy's iptables mode creates before its rules name them."""
UNPROXIED = ("(port not served)", "(no Service)")


@pytest.fixture(scope="module")
def iptables_nft() -> None:
    """iptables-restore on the nf_tables backend and nfacct (make deps installs both)."""
    missing = [
        t for t in ("iptables-restore", "ip6tables-restore", "nfacct") if not shutil.which(t)
    ]
    if missing:
        pytest.fail(f"missing tools: {', '.join(missing)} (make deps installs them)")
    version = sh("iptables-restore", "--version")
    if "nf_tables" not in version:
        pytest.fail(f"iptables-restore is not the iptables-nft backend: {version.strip()}")


def test_iptables_mode_is_equivalent_but_for_what_it_leaves_unproxied(
    iptables_nft: None, cmp: Comparer
) -> None:
    ns = cmp.iptables_node("iptables")
    # compare is given kube-proxy's own command line, as plan and run take it.
    status, cert = cmp.compare(ns, flags=KUBE_PROXY_COMMAND_LINE)
    assert status == 0, cert["summary"]
    assert cert["equivalent"] is True
    assert (cert["kube_proxy_mode"], cert["kube_proxy_tables"]) == ("iptables", ["ip", "ip6"])
    outcomes = cert["outcomes"]
    assert {o["frontend"] for o in outcomes} == {
        "cluster-ip", "node-port", "external-ip", "load-balancer",
    }  # fmt: skip
    assert {o["family"] for o in outcomes} == {"ip", "ip6"}
    # Every Service frontend behaves the same; only connections no Service port answers differ,
    # each named by design: iptables mode routes them on, nlproxy refuses them.
    designed = [o for o in outcomes if o["differs"]]
    assert designed
    for o in designed:
        assert o["service"].endswith(UNPROXIED), o["words"]
        assert "kube-proxy's iptables mode has no rule" in o["by_design"]
        assert (o["kube_proxy"]["verdict"], o["kube_proxy"]["endpoints"]) == ("ACCEPT", [])
        assert o["nlproxy"]["verdict"] in ("REJECT", "DROP")
    served_ = [o for o in outcomes if not o["service"].endswith(UNPROXIED)]
    assert not [o for o in served_ if o["differs"]]
    assert {o["kube_proxy"]["verdict"] for o in served_} == {"ACCEPT", "REJECT", "DROP"}

    def kube(service: str, frontend: str, client: str) -> list[list[str]]:
        return [
            o["kube_proxy"]["endpoints"]
            for o in served_
            if (o["service"], o["frontend"], o["client"]) == (service, frontend, client)
        ]

    # Read from the compat expressions: statistic's random choice reaches every endpoint,
    # recent (affinity) lists read empty, addrtype and the eTP Local short-circuit.
    assert kube("shop/frontend:http/TCP", "cluster-ip", "a pod on this node") == [
        ["10.244.1.5:8080", "10.244.2.7:8080"]
    ]
    assert kube("shop/cart:http/TCP", "cluster-ip", "a pod on another node") == [
        ["10.244.1.12:8080", "10.244.2.15:8080"]
    ]
    outside = "a client outside the cluster"
    assert kube("shop/ingress-local:https/TCP", "node-port", outside) == [["10.244.1.8:8443"]]
    assert kube("shop/ingress-local:https/TCP", "node-port", "the node itself") == [
        ["10.244.1.8:8443", "10.244.2.10:8443"]
    ]
    assert sorted(kube("default/dual-stack:http/TCP", "node-port", outside)) == [
        ["10.244.1.17:8080", "10.244.2.22:8080"],
        ["[fd00:10:244:1::17]:8080", "[fd00:10:244:2::22]:8080"],
    ]
    web = ("shop/web-nodeport:http/TCP", "node-port")
    masq = [o["kube_proxy"]["masquerade"] for o in served_ if (o["service"], o["frontend"]) == web]
    assert masq
    assert all(masq)
    assert cert["summary"].endswith(f"equivalent but for {len(designed)} differences by design")
    assert "(kube-proxy's iptables mode: ip, ip6)" in cert["summary"]


def test_iptables_mode_reads_only_kube_proxys_rules(iptables_nft: None, cmp: Comparer) -> None:
    """Another program's chain and built-in chain rules (Docker's, a CNI's) are left out, even
    with matches compare does not read; a kube-proxy rule it cannot read is one line, exit 1."""
    foreign = (
        "*nat\n:DOCKER - [0:0]\n"
        "-I PREROUTING 1 -m addrtype --dst-type LOCAL -m limit --limit 5/s -j DOCKER\n"
        "-A DOCKER -p tcp -m tcp --dport 80 -m time --timestart 00:00 -j DNAT "
        "--to-destination 192.0.2.9:80\nCOMMIT\n"
    )
    ns = cmp.iptables_node("iptables", foreign)
    status, cert = cmp.compare(ns)
    assert status == 0, cert["summary"]
    assert not [o for o in cert["outcomes"] if "192.0.2.9:80" in o["kube_proxy"]["endpoints"]]
    sh("iptables", "-t", "nat", "-I", "KUBE-SERVICES", "1", "-m", "statistic", "--mode", "nth",
       "--every", "2", "--packet", "0", "-j", "RETURN", ns=ns)  # fmt: skip
    status, _, err = cmp.text(ns)
    assert status == 1
    assert err.startswith("nlproxy: chain ip nat KUBE-SERVICES: rule "), err
    assert err.endswith(": match statistic rev 0: mode 1 (only random is read)\n"), err
    assert err.count("\n") == 1


# ---------------------------------------------------------------------------------------------
# Both modes, one set of assertions: what kube-proxy's rules and nlproxy's plan disagree on is
# the same whichever mode wrote kube-proxy's; iptables mode adds only the connections it leaves
# unproxied (named by design above).


@pytest.fixture(params=["nftables", "iptables"])
def mode(request: pytest.FixtureRequest) -> str:
    """kube-proxy's mode; iptables mode's needs iptables-nft (checked then)."""
    if request.param == "iptables":
        request.getfixturevalue("iptables_nft")
    return str(request.param)


def unproxied(outcomes: list[Any]) -> list[Any]:
    """What only kube-proxy's iptables mode does: connections no Service port answers, which
    it routes on and nlproxy refuses (by design)."""
    return [o for o in outcomes if o["differs"] and o["service"].endswith(UNPROXIED)]


def test_masquerade_all_differs_only_by_design(mode: str, cmp: Comparer) -> None:
    status, cert = cmp.compare(cmp.node(mode, "-masquerade-all"))
    assert status == 0, cert["summary"]
    designed = [
        o for o in cert["outcomes"] if o["differs"] and o not in unproxied(cert["outcomes"])
    ]
    assert designed
    for o in designed:
        assert "--masquerade-all" in o["by_design"]
        assert (o["kube_proxy"]["masquerade"], o["nlproxy"]["masquerade"]) == (True, False)
        assert o["client"] in ("a pod on this node", "a pod on another node")
        assert o["kube_proxy"]["endpoints"] == o["nlproxy"]["endpoints"]
    assert bool(unproxied(cert["outcomes"])) == (mode == "iptables")
    assert "differences by design" in cert["summary"]


def test_changed_objects_are_found_different_frontend_by_frontend(mode: str, cmp: Comparer) -> None:
    ns = cmp.node(mode, "")
    changed = changed_objects(cmp.reference, cmp.tmp_path, cart_port=8081)
    status, cert = cmp.compare(ns, changed)
    assert status == 4
    assert cert["equivalent"] is False
    differ = [o for o in cert["outcomes"] if o["differs"] and o not in unproxied(cert["outcomes"])]
    assert not [o for o in differ if "by_design" in o]
    assert {o["service"] for o in differ} == {
        "shop/frontend:http/TCP", "shop/storefront-lb:http/TCP", "shop/web-nodeport:http/TCP",
        "shop/cart:http/TCP",
    }  # fmt: skip
    frontend = [o for o in differ if o["service"] == "shop/frontend:http/TCP"]
    assert len(frontend) == 4  # every kind of client of its one frontend
    assert all(o["kube_proxy"]["endpoints"] == ["10.244.1.5:8080", "10.244.2.7:8080"]
               for o in frontend)  # fmt: skip
    assert all(o["nlproxy"]["endpoints"] == ["10.244.1.5:8080"] for o in frontend)
    assert all("10.244.2.7 is not ready" in o["words"] for o in frontend)
    [lb] = [o for o in differ if o["service"] == "shop/storefront-lb:http/TCP"]
    assert (lb["client"], lb["kube_proxy"]["verdict"], lb["nlproxy"]["verdict"]) == (
        "a client outside the cluster", "DROP", "ACCEPT",
    )  # fmt: skip
    outside = [o for o in differ if o["service"] == "shop/web-nodeport:http/TCP"
               and o["client"] == "a client outside the cluster"]  # fmt: skip
    assert [o["nlproxy"]["endpoints"] for o in outside] == [["10.244.1.7:8080"]]
    # The cart now listens on 8081, which kube-proxy does not proxy.
    cart = {(o["port"], o["kube_proxy"]["endpoints"] == [], o["nlproxy"]["verdict"])
            for o in differ if o["service"] == "shop/cart:http/TCP"}  # fmt: skip
    assert cart == {(8081, True, "ACCEPT")}
    # The text names each difference in words, and sums up.
    status, out, _ = cmp.text(ns, changed)
    assert status == 4
    text = out.splitlines()
    assert f": {len(differ)} differ" in text[-1], text[-1]
    assert (
        "differs: shop/frontend:http/TCP from a pod on this node (10.244.1.254) to ClusterIP "
        "10.96.10.10:80: kube-proxy sends to 2 endpoints (10.244.1.5:8080, 10.244.2.7:8080), "
        "nlproxy sends to 1 endpoint (10.244.1.5:8080) (10.244.2.7 is not ready, on node "
        "kind-worker2)"
    ) in text
