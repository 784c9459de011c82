"""Packages entered without their ``__init__``: only the submodules nlproxy uses are imported.

Some dependencies' package ``__init__`` imports every part of the package, whatever the caller
asks for. ``pyroute2``'s imports its IPDB and NDB databases (SQLite, their sources, nftables'
socket), which nlproxy never uses: beside the daemon's other imports, 6 MB of RSS and ~35 ms of
CPU at every start for nothing.

:func:`bare` makes the package module as the import system would, with its ``__path__``, but
does not run its ``__init__``: its submodules import as usual (a name that is a submodule is
imported as one), and the ``__init__`` runs the first time anyone asks the package for another
name it lacks (``pyroute2.IPRoute``, ``pyroute2.__version__``). From then on the package is what
a plain import makes. A package imported already is left as it is.
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
    (see the module docstring). Something that is not a package is imported as usual."""
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
    """A module ``__getattr__`` (called only for a name the module lacks): a submodule's name
    is left to the import system (``from pkg import sub`` imports ``pkg.sub``); any other first
    runs the package's own ``__init__`` into the module, once."""
    running = False

    def __getattr__(name: str) -> Any:
        nonlocal running
        if not name.startswith("__") and _is_submodule(module.__name__, name):
            raise AttributeError(name)
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


def _is_submodule(package: str, name: str) -> bool:
    full = f"{package}.{name}"
    if full in sys.modules:
        return True
    try:
        return importlib.util.find_spec(full) is not None
    except (ImportError, ValueError):
        return False
