"""``nlproxy preflight``'s API server checks: the address ``run`` would use (found as ``run``
finds it), whether it answers without a ClusterIP, and whether ``run``'s identity may read what
it reads. Facts are gathered here (files, one connection, the API server's answers); the
findings go to :func:`nlproxy.operate.preflight.preflight`'s screen.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, replace
from ipaddress import ip_address
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from nlproxy.cluster import in_cluster
from nlproxy.cluster.kubeconfig import opened, server_of
from nlproxy.config.api_source import api_source
from nlproxy.config.values import API_SERVER_ENV
from nlproxy.errors import ConfigError
from nlproxy.netlink import netns
from nlproxy.nft.ir import IPNetwork
from nlproxy.operate.findings import Finding, Level, checked


def api_server(
    server: str | None,
    source: str,
    service_cidrs: Sequence[IPNetwork],
    *,
    in_cluster_host: str | None = None,
    reachable: str | None = None,
) -> Finding:
    """Whether ``server`` (a URL) is reachable with no proxy rules on the node.

    Args:
        source: where the address came from (named in the finding).
        in_cluster_host: ``KUBERNETES_SERVICE_HOST``: always the ``kubernetes`` ClusterIP.
        reachable: the outcome of a connection attempt (None: not tried).
    """
    if server is None:
        return Finding(
            "api-server",
            Level.FAIL,
            "no API server address: give --kubeconfig, --config or --api-server (in a pod, "
            "the in-cluster address is the kubernetes Service's ClusterIP)",
        )
    host = urlsplit(server).hostname or server
    why = ""
    try:
        addr = ip_address(host)
    except ValueError:
        if host.endswith((".svc", ".svc.cluster.local")) or host.startswith("kubernetes.default"):
            why = f"{host} is a Service name: it resolves to a ClusterIP"
    else:
        if in_cluster_host is not None and host == in_cluster_host:
            why = f"{host} is KUBERNETES_SERVICE_HOST, the kubernetes Service's ClusterIP"
        for net in service_cidrs:
            if addr in net:
                why = f"{host} is in the service CIDR {net}: a ClusterIP"
    if why:
        return Finding(
            "api-server",
            Level.FAIL,
            f"{source} {server}: {why}, which only a service proxy makes reachable: a node "
            "without proxy rules (new, rebooted, cleaned up) never syncs; use the control "
            "plane's own address (docs/migrating.md)",
        )
    if reachable in (None, "connected"):
        tail = f" ({reachable})" if reachable else ""
        return Finding("api-server", Level.OK, f"{source} {server}: not a ClusterIP{tail}")
    return Finding(
        "api-server",
        Level.FAIL,
        f"{source} {server}: not a ClusterIP, but unreachable from this node ({reachable}): "
        "nlproxy could not sync",
    )


def kubeconfig_server(path: str, where: str = "--kubeconfig") -> str:
    """The current context's API server URL in the kubeconfig ``run`` would load: one file,
    named as written (``cluster.kubeconfig.opened``), read as the client's loader reads it.

    Args:
        where: the flag or field that names ``path``, in an error.

    Raises:
        ConfigError: the file cannot be opened or used (names it), or has no server for the
            current context.
    """
    opened(path, where)
    return server_of(path)


def try_connect(server: str, netns_name: str | None, timeout: float = 2.0) -> str:
    """A TCP connection to the API server through the node's current rules."""
    parts = urlsplit(server)
    host = parts.hostname or server
    port = parts.port or (443 if parts.scheme != "http" else 80)
    try:
        with netns.entered(netns_name):
            conn = socket.create_connection((host, port), timeout=timeout)
        conn.close()
    except OSError as exc:
        why = exc.strerror or errno.errorcode.get(exc.errno or 0, str(exc))
        return f"no connection: {why}"
    return "connected"


@dataclass(frozen=True, slots=True)
class Resolved:
    """Where ``run`` would find the API server, and with which credentials."""

    server: str | None
    source: str
    notes: list[Finding]
    kubeconfig: str | None = None
    """The kubeconfig ``run`` would load (None: in-cluster)."""
    override: str | None = None
    """The address that replaces the kubeconfig's or in-cluster one (``--master``/env)."""
    node_name: str = ""
    no_credentials: str = ""
    """Why ``run`` would have no credentials ("" when it has: ``config.api_source``)."""


def resolve_api_server(
    config: str | None, kubeconfig: str | None, api_server_url: str | None
) -> Resolved:
    """The API server ``run`` would reach with these inputs, where the address comes from,
    and what it would warn about, by ``run``'s own reading (:func:`nlproxy.config.daemon_config`:
    ``--master``, else ``$NLPROXY_API_SERVER``; ``--kubeconfig``, else the file's
    ``clientConnection.kubeconfig``), with ``run``'s fall-back: a kubeconfig the file names that
    does not exist on this host gives way to the in-cluster configuration.

    Raises:
        ConfigError: the address or a kubeconfig that is read is not usable (names which).
    """
    from nlproxy.config import Flags, daemon_config

    flags = Flags(kubeconfig=kubeconfig, master=api_server_url)
    try:
        cfg = daemon_config(replace(flags, config=Path(config) if config else None))
    except ConfigError:
        if not config:
            raise
        cfg = daemon_config(flags)  # the file's refusal is the config check's finding
    at = api_source(cfg)
    notes: list[Finding] = []
    if at.skipped:
        notes.append(
            Finding("api-server", Level.WARN, f"{at.skipped}: run uses the in-cluster "
                    "configuration instead")
        )  # fmt: skip
    path = at.kubeconfig
    server: str | None = None
    source = ""
    if at.api_server:
        server, source = at.api_server, "--api-server" if api_server_url else API_SERVER_ENV
    elif path:
        where = "clientConnection.kubeconfig" if cfg.kubeconfig_from_file else "--kubeconfig"
        server, source = kubeconfig_server(path, where), f"kubeconfig {path}:"
    elif not at.no_credentials:
        server, source = in_cluster.server(), "in-cluster"
    return Resolved(
        server,
        source,
        notes,
        kubeconfig=path,
        override=at.api_server,
        node_name=cfg.node_name,
        no_credentials=at.no_credentials,
    )


def api_server_findings(
    config: str | None,
    kubeconfig: str | None,
    api_server_url: str | None,
    netns_name: str | None,
    cidrs: Sequence[IPNetwork],
) -> list[Finding]:
    try:
        at = resolve_api_server(config, kubeconfig, api_server_url)
    except ConfigError as exc:
        return [Finding("api-server", Level.FAIL, str(exc))]
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    reach = try_connect(at.server, netns_name) if at.server else None
    found = api_server(at.server, at.source, cidrs, in_cluster_host=host, reachable=reach)
    out = [*at.notes, found]
    if found.level is Level.OK and reach == "connected":
        out += checked("access", lambda: access(at, netns_name))
    return out


SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
"""Where a pod's service-account token is mounted (the in-cluster configuration reads it)."""


def access(at: Resolved, netns_name: str | None) -> list[Finding]:
    """Whether ``run``'s identity may list and watch what it reads (Services, EndpointSlices,
    its Node; ServiceCIDRs when served), asked of the API server itself as ``run`` asks, and
    whether the in-cluster configuration has its service-account token.

    A kind that is refused is a ``FAIL``: the daemon would never become ready.
    """
    from nlproxy.cluster.kube import api_client_from_config, kinds
    from nlproxy.cluster.kube_http import Forbidden, Http, KubeApiError, NotServed

    if at.no_credentials:
        return [Finding("access", Level.FAIL, "no kubeconfig, and not in a pod (no "
                        "KUBERNETES_SERVICE_HOST): run would have no credentials; give "
                        "--kubeconfig")]  # fmt: skip
    if at.kubeconfig is None and not Path(SERVICE_ACCOUNT_TOKEN).exists():
        return [Finding("access", Level.FAIL, f"no service-account token at "
                        f"{SERVICE_ACCOUNT_TOKEN}: the in-cluster configuration has no identity "
                        "(automountServiceAccountToken: false?); give --kubeconfig")]  # fmt: skip
    try:
        client = api_client_from_config(at.kubeconfig, server=at.override)
    except ConfigError as exc:
        return [Finding("access", Level.FAIL, f"credentials: {exc}")]
    out: list[Finding] = []
    refused: list[str] = []
    try:
        http = Http(client)
        with netns.entered(netns_name):
            for spec in kinds(at.node_name):
                for verb, extra in (
                    ("list", [("limit", "1")]),
                    ("watch", [("watch", "1"), ("timeoutSeconds", "1")]),
                ):
                    try:
                        raw = http.get(spec, [*spec.params(), *extra], 10.0)
                    except NotServed:
                        if not spec.optional:
                            refused.append(f"{verb} {spec.kind}: not served")
                        break
                    except Forbidden as exc:
                        if spec.optional:
                            why = f"cannot {verb} {spec.kind}s (optional): {exc.reason}"
                            out.append(Finding("access", Level.WARN, why))
                        else:
                            refused.append(f"{verb} {spec.kind}s ({exc.reason})")
                    except KubeApiError as exc:
                        refused.append(f"{verb} {spec.kind}s: {exc.reason}")
                    else:
                        _close(raw)
    finally:
        _close(client)
    if refused:
        why = f"node {at.node_name}: cannot " + "; cannot ".join(refused)
        out.insert(0, Finding("access", Level.FAIL, why + ": nlproxy's ClusterRole (deploy/"
                              "kubernetes) grants list and watch of each"))  # fmt: skip
    return out or [Finding("access", Level.OK, f"node {at.node_name}: may list and watch "
                           "Services, EndpointSlices and its Node")]  # fmt: skip


def _close(conn: Any) -> None:
    """Close a response (a watch's stream unread) or the client (untyped package)."""
    conn.close()
