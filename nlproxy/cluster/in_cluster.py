"""The in-cluster fallback: the API server reached at ``KUBERNETES_SERVICE_HOST``.

In a pod that is the ``kubernetes`` Service's ClusterIP, which only a service proxy's rules
make reachable: a node without them (new, or rebooted after kube-proxy's rules were cleaned up)
cannot reach it, and nlproxy, the proxy that would program them, never syncs. The words used
for it wherever it is reported (the start-up warning, the unreachable warning, ``/healthz``'s
``reason``), so that each names the fix. No imports beyond the standard library: the command
line's start-up check says it before the client is loaded.
"""

from __future__ import annotations

import os

FIX = (
    "set the api-server key of nlproxy's ConfigMap (NLPROXY_API_SERVER, or --master) to the "
    "API server's own address, https://HOST:PORT as in kubelet.conf "
    "(docs/migrating.md, 'The end state')"
)
"""What to do about it."""


def server() -> str:
    """The address the in-cluster configuration names (``KUBERNETES_SERVICE_HOST``/``PORT``)."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "") or "443"
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def warning(address: str) -> str:
    """The start-up warning: the fallback is in use, whether or not it answers now."""
    return (
        f"reaching the API server at {address} (KUBERNETES_SERVICE_HOST): when that is the "
        "kubernetes Service's ClusterIP, a node without proxy rules (new, or rebooted after a "
        f"cleanup) never syncs; {FIX}"
    )


def unreachable(address: str) -> str:
    """Why nothing syncs when nothing answers at the fallback address."""
    return (
        f"API server {address} (KUBERNETES_SERVICE_HOST, the in-cluster fallback) does not "
        "answer: it is the kubernetes Service's ClusterIP, which this node reaches only through "
        f"proxy rules that nlproxy has not programmed yet; {FIX}"
    )
