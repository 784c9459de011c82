"""Where ``run`` finds the API server: one rule, used by ``run``'s start-up check, the daemon and
``preflight`` alike (docs/api-server.md).

The address: ``--master`` (or ``$NLPROXY_API_SERVER``) when given, replacing the one of the
credentials' source. The credentials: the kubeconfig (``--kubeconfig``, or the
KubeProxyConfiguration's ``clientConnection.kubeconfig``), else the in-cluster configuration
of a pod (``KUBERNETES_SERVICE_HOST``). A kubeconfig named by the file that does not exist on
this host is skipped for the in-cluster configuration: kubeadm's ConfigMap names a path that
nlproxy's DaemonSet may not mount (but a ``:``-joined list, which kube-proxy reads as one file
too, is kept, for ``run`` to refuse as the list it is). Reads the environment; opens no file
but for ``exists``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nlproxy.config.values import DaemonConfig

NO_CREDENTIALS = "none given, and not running in a pod (no KUBERNETES_SERVICE_HOST)"


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiSource:
    """What :func:`api_source` chose.

    Attributes:
        kubeconfig: the kubeconfig to load; None: the in-cluster configuration.
        api_server: the address that replaces the credentials' own (``--master``), or None.
        skipped: why the file's kubeconfig is not used ("" when it is, or none was named).
        no_credentials: why there are none ("" when there are): no kubeconfig, not in a pod.
    """

    kubeconfig: str | None
    api_server: str | None
    skipped: str = ""
    no_credentials: str = ""

    @property
    def in_cluster(self) -> bool:
        """The credentials are the pod's (its service account's token and CA)."""
        return self.kubeconfig is None

    @property
    def fallback(self) -> bool:
        """The address is ``KUBERNETES_SERVICE_HOST``: the in-cluster fallback, which a node
        without proxy rules may not reach (``cluster/in_cluster.py``)."""
        return self.kubeconfig is None and self.api_server is None


def api_source(cfg: DaemonConfig, environ: Mapping[str, str] = os.environ) -> ApiSource:
    """The kubeconfig and address ``run`` uses with ``cfg``, by the rule above."""
    path = cfg.kubeconfig or None
    skipped = ""
    # A ':'-joined list is no path a ConfigMap could name for another host: kube-proxy reads
    # the field as one file, so it is kept, and refused as such (``run``), not skipped.
    listed = path is not None and ":" in path
    if path is not None and cfg.kubeconfig_from_file and not listed and not Path(path).exists():
        skipped = f"clientConnection.kubeconfig {path} does not exist on this host"
        path = None
    no_credentials = ""
    if path is None and not environ.get("KUBERNETES_SERVICE_HOST"):
        no_credentials = NO_CREDENTIALS
    return ApiSource(
        kubeconfig=path,
        api_server=cfg.api_server or None,
        skipped=skipped,
        no_credentials=no_credentials,
    )
