"""A kubeconfig as ``run`` takes it, and as the ``kubernetes`` package's loader merges it.

``run`` takes one file (kube-proxy's ``--kubeconfig`` and ``clientConnection.kubeconfig`` are
client-go's explicit path): the name as written, no ``~`` expanded and no ``:``-joined list
merged; :func:`opened` says why one cannot be opened, for ``run`` and ``preflight`` alike. The
loader (``KubeConfigMerger``), which the client is built with, expands ``~`` and merges
``a:b``: the first entry of a name wins, in a file and across files; each file that sets
``current-context`` replaces the one before, so the last one names the current context (unlike
``kubectl``, whose first file wins); a file that does not exist is skipped. :func:`merged`
reads a kubeconfig so, for what nlproxy must know beside the loader: the current context's
user (``token_file``), its server (:func:`server_of`), and why the loader refused a user's
``auth-provider`` (:func:`provider_problem`), each naming the file that defines it.

Only the standard library at import (``run``'s start-up check calls :func:`opened` before the
client is loaded); ``yaml`` is imported when a file is read.
"""

from __future__ import annotations

import base64
import binascii
import importlib.util
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from nlproxy.errors import ConfigError

LISTED = " (one file; a ':'-joined list is not merged)"
HOME = " (one file, named as written: a '~' is not expanded)"


def opened(path: str, where: str) -> None:
    """Whether ``run`` can open its kubeconfig ``path``, given by ``where`` (a flag or field).

    Raises:
        ConfigError: it cannot, naming ``where`` and the file, and why: a ``:``-joined list or
            a ``~`` is said to be taken as one file name (kube-proxy's reading).
    """
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        hint = LISTED if ":" in path else HOME if path.startswith("~") else ""
        raise ConfigError(where, f"{path}: {exc.strerror}{hint}") from exc


@dataclass(frozen=True, slots=True)
class Merged:
    """A kubeconfig's files merged as the loader merges them.

    Attributes:
        current: the ``current-context`` of the last file that sets one (None: none does).
        contexts, clusters, users: each name's section (``context``, ``cluster``, ``user``)
            with the file that defines it, the first definition of a name winning.
    """

    current: Any
    contexts: dict[Any, tuple[str, Any]]
    clusters: dict[Any, tuple[str, Any]]
    users: dict[Any, tuple[str, Any]]


def merged(kubeconfig: str) -> Merged | None:
    """``kubeconfig`` (a file, or files joined by ``:``) read and merged as the loader reads
    it: ``~`` expanded, a file that does not exist skipped; None when none exists.

    Raises:
        ConfigError: a file that exists cannot be read, is not YAML, is empty or is not a
            mapping, as the loader refuses it (names the file).
    """
    import yaml

    found = Merged(None, {}, {}, {})
    seen = False
    for part in kubeconfig.split(":"):
        path = os.path.abspath(os.path.expanduser(part)) if part else ""
        if not path or not os.path.exists(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                doc = yaml.safe_load(f)
        except OSError as exc:
            raise ConfigError(f"kubeconfig {path}", exc.strerror or str(exc)) from exc
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            why = " ".join(str(exc).split())
            raise ConfigError(f"kubeconfig {path}", f"not YAML: {why}") from exc
        if doc is None:
            raise ConfigError(f"kubeconfig {path}", "the file is empty")
        if not isinstance(doc, dict):
            raise ConfigError(f"kubeconfig {path}", "not a YAML mapping")
        seen = True
        for kind, into in (
            ("context", found.contexts),
            ("cluster", found.clusters),
            ("user", found.users),
        ):
            for name, entry in _entries(doc.get(f"{kind}s")):
                into.setdefault(name, (path, entry.get(kind)))
        if "current-context" in doc:
            found = Merged(doc["current-context"], found.contexts, found.clusters, found.users)
    return found if seen else None


def _entries(entries: Any) -> list[tuple[Any, dict[str, Any]]]:
    """A kubeconfig list's named entries, with their names (other entries are no one's). A
    name is any YAML scalar: the loader compares names as YAML typed them, so ``name: 1``
    with ``current-context: 1`` is a match, as ``on`` (true) with ``cluster: on`` is."""
    if not isinstance(entries, list):
        return []
    return [(e["name"], e) for e in entries if isinstance(e, dict) and _named(e.get("name"))]


def _named(value: Any) -> bool:
    """Whether ``value`` can name an entry (a YAML scalar the loader compares by ``==``)."""
    return isinstance(value, str | int | float)


def server_of(kubeconfig: str, context: str | None = None) -> str:
    """The API server URL of ``context`` (default: the current context) in ``kubeconfig``,
    read as the loader reads it (:func:`merged`).

    Raises:
        ConfigError: what :func:`checked` refuses with ``server``.
    """
    return _server(*_sections(kubeconfig, context))


def checked(kubeconfig: str, context: str | None = None, *, server: bool = True) -> None:
    """Refuse what the loader would refuse, or fail on, in the sections ``context`` (default:
    the current context) picks, in one line naming the file that defines each (the loader's
    own words dump a section, or are a Python ``TypeError``). ``server``: the cluster's
    ``server`` is needed (no ``--master`` replaces it).

    Raises:
        ConfigError: no file; no current context, or no context of that name; a context, its
            cluster or its user that is not a mapping; a cluster that is not defined; with
            ``server``, a cluster without a ``server``, or one that is not a string.
    """
    sections = _sections(kubeconfig, context)
    if server:
        _server(*sections)


def _sections(kubeconfig: str, context: str | None) -> tuple[str, str, dict[str, Any]]:
    """The current context's cluster (the file defining it, its name, its section), once the
    sections the loader reads on the way are checked (:func:`checked`)."""
    found = merged(kubeconfig)
    where = f"kubeconfig {kubeconfig}"
    if found is None:
        none = "none of its files exists" if ":" in kubeconfig else "No such file or directory"
        raise ConfigError(where, none)
    name = context or found.current
    if name is None or name == "":
        raise ConfigError(where, "no current-context")
    if not _named(name) or name not in found.contexts:
        raise ConfigError(where, f"current-context {name}: no context of that name")
    path, ctx = found.contexts[name]
    _mapping(path, f"context {name}", ctx)
    cluster, user = ctx.get("cluster"), ctx.get("user")
    if not _named(cluster) or cluster not in found.clusters:
        raise ConfigError(
            f"kubeconfig {path}", f"context {name}: cluster {cluster}: no cluster of that name"
        )
    # a false name, or one not defined, is no user (the loader's)
    if user and _named(user) and user in found.users:
        user_path, section = found.users[user]
        _mapping(user_path, f"user {user}", section)
    path, section = found.clusters[cluster]
    _mapping(path, f"cluster {cluster}", section)
    return path, cluster, section


def _server(path: str, cluster: str, section: dict[str, Any]) -> str:
    url = section.get("server")
    if url is None or url == "":
        raise ConfigError(f"kubeconfig {path}", f"cluster {cluster} has no server")
    if not isinstance(url, str):
        raise ConfigError(f"kubeconfig {path}", f"cluster {cluster}: server {url!r} is no URL")
    return url


def _mapping(path: str, what: str, section: Any) -> None:
    """Raise ``ConfigError`` unless ``what``'s section (``context``, ``cluster``, ``user``)
    is a mapping."""
    if not isinstance(section, dict):
        kind = what.split(" ", 1)[0]
        why = "is empty" if section is None else "is not a mapping"
        raise ConfigError(f"kubeconfig {path}", f"{what}: its {kind} {why}")


def user_of(kubeconfig: str, context: str | None) -> tuple[str, Any, dict[str, Any]] | None:
    """The file defining ``context``'s user (default: the current context's), the user's
    name and its ``user`` section, read as :func:`merged` reads it; None when there is none
    (or the files cannot be read: the loader says why).
    """
    try:
        found = merged(kubeconfig)
    except ConfigError:
        return None
    if found is None:
        return None
    ctx = found.contexts.get(_name(context or found.current), ("", None))[1]
    name = _name(ctx.get("user")) if isinstance(ctx, dict) else ""
    path, user = found.users.get(name, ("", None))
    if not isinstance(user, dict) or not user:
        return None
    return path, name, user


def _name(value: Any) -> Any:
    return value if value and _named(value) else ""


def jwt_payload(token: str) -> str | None:
    """The base64 payload of ``token`` when the loader takes it for a JWT (three URL-safe
    parts, the middle one's length possible in base64), else None."""
    parts = token.split(".")
    if set("=+/") & set(token) or len(parts) != 3 or len(parts[1]) % 4 == 1:
        return None
    return parts[1]


def provider_problem(user: Mapping[str, Any], cause: str = "") -> str | None:
    """What the loader cannot use in ``user``'s ``auth-provider`` (one it takes: ``gcp``, and
    ``oidc`` with a ``config``), in words, or None when the shape is one it can use or passes
    over. Called when the loader failed, to say why instead of its own words (a Python
    ``KeyError`` or ``TypeError``, or a dump of the user's section); ``cause``, the loader's
    error in short, is added where a token it would have refreshed is what failed."""
    if "auth-provider" not in user:
        return None
    provider = user["auth-provider"]
    if not isinstance(provider, dict):
        return "auth-provider: not a mapping" if provider is None else None
    name = provider.get("name")
    config = provider.get("config")
    if name == "gcp":
        return _gcp_problem(config, cause)
    if name != "oidc" or "config" not in provider:
        return None
    if not isinstance(config, dict):
        return "auth-provider oidc: config is not a mapping"
    token = config.get("id-token")
    if token is None:
        return "auth-provider oidc: config has no id-token"
    if not isinstance(token, str):
        return "auth-provider oidc: id-token is not a string"
    payload = jwt_payload(token)
    if payload is None:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (binascii.Error, ValueError):
        claims = None
    if not isinstance(claims, dict):
        return "auth-provider oidc: id-token is not a JWT (its payload is no JSON object)"
    exp = claims.get("exp")
    if exp is not None and (not isinstance(exp, int | float) or isinstance(exp, bool)):
        return f"auth-provider oidc: id-token: exp {exp!r} is not a number"
    if exp is not None and exp <= datetime.now(UTC).timestamp():
        return f"auth-provider oidc: id-token expired, and could not be refreshed{cause}"
    return None


GCP_SKEW = timedelta(minutes=5)
"""How long before its ``expiry`` the loader takes a gcp ``access-token`` for expired."""


def _gcp_problem(config: Any, cause: str) -> str | None:
    """Why the loader refused a ``gcp`` provider, or None when it sends its ``access-token``
    as it is (the failure is elsewhere): it does while ``expiry`` is more than
    :data:`GCP_SKEW` away, and otherwise asks ``cmd-path``, or else Google's libraries, for a
    new one."""
    if not isinstance(config, dict) or "access-token" not in config:
        return f"auth-provider gcp: no access-token, and none could be had{_gcp_way(config, cause)}"
    expiry = config.get("expiry")
    if expiry is None:
        return None
    from kubernetes.config.dateutil import parse_rfc3339  # the loader's own reading

    try:
        when: datetime = parse_rfc3339(expiry)  # type: ignore[no-untyped-call]
    except Exception:  # a ValueError, or an AttributeError for a YAML date  # noqa: BLE001
        return f"auth-provider gcp: expiry {expiry!r} is not an RFC 3339 time"
    if when - GCP_SKEW > datetime.now(UTC):
        return None
    way = _gcp_way(config, cause)
    return f"auth-provider gcp: access-token expired, and no new one could be had{way}"


def _gcp_way(config: Any, cause: str) -> str:
    """How the loader tried for a new gcp token, and the loader's ``cause`` of its failure."""
    if isinstance(config, dict) and "cmd-path" in config:
        return f" from cmd-path{cause}"
    try:
        installed = importlib.util.find_spec("google.auth") is not None
    except ImportError:  # no ``google`` package at all
        installed = False
    return cause if installed else " (by google-auth, which is not installed)"


PROVIDER_STEPS = frozenset(
    {
        "_load_auth_provider_token",
        "_load_gcp_token",
        "_refresh_gcp_token",
        "_load_oid_token",
        "_refresh_oidc",
    }
)
"""The loader's methods for a user's ``auth-provider``: a failure raised through one of them
is the provider's; one raised elsewhere (a certificate file, a refreshed token then a missing
CA) is not, whatever the provider's shape."""


def in_provider(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in PROVIDER_STEPS:
            return True
        tb = tb.tb_next
    return False


def loader_words(exc: Exception) -> str:
    """The loader's error on one line, its "File does not exist: NAME" (which it says of a
    directory too) said as a file that cannot be opened is said elsewhere, and never the
    section it dumps with "Expected key" (a user's keys and tokens are in it): what comes
    before (an exec plugin's name), the section's path and the key stay."""
    raw = str(exc)
    name = raw.removeprefix("File does not exist: ")
    if name != raw:
        return f"{name}: {'Is a directory' if os.path.isdir(name) else 'No such file or directory'}"
    text = " ".join(raw.split())
    expected = re.search(r"Expected key (\S+)(?: in .*\}/([\w/-]+))?", text)
    if expected is None:
        return text
    before = text[: expected.start()].replace("Invalid kube-config file.", "").strip()
    section = f"{expected[2]}: " if expected[2] else ""
    return f"{before} {section}{expected[1]} is missing or empty".strip()


def loader_cause(exc: Exception) -> str:
    """The loader's error in short, as ``" (...)"``: a key it expected is named as missing
    (its message goes on with a dump of the section), anything else said on one line."""
    text = " ".join(str(exc).split())
    expected = re.search(r"Expected key (\S+)", text)
    if expected is not None:
        return f" (no {expected[1]})"
    return f" ({type(exc).__name__}: {text})" if text else f" ({type(exc).__name__})"
