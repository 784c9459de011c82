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

:func:`deferring` imports one module whose own ``import`` statements bring in modules it uses
only on a rare path (the kubeconfig loader's ``requests_oauthlib``, ``oauthlib`` and the typed
``ApiClient`` with pydantic, for an oidc token refresh: ~110 ms of CPU at every start with a
kubeconfig). Those statements bind stand-ins instead, in that module's namespace alone: a name
from ``from M import N`` becomes a callable that imports ``M`` when first called and calls the
real ``N`` (then rebinds the name to it); ``import M.SUB`` binds an object that imports ``M.SUB``
on the first attribute asked of it. Every other import of the module, and every import anywhere
else, is the import system's own.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.util
import sys
import threading
from collections.abc import Callable, Collection, Mapping
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


def deferring(name: str, later: Mapping[str, Collection[str]]) -> ModuleType:
    """The module ``name``: as imported already, else imported with the imports of ``later``
    deferred (see the module docstring). ``later`` maps a module to the names the module
    ``name`` takes from it that wait: for ``import M.SUB``, give ``M.SUB`` with no names (the
    statement binds ``M``); for ``from M import N``, give ``M`` with ``N``. A module of
    ``later`` imported already is taken as it is. The module runs under this module's lock, not
    the import system's: a plain import of ``name`` in another thread meanwhile may see it half
    made, so the first import of ``name`` in the process must be this one."""
    with _LOCK:
        module = sys.modules.get(name)
        if module is not None:
            return module
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return importlib.import_module(name)
        module = importlib.util.module_from_spec(spec)
        # The module's own builtins: its import statements (at the top and in its functions)
        # go through the hook; exec() keeps a ``__builtins__`` the globals already hold.
        own = dict(vars(builtins))
        own["__import__"] = _deferring_import(module.__dict__, later)
        module.__dict__["__builtins__"] = own
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)
        return module


def _deferring_import(namespace: dict[str, Any], later: Mapping[str, Collection[str]]) -> Any:
    real = builtins.__import__

    def __import__(
        name: str,
        globals: Any = None,
        locals: Any = None,
        fromlist: Any = (),
        level: int = 0,
    ) -> Any:
        names = later.get(name) if level == 0 else None
        if names is None:
            return real(name, globals, locals, fromlist, level)
        if not fromlist:  # ``import M.SUB``: the statement binds M
            return (
                real(name, globals, locals, fromlist, level)
                if name in sys.modules
                else _LaterPackage(name)
            )
        return _LaterFrom(name, names, namespace)

    return __import__


class _LaterPackage:
    """What ``import M.SUB`` binds to ``M`` while ``M.SUB`` waits: the first attribute asked
    imports ``M.SUB`` and is the real ``M``'s."""

    def __init__(self, dotted: str) -> None:
        self._dotted = dotted

    def __getattr__(self, attr: str) -> Any:
        importlib.import_module(self._dotted)
        return getattr(sys.modules[self._dotted.partition(".")[0]], attr)


class _LaterFrom:
    """What ``from M import A, B`` reads its names from: a name that waits is a stand-in that
    imports ``M`` when called; any other is ``M``'s own (``M`` imported then)."""

    def __init__(self, module: str, waiting: Collection[str], namespace: dict[str, Any]) -> None:
        self._module = module
        self._waiting = waiting
        self._namespace = namespace

    def __getattr__(self, attr: str) -> Any:
        module, namespace = self._module, self._namespace
        imported = sys.modules.get(module)
        if attr not in self._waiting or (imported is not None and attr in vars(imported)):
            return getattr(importlib.import_module(module), attr)

        def stand_in(*args: Any, **kwargs: Any) -> Any:
            real = getattr(importlib.import_module(module), attr)
            if namespace.get(attr) is stand_in:
                namespace[attr] = real  # from now on the module calls it directly
            return real(*args, **kwargs)

        stand_in.__name__ = stand_in.__qualname__ = attr
        return stand_in
