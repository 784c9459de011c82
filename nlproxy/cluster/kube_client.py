"""The official Kubernetes client (the ``kubernetes`` package), imported only as far as the API
source uses it.

Sits under ``kube.py`` and ``kube_http.py``, which take the client from here: ``ApiClient``
(HTTP, TLS, credentials and their refresh), ``Configuration``, ``ApiException`` and one of the
client's two loaders, the kubeconfig's or the in-cluster one. It must not change what the
client does: only what is imported, and when.

``import kubernetes`` runs the package's ``__init__``, which imports every part of the client
(``dynamic``, ``watch``, ``stream``, ``leaderelection``, ``informer``, ``utils``), and any
``kubernetes.config`` import runs that package's ``__init__``, which imports the kubeconfig
loader and, with it, ``requests`` and ``oauthlib`` (for OIDC token refresh). So both packages
are entered bare (``nlproxy/imports.py``): the package module exists with its ``__path__``, its
submodules import as usual, and its ``__init__`` runs the first time anyone asks the package for
a name that is no submodule (``kubernetes.__version__``, ``kubernetes.config.load_config``):
from then on the package is what a plain import makes. In a pod the kubeconfig loader is then
never imported. Measured beside the daemon's other imports (``docs/api-server.md``, "The
client's imports").
"""

from __future__ import annotations

import importlib
from typing import Any

from nlproxy.imports import bare

bare("kubernetes")
bare("kubernetes.config")

from kubernetes.client.api_client import ApiClient  # noqa: E402
from kubernetes.client.configuration import Configuration  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402
from kubernetes.config.config_exception import ConfigException  # noqa: E402

__all__ = ["ApiClient", "ApiException", "ConfigException", "Configuration"]


def kubeconfig_loading() -> Any:
    """The client's kubeconfig loading (``load_kube_config``, ``KubeConfigLoader``)."""
    return importlib.import_module("kubernetes.config.kube_config")


def in_cluster_loading() -> Any:
    """The client's in-cluster loading (``InClusterConfigLoader``, the token and CA paths)."""
    return importlib.import_module("kubernetes.config.incluster_config")
