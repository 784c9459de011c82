"""``nlproxy preflight``'s access check against the in-repo API server: the identity ``run``
would use may list and watch what it reads, or a ``FAIL`` names the refused verb and kind;
a refused token and a pod without its service-account token are findings too."""

from __future__ import annotations

import subprocess
import sys
from ipaddress import ip_network
from pathlib import Path

import pytest

from nlproxy.operate import preflight_api as pfa
from nlproxy.operate.preflight import Level
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import NODE, write_kubeconfig

CIDRS = (ip_network("10.96.0.0/12"),)


@pytest.fixture(autouse=True)
def _node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NLPROXY_NODE_NAME", NODE)
    monkeypatch.delenv("NLPROXY_API_SERVER", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)


def findings(kubeconfig: Path) -> list[tuple[str, Level, str]]:
    out = pfa.api_server_findings(None, str(kubeconfig), None, None, CIDRS)
    return [(f.check, f.level, f.text) for f in out]


def test_a_granted_identity_passes(apiserver: ApiServer, tmp_path: Path) -> None:
    got = findings(write_kubeconfig(tmp_path / "kc", apiserver))
    assert [(c, lv) for c, lv, _ in got] == [("api-server", Level.OK), ("access", Level.OK)]
    assert got[1][2].startswith(f"node {NODE}: may list and watch Services, EndpointSlices")
    asked = {(path, "watch" in q) for path, q in apiserver.requests}
    assert ("/apis/discovery.k8s.io/v1/endpointslices", True) in asked
    assert ("/api/v1/nodes", False) in asked


@pytest.mark.parametrize(
    ("plural", "verb", "says"),
    [
        ("services", "list", "cannot list Services (HTTP 403: services is forbidden"),
        ("endpointslices", "watch", "cannot watch EndpointSlices (HTTP 403:"),
        ("nodes", "list", "cannot list Nodes (HTTP 403: nodes is forbidden"),
    ],
)
def test_a_missing_permission_is_a_failure(
    apiserver: ApiServer, tmp_path: Path, plural: str, verb: str, says: str
) -> None:
    apiserver.forbid(plural, verb)
    got = findings(write_kubeconfig(tmp_path / "kc", apiserver))
    access = [(lv, text) for c, lv, text in got if c == "access"]
    assert access[0][0] is Level.FAIL, got
    assert says in access[0][1]
    assert "ClusterRole" in access[0][1]


def test_an_optional_kind_refused_is_a_warning(apiserver: ApiServer, tmp_path: Path) -> None:
    apiserver.forbid("servicecidrs")
    got = findings(write_kubeconfig(tmp_path / "kc", apiserver))
    access = [(lv, text) for c, lv, text in got if c == "access"]
    assert [lv for lv, _ in access] == [Level.WARN, Level.WARN]
    assert access[0][1].startswith("cannot list ServiceCIDRs (optional): HTTP 403")


def test_a_refused_token_is_a_failure(apiserver: ApiServer, tmp_path: Path) -> None:
    got = findings(write_kubeconfig(tmp_path / "kc", apiserver, token="wrong"))
    access = [(lv, text) for c, lv, text in got if c == "access"]
    assert access[0][0] is Level.FAIL
    assert "cannot list Services (HTTP 401" in access[0][1]


def test_in_cluster_without_a_service_account_token(
    apiserver: ApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not Path(pfa.SERVICE_ACCOUNT_TOKEN).exists(), "this host is a pod: test elsewhere"
    monkeypatch.setenv("NLPROXY_API_SERVER", apiserver.url)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    out = pfa.api_server_findings(None, None, None, None, CIDRS)
    assert [(f.check, f.level) for f in out] == [("api-server", Level.OK), ("access", Level.FAIL)]
    assert out[1].text.startswith(f"no service-account token at {pfa.SERVICE_ACCOUNT_TOKEN}")


def test_the_command_exits_1_on_a_refused_kind(apiserver: ApiServer, tmp_path: Path) -> None:
    apiserver.forbid("endpointslices")
    kubeconfig = write_kubeconfig(tmp_path / "kc", apiserver)
    proc = subprocess.run(
        [sys.executable, "-m", "nlproxy", "preflight", "--kubeconfig", str(kubeconfig)],
        capture_output=True, text=True, timeout=120, check=False,
        env={"PATH": "/usr/bin:/bin", "NLPROXY_NODE_NAME": NODE},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL  access      node node-a: cannot list EndpointSlices" in proc.stdout
