"""A kubeconfig user's ``tokenFile``, read again while the daemon runs.

kubeadm's kube-proxy kubeconfig (the one the shipped DaemonSet mounts) names the pod's
projected service account token as ``tokenFile``; the kubelet rewrites that file well before
the token expires (an hour, where the API server does not extend it). The ``kubernetes``
package's kubeconfig loader reads a ``tokenFile`` once, when it loads, and its refresh hook
reloads only credentials that carry an expiry, so the daemon would send the first token until
the server refuses it. :class:`TokenFileRefresh` reads the file again every
``TOKEN_FILE_SECONDS`` (as ``kubectl``'s own client re-reads a token file), with surrounding
whitespace trimmed, as the client sends it. The in-cluster service account token is read the
same way (the in-cluster loader sends the file untrimmed: a trailing newline made every request
fail with "Invalid header value").
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from nlproxy.cluster.kube_client import ConfigException, Configuration
from nlproxy.cluster.kubeconfig import jwt_payload, user_of

TOKEN_FILE_SECONDS = 60.0
"""How often a kubeconfig user's token file is read again."""


def token_file_of(kubeconfig: str, context: str | None) -> str | None:
    """The ``tokenFile`` of ``context``'s user (default: the current context's), resolved
    beside the file that defines that user; None when the user has none, or an
    ``auth-provider`` the loader takes instead (:func:`provider_taken`).

    ``kubeconfig`` is read as the loader reads it: ``~`` expanded, several files joined by
    ``:`` merged with the first definition of a name winning and the last file's
    ``current-context`` (``kubeconfig.user_of``). A user with both ``token`` and
    ``tokenFile`` is given the file's token, as kube-proxy's client reads it (the loader
    would send ``token``). A file that cannot be read is skipped: the loader loaded them.
    """
    found = user_of(kubeconfig, context)
    if found is None:
        return None
    path, _, user = found
    file = user.get("tokenFile")
    if not isinstance(file, str) or not file or provider_taken(user):
        return None
    return os.path.join(os.path.dirname(path), file)


def provider_taken(user: dict[str, Any]) -> bool:
    """Whether the loader (``_load_auth_provider_token``) takes the user's ``auth-provider``
    before its ``tokenFile``, ``token`` or ``exec``: a ``gcp`` one always; an ``oidc`` one
    when its ``config`` holds an ``id-token`` shaped as a JWT (three URL-safe parts, the
    middle one's length possible in base64); any other name, or none, it passes over."""
    provider = user.get("auth-provider")
    if not isinstance(provider, dict):
        return False
    if provider.get("name") == "gcp":
        return True
    config = provider.get("config")
    if provider.get("name") != "oidc" or not isinstance(config, dict):
        return False
    token = config.get("id-token")
    if not isinstance(token, str):
        return True  # the loader fails on it: no tokenFile is read either
    return jwt_payload(token) is not None


def exec_plugin_of(kubeconfig: str, context: str | None) -> str | None:
    """``exec plugin COMMAND of kubeconfig user NAME`` when ``context``'s user (read as
    :func:`token_file_of` reads it) gets its credentials from an exec plugin, else None:
    the loader runs the plugin only without an ``auth-provider`` it takes, a ``token`` or a
    ``tokenFile``."""
    found = user_of(kubeconfig, context)
    if found is None:
        return None
    user = found[2]
    plugin = user.get("exec")
    first = provider_taken(user) or user.get("token") or user.get("tokenFile")
    if not isinstance(plugin, dict) or first:
        return None
    return f"exec plugin {plugin.get('command')} of kubeconfig user {found[1]}"


class TokenFileRefresh:
    """A configuration's refresh hook, in place of the loader's, that reads ``path`` again
    every ``TOKEN_FILE_SECONDS`` and sets its token (the loader's hook would set the token it
    loaded back, from any request's thread, between this hook and the request). A read that
    fails leaves the last token read in place and raises: the request goes with it
    (``kube_client.Client.renewed_headers``), and the next one reads again.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._token: str | None = None
        self._read_at = 0.0
        self._lock = threading.Lock()  # requests come from several threads

    def __call__(self, cfg: Configuration) -> None:
        with self._lock:
            if self._token is not None and time.monotonic() - self._read_at < TOKEN_FILE_SECONDS:
                return
            token = Path(self.path).read_text(encoding="utf-8").strip()
            if not token:
                raise ConfigException(f"token file {self.path} exists but is empty")
            self._token, self._read_at = f"Bearer {token}", time.monotonic()
            cfg.api_key["BearerToken"] = self._token
