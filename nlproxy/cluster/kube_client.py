"""The official Kubernetes client (the ``kubernetes`` package), imported only as far as the API
source uses it.

Sits under ``kube.py`` and ``kube_http.py``, which take the client from here: its
``Configuration`` (URL, TLS, credentials and their refresh), its REST client (the urllib3 pool
the configuration sets up), ``ApiException`` and one of the client's two loaders, the
kubeconfig's or the in-cluster one. It must not change what the client does: only what is
imported, and when.

``import kubernetes`` runs the package's ``__init__``, which imports every part of the client
(``dynamic``, ``watch``, ``stream``, ``leaderelection``, ``informer``, ``utils``), and any
``kubernetes.config`` import runs that package's ``__init__``, which imports the kubeconfig
loader and, with it, ``requests`` and ``oauthlib`` (for OIDC token refresh). So both packages
are entered bare (``runtime/imports.py``): the package module exists with its ``__path__``, its
submodules import as usual, and its ``__init__`` runs the first time anyone asks the package for
a name that is no submodule (``kubernetes.__version__``, ``kubernetes.config.load_config``):
from then on the package is what a plain import makes. In a pod the kubeconfig loader is then
never imported.

Nor is the client's ``ApiClient`` (``kubernetes.client.api_client``): besides the configuration
and the REST client, which :class:`Client` holds too, it brings pydantic, dateutil and the
generated models (~85 ms of CPU at every start), for the typed API methods and their models,
which the source does not use (it reads raw JSON). :class:`Client` prepares a request as the
``ApiClient``'s ``param_serialize`` does for the source's GETs (the configuration's host, the
query quoted alike, its default ``User-Agent``, the bearer token from the configuration, which
refreshes it) and sends it through the REST client. The kubeconfig loader imports ``ApiClient``
itself, and ``requests_oauthlib`` and ``oauthlib``, for an oidc token refresh alone: it is
imported with those imports deferred until used (:data:`LOADER_LATER`), so a kubeconfig that
refreshes no oidc token is spared them too. Measured beside the daemon's other
imports (``docs/api-server.md``, "The client's imports").

One thing it takes from the client is its word about an exec credential plugin: the loader
catches the plugin's failure, logs it on the root logger and goes on (the last token is sent),
at every request whose token has expired. :func:`plugin_failures` takes those lines, in the
thread that loads or refreshes the credentials, so the source says the failure once, naming the
kubeconfig user and the plugin (``Client.renewed_headers``), instead of a root-logger line per
request that nlproxy never sees.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any
from urllib.parse import quote

from nlproxy.runtime.imports import bare, deferring

bare("kubernetes")
bare("kubernetes.config")

from kubernetes.client import __version__ as _CLIENT_VERSION  # noqa: E402
from kubernetes.client import rest  # noqa: E402
from kubernetes.client.configuration import Configuration  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402
from kubernetes.config.config_exception import ConfigException  # noqa: E402

__all__ = ["ApiException", "Client", "ConfigException", "Configuration", "plugin_failures"]

USER_AGENT = f"OpenAPI-Generator/{_CLIENT_VERSION}/python"
"""What the client's ``ApiClient`` says it is (its default ``User-Agent``), said the same."""


class Client:
    """The client's configuration and REST client, as an ``ApiClient`` holds them.

    Attributes:
        configuration: the client's ``Configuration`` (host, TLS, credentials).
        rest_client: the client's ``RESTClientObject`` made from it (its urllib3 pool).
        credentials: where the credentials come from, named in an error when they cannot be
            renewed (``token file /var/run/...``, ``kubeconfig /etc/...``).
    """

    def __init__(self, configuration: Configuration, credentials: str = "credentials") -> None:
        self.configuration = configuration
        self.credentials = credentials
        self.rest_client: Any = rest.RESTClientObject(configuration)

    def url(self, path: str, query: Sequence[tuple[str, str | int | bool]] = ()) -> str:
        """The URL of ``path`` with ``query``, quoted as ``ApiClient.param_serialize`` does
        (a bool as ``true``/``false``, as the API server reads it)."""
        url = f"{self.configuration.host}{path}"
        if query:
            url += "?" + "&".join(f"{key}={quote(_text(value))}" for key, value in query)
        return url

    def renewed_headers(self, accept: str) -> tuple[dict[str, str], str | None]:
        """A request's headers: ``Accept``, the ``User-Agent`` and the bearer token, read from
        the configuration at each request after its refresh hook renewed an expiring one; and
        why the token could not be renewed (None: it was, or needs no renewal).

        A token the hook cannot renew (an in-cluster token file empty or gone while the
        kubelet rotates it) leaves the last one in place: it is sent as it is, and the server
        decides (a 401 is then the source's refusal, seen on ``/healthz``).
        """
        cfg = self.configuration
        hook: Any = cfg.refresh_api_key_hook  # the client's stubs type it None; loaders set it
        error = None
        if hook is not None:
            with plugin_failures() as failed:
                try:
                    hook(cfg)
                # Whatever a loader's hook raises: the in-cluster one OSError or
                # ConfigException, a gcp auth-provider without google-auth an AttributeError.
                except Exception as exc:  # noqa: BLE001 (see above)
                    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                    error = f"{self.credentials}: not renewed: {why or type(exc).__name__}"
            if failed and error is None:  # the exec plugin's, which the hook caught
                error = f"{self.credentials}: not renewed: {failed[-1]}"
        headers = {"Accept": accept, "User-Agent": USER_AGENT}
        token = _bearer(cfg)
        if token is not None:
            headers["authorization"] = token
        return headers, error

    def close(self) -> None:
        """Close the pool's connections (``ApiClient.close``)."""
        self.rest_client.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


_LOADER_FILE = os.path.join("kubernetes", "config", "kube_config.py")
_capturing = threading.local()


class _PluginFailures(logging.Filter):
    """On the root logger: a record of the kubeconfig loader's exec plugin, in a thread within
    :func:`plugin_failures`, is kept there (in one line) and not logged; any other passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        caught: list[str] | None = getattr(_capturing, "caught", None)
        if (
            caught is None
            or record.funcName != "_load_from_exec_plugin"
            or not record.pathname.endswith(_LOADER_FILE)
        ):
            return True
        lines = [line for line in record.getMessage().splitlines() if line.strip()]
        # "exec: process returned 1. <the plugin's stderr>": its first and last lines.
        caught.append(" ... ".join(dict.fromkeys((lines[0], lines[-1]))) if lines else "exec")
        return False


_FILTER = _PluginFailures()


@contextlib.contextmanager
def plugin_failures() -> Iterator[list[str]]:
    """The exec plugin failures the loader logs in this thread meanwhile (each in one line),
    taken off the root logger."""
    root = logging.getLogger()
    if _FILTER not in root.filters:
        root.addFilter(_FILTER)
    before = getattr(_capturing, "caught", None)
    caught: list[str] = []
    _capturing.caught = caught
    try:
        yield caught
    finally:
        _capturing.caught = before


def _bearer(cfg: Configuration) -> str | None:
    """The ``authorization`` value the configuration holds now, as its ``auth_settings``
    gives it (the key under ``BearerToken`` or ``authorization``, with its prefix), without
    running the refresh hook again), trimmed: the kubeconfig loader sends an inline ``token``
    as it is (a ``token: |`` block scalar ends in a newline, which no header may carry)."""
    key = cfg.api_key.get("BearerToken", cfg.api_key.get("authorization"))
    if not key:
        return None
    prefix = cfg.api_key_prefix.get("BearerToken", cfg.api_key_prefix.get("authorization"))
    return (f"{prefix} {str(key).strip()}" if prefix else str(key)).strip()


def _text(value: str | int | bool) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


LOADER_LATER = {
    "oauthlib.oauth2": (),
    "requests_oauthlib": ("OAuth2Session",),
    "kubernetes.client": ("ApiClient",),
}
"""What the kubeconfig loader imports for an oidc token refresh (``_refresh_oidc``) and for
``new_client_from_config``, which nlproxy never calls: ``requests`` and ``oauthlib`` (for
``OAuth2Session``) and the typed ``ApiClient`` (pydantic, dateutil, the models): ~110 ms of CPU
at every start with a kubeconfig. They are imported when first used (``imports.deferring``)."""


def kubeconfig_loading() -> Any:
    """The client's kubeconfig loading (``load_kube_config``, ``KubeConfigLoader``), with what
    only an oidc refresh uses imported when it is used (:data:`LOADER_LATER`)."""
    return deferring("kubernetes.config.kube_config", LOADER_LATER)


def in_cluster_loading() -> Any:
    """The client's in-cluster loading (``InClusterConfigLoader``, the token and CA paths)."""
    return importlib.import_module("kubernetes.config.incluster_config")
