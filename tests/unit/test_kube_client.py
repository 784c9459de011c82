"""The official client imported as far as the API source uses it (``cluster/kube_client.py``):
what is left out, and that the packages are still whole for whoever asks for the rest."""

from __future__ import annotations

import base64
import http.server
import json
import os
import subprocess
import sys
import textwrap
import threading
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

UNUSED = (
    "kubernetes.watch",
    "kubernetes.dynamic",
    "kubernetes.stream",
    "kubernetes.leaderelection",
    "kubernetes.informer",
    "kubernetes.config.kube_config",
    "requests_oauthlib",
    # The typed API's ApiClient: pydantic, dateutil and the generated models (~85 ms).
    "kubernetes.client.api_client",
    "pydantic",
    "dateutil",
)


ROOT = Path(__file__).resolve().parents[2]


def _run(code: str, **env: str) -> Any:
    """Run ``code`` in a fresh interpreter (nothing imported yet) with this checkout's
    ``nlproxy`` and ``env`` added to the environment; what it prints, as JSON."""
    path = os.pathsep.join(p for p in (str(ROOT), env.pop("PYTHONPATH", "")) if p)
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env, "PYTHONPATH": path},
        timeout=120,
    )
    return json.loads(out.stdout)


def test_in_a_pod_the_client_is_imported_only_as_far_as_the_source_uses_it(
    tmp_path: Path,
) -> None:
    """A successful in-cluster load (the loader's token and CA file names pointed at files
    here) builds the ``Client`` and its first request's headers without the typed API's
    ``ApiClient``, pydantic or dateutil; without a token file it is one named error."""
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("pod-token")
    ca.write_text("not read before a connection\n")
    got = _run(
        f"""
        import json, sys
        from nlproxy.cluster import kube
        from nlproxy.errors import ConfigError
        loaded = [m for m in {UNUSED!r} if m in sys.modules]
        incluster = kube.kube_client.in_cluster_loading()
        incluster.SERVICE_TOKEN_FILENAME = {str(tmp_path / "absent")!r}
        try:
            kube.api_client_from_config(None)
            error = ""
        except ConfigError as exc:
            error = str(exc)
        incluster.SERVICE_TOKEN_FILENAME = {str(token)!r}
        incluster.SERVICE_CERT_FILENAME = {str(ca)!r}
        client = kube.api_client_from_config(None)
        made = [client.configuration.host, client.configuration.ssl_ca_cert,
                client.renewed_headers("application/json")[0]["authorization"],
                client.url("/api/v1/services", [("limit", "500")])]
        after = [m for m in {UNUSED!r} if m in sys.modules]
        print(json.dumps([loaded, after, error, made]))
        """,
        KUBERNETES_SERVICE_HOST="192.0.2.1",
        KUBERNETES_SERVICE_PORT="6443",
    )
    assert got == [
        [],
        [],
        got[2],
        [
            "https://192.0.2.1:6443",
            str(ca),
            "Bearer pod-token",
            "https://192.0.2.1:6443/api/v1/services?limit=500",
        ],
    ]
    assert "kubeconfig (in-cluster)" in got[2]


def test_a_kubeconfig_takes_the_clients_kubeconfig_loader(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://192.0.2.1:6443'}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
        "users: [{name: u, user: {token: abc}}]\n"
    )
    got = _run(
        f"""
        import json, sys
        from nlproxy.cluster import kube
        client = kube.api_client_from_config({str(kubeconfig)!r})
        others = [m for m in ("kubernetes.watch", "kubernetes.dynamic") if m in sys.modules]
        loader = "kubernetes.config.kube_config" in sys.modules
        print(json.dumps([client.configuration.host, loader, others]))
        """
    )
    assert got == ["https://192.0.2.1:6443", True, []]


def test_the_packages_are_whole_for_whoever_asks_for_more() -> None:
    got = _run(
        """
        import json
        from importlib.metadata import version
        from nlproxy.cluster import kube  # the packages entered bare
        import kubernetes
        from kubernetes import config, watch
        from kubernetes.client import CoreV1Api
        print(json.dumps([
            kubernetes.__version__ == version("kubernetes"),
            watch.Watch.__name__,
            callable(config.load_kube_config),
            config.ConfigException is kube.kube_client.ConfigException,
            CoreV1Api.__name__,
        ]))
        """
    )
    assert got == [True, "Watch", True, True, "CoreV1Api"]


def test_a_bare_package_runs_its_init_once_on_the_first_name_its_submodules_did_not_set(
    tmp_path: Path,
) -> None:
    pkg = tmp_path / "barepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "import builtins\nbuiltins.RUNS = getattr(builtins, 'RUNS', 0) + 1\n"
        "from . import part\nNAME = 'whole'\n"
    )
    (pkg / "part.py").write_text("VALUE = 1\n")
    got = _run(
        """
        import builtins, json, sys
        from nlproxy.runtime.imports import bare
        bare("barepkg")
        import barepkg.part
        before = getattr(builtins, "RUNS", 0)
        import barepkg
        part = barepkg.part.VALUE  # set by the submodule's import: no __init__ needed
        still = getattr(builtins, "RUNS", 0)
        from barepkg import NAME
        try:
            barepkg.missing
            missing = ""
        except AttributeError as exc:
            missing = str(exc)
        print(json.dumps([before, part, still, NAME, builtins.RUNS, missing,
                          bare("barepkg") is sys.modules["barepkg"]]))
        """,
        PYTHONPATH=str(tmp_path),
    )
    assert got == [0, 1, 0, "whole", 1, "module 'barepkg' has no attribute 'missing'", True]


def test_a_request_is_what_the_clients_api_client_would_send() -> None:
    """``kube_client.Client`` prepares the source's GETs as ``ApiClient.param_serialize`` does
    (URL, quoted query, User-Agent, a token its refresh hook renewed), and sends them through
    the same configuration's REST client (TLS, pool)."""
    got = _run(
        """
        import json, sys
        from nlproxy.cluster import kube, kube_http
        from nlproxy.cluster.kube_client import Client, Configuration
        cfg = Configuration(host="https://192.0.2.1:6443")
        cfg.api_key = {"BearerToken": "old"}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
        def refresh(c):
            c.api_key["BearerToken"] = "renewed"
        cfg.refresh_api_key_hook = refresh
        ours = Client(cfg)
        query = [("labelSelector", "!service.kubernetes.io/service-proxy-name,a in (b, c)"),
                 ("limit", "500"), ("continue", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTB9"),
                 ("allowWatchBookmarks", True), ("sendInitialEvents", False),
                 ("timeoutSeconds", 300)]
        mine = [ours.url("/api/v1/services", query), ours.renewed_headers("application/json")[0],
                ours.url("/readyz"), ours.renewed_headers("*/*")[0]]
        loaded = "kubernetes.client.api_client" in sys.modules
        from kubernetes.client.api_client import ApiClient
        api = ApiClient(cfg)
        _m, url, headers, _b, _p = api.param_serialize(
            "GET", "/api/v1/services", query_params=query,
            header_params={"Accept": "application/json"}, auth_settings=["BearerToken"])
        _m, probe_url, probe_headers, _b, _p = api.param_serialize(
            "GET", "/readyz", header_params={"Accept": "*/*"}, auth_settings=["BearerToken"])
        theirs = [url, headers, probe_url, probe_headers]
        def pool(client):
            manager = client.rest_client.pool_manager
            return [type(manager).__name__, sorted(manager.connection_pool_kw.items())]
        print(json.dumps([loaded, mine == theirs, mine[1], pool(ours), pool(api), mine[0]],
                         default=repr))
        """
    )
    assert got[:3] == [
        False,
        True,
        {
            "Accept": "application/json",
            "User-Agent": f"OpenAPI-Generator/{version('kubernetes')}/python",
            "authorization": "Bearer renewed",
        },
    ]
    ours, theirs, url = got[3:]
    assert url.endswith("&allowWatchBookmarks=true&sendInitialEvents=false&timeoutSeconds=300")
    assert ours == theirs
    assert ours[0] == "PoolManager"
    assert ["cert_reqs", 2] in ours[1]  # ssl.CERT_REQUIRED, as the client verifies by default


@pytest.mark.parametrize(
    ("raised", "why"),
    [
        (OSError(2, "No such file or directory"), "No such file or directory"),
        (AttributeError("'NoneType' object has no attribute 'token'"), "'NoneType' object"),
    ],
)
def test_a_token_the_refresh_cannot_renew_is_sent_as_it_was_and_the_reason_said(
    raised: Exception, why: str
) -> None:
    """Whatever a loader's refresh hook raises (a token file gone mid-rotation; a gcp
    auth-provider without google-auth), the request goes with the last token and the reason
    names where the credentials come from; the next renewal that works is sent."""
    from nlproxy.cluster.kube_client import Client, Configuration

    cfg = Configuration(host="https://192.0.2.1:6443")
    cfg.api_key = {"BearerToken": "old"}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    failing = True

    def refresh(c: Any) -> None:
        if failing:
            raise raised
        c.api_key["BearerToken"] = "renewed"

    cfg.refresh_api_key_hook = refresh
    client = Client(cfg, credentials="token file /var/run/token")
    headers, error = client.renewed_headers("*/*")
    assert headers["authorization"] == "Bearer old"
    assert error is not None
    assert error.startswith("token file /var/run/token: not renewed: ")
    assert why in error
    failing = False
    headers, error = client.renewed_headers("*/*")
    assert (headers["authorization"], error) == ("Bearer renewed", None)


@pytest.mark.parametrize(
    ("key", "prefix"),
    [
        pytest.param("Bearer inline\n", None, id="loader-token-block-scalar"),
        pytest.param(" Bearer inline\r\n", None, id="exec-plugin-crlf"),
        pytest.param("inline\n", "Bearer", id="prefixed"),
    ],
)
def test_the_authorization_value_is_trimmed(key: str, prefix: str | None) -> None:
    """The kubeconfig loader sets ``Bearer TOKEN`` as it read it (an inline ``token: |``, an
    exec plugin's token): no header may end in a line break, so the value sent is trimmed."""
    from nlproxy.cluster.kube_client import Client, Configuration

    cfg = Configuration(host="https://192.0.2.1:6443")
    cfg.api_key = {"BearerToken": key}
    if prefix is not None:
        cfg.api_key_prefix = {"BearerToken": prefix}
    headers, error = Client(cfg).renewed_headers("*/*")
    assert (headers["authorization"], error) == ("Bearer inline", None)


LOADER_LATER = ("requests_oauthlib", "oauthlib.oauth2", "kubernetes.client.api_client", "pydantic")


def _jwt(claims: dict[str, Any]) -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part(claims)}.c2ln"


class _Issuer(http.server.BaseHTTPRequestHandler):
    """An oidc issuer on loopback: its discovery document and a token endpoint that trades
    the refresh token ``r1`` for a new id token."""

    def do_GET(self) -> None:
        host, port = self.server.server_address[:2]
        self._send(200, {"token_endpoint": f"http://{host}:{port}/token"})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        if "refresh_token=r1" not in body:
            self._send(400, {"error": "invalid_grant"})
            return
        fresh = _jwt({"exp": 4102444800, "sub": "fresh"})
        self._send(200, {"access_token": "a", "token_type": "Bearer", "id_token": fresh,
                         "refresh_token": "r2"})  # fmt: skip

    def _send(self, status: int, doc: dict[str, Any]) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def test_an_expired_oidc_token_is_refreshed_with_what_the_loader_imports_when_it_needs_it(
    tmp_path: Path,
) -> None:
    """The kubeconfig loader's ``requests_oauthlib``, ``oauthlib`` and typed ``ApiClient``
    (pydantic) are not imported by a load that does not refresh an oidc token, and are when one
    does: an expired id token is renewed at the issuer (its discovery through the
    ``ApiClient``, the refresh through ``OAuth2Session``) and sent, as a plain import does."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Issuer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port = server.server_address[:2]
    expired = _jwt({"exp": 1000000000, "sub": "old"})
    config = {"client-id": "nlproxy", "client-secret": "s", "refresh-token": "r1",
              "idp-issuer-url": f"http://{host}:{port}", "id-token": expired}  # fmt: skip
    files = {}
    for name, provider in (("plain", {"token": "abc"}), ("oidc", {"auth-provider": {
            "name": "oidc", "config": config}})):  # fmt: skip
        files[name] = tmp_path / name
        files[name].write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "k", "cluster": {"server": "https://192.0.2.1:6443"}}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            "users": [{"name": "u", "user": provider}],
        }))  # fmt: skip
    try:
        got = _run(
            f"""
            import json, sys
            from nlproxy.cluster import kube
            def loaded():
                return [m for m in {LOADER_LATER!r} if m in sys.modules]
            plain = kube.api_client_from_config({str(files["plain"])!r})
            before = loaded()
            oidc = kube.api_client_from_config({str(files["oidc"])!r})
            loader = sys.modules["kubernetes.config.kube_config"]
            from kubernetes.client import ApiClient
            from oauthlib.oauth2.rfc6749.errors import InvalidClientIdError
            print(json.dumps([
                plain.renewed_headers("application/json")[0]["authorization"], before,
                oidc.renewed_headers("application/json")[0]["authorization"], loaded(),
                loader.ApiClient is ApiClient,
                # what its refresh catches, read through the name ``import oauthlib.oauth2`` bound
                loader.oauthlib.oauth2.rfc6749.errors.InvalidClientIdError is InvalidClientIdError,
            ]))
            """,
            OAUTHLIB_INSECURE_TRANSPORT="1",  # the issuer is plain HTTP on loopback
        )
    finally:
        server.shutdown()
        server.server_close()
    fresh = _jwt({"exp": 4102444800, "sub": "fresh"})
    assert got == ["Bearer abc", [], f"Bearer {fresh}", list(LOADER_LATER), True, True]
