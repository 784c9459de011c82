"""pyroute2's ``IPRoute`` and ``NetlinkError`` for the inspector and the IPVS look, with the
``pyroute2`` package entered bare (``runtime/imports.py``): its ``__init__`` would import IPDB
and NDB, which nlproxy never uses.

Imported by the first call that talks to rtnetlink, not at start: a pyroute2 that cannot be
imported (a broken or partial install) is a :class:`~nlproxy.errors.ConfigError` naming it
(exit status 2), so a caller that logs and retries an ``NlproxyError`` (the daemon's address
watch, the reachability monitor) goes on, and a command says one line.
"""

from nlproxy.errors import ConfigError
from nlproxy.runtime.imports import bare

try:
    bare("pyroute2")
    from pyroute2.iproute import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError
except Exception as exc:  # noqa: BLE001 - a partial install: ImportError, SyntaxError, ...
    raise ConfigError(
        "package pyroute2",
        f"cannot be imported ({type(exc).__name__}: {exc}); reinstall nlproxy's dependencies",
    ) from None

__all__ = ["IPRoute", "NetlinkError"]
