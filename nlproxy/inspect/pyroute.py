"""pyroute2's ``IPRoute`` and ``NetlinkError`` for the inspector and the IPVS look, with the
``pyroute2`` package entered bare (``nlproxy/imports.py``): its ``__init__`` would import IPDB
and NDB, which nlproxy never uses."""

from nlproxy.imports import bare

bare("pyroute2")

from pyroute2.iproute import IPRoute  # noqa: E402
from pyroute2.netlink.exceptions import NetlinkError  # noqa: E402

__all__ = ["IPRoute", "NetlinkError"]
