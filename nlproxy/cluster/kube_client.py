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
are entered bare (``bare``): the package module exists with its ``__path__``, its submodules
import as usual, and its ``__init__`` runs the first time anyone asks the package for a name
no imported submodule has set (``kubernetes.__version__``, ``kubernetes.config.load_config``):
from then on the package is what a plain import makes. In a pod the kubeconfig loader is then
never imported. Measured beside the daemon's other imports (``docs/api-server.md``, "The
client's imports").
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from collections.abc import Callable
from importlib.abc import Loader
from types import ModuleType
from typing import Any

_LOCK = threading.RLock()


def bare(name: str) -> ModuleType:
    """The package ``name``: as imported already, else its module without its ``__init__`` run
    (it runs on the first miss of a name, see the module docstring). Something that is not a
    package is imported as usual."""
    with _LOCK:
        module = sys.modules.get(name)
        if module is not None:
            return module
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            return importlib.import_module(name)
        module = importlib.util.module_from_spec(spec)
        module.__getattr__ = _completion(module, spec.loader)  # type: ignore[method-assign]
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)
        return module


def _completion(module: ModuleType, loader: Loader) -> Callable[[str], Any]:
    """A module ``__getattr__`` (called only for a name the module lacks) that first runs the
    package's own ``__init__`` into it, once."""
    running = False

    def __getattr__(name: str) -> Any:
        nonlocal running
        with _LOCK:
            if running:  # the __init__'s own "from . import x": x is not set yet
                raise AttributeError(name)
            if module.__dict__.get("__getattr__") is __getattr__:
                running = True
                try:
                    loader.exec_module(module)
                finally:
                    running = False
                    if module.__dict__.get("__getattr__") is __getattr__:
                        del module.__dict__["__getattr__"]
        try:
            return module.__dict__[name]
        except KeyError:
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}") from None

    return __getattr__


bare("kubernetes")
bare("kubernetes.config")

from kubernetes.client.api_client import ApiClient  # noqa: E402
from kubernetes.client.configuration import Configuration  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402
from kubernetes.config.config_exception import ConfigException  # noqa: E402

__all__ = ["ApiClient", "ApiException", "ConfigException", "Configuration", "bare"]


def kubeconfig_loading() -> Any:
    """The client's kubeconfig loading (``load_kube_config``, ``KubeConfigLoader``)."""
    return importlib.import_module("kubernetes.config.kube_config")


def in_cluster_loading() -> Any:
    """The client's in-cluster loading (``InClusterConfigLoader``, the token and CA paths)."""
    return importlib.import_module("kubernetes.config.incluster_config")
