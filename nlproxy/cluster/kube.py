"""The Kubernetes API source: list + watch Services, EndpointSlices, this Node and ServiceCIDRs.

First stage of the flow (DESIGN §1): turns the API server's objects into change events for the
cluster state. Each kind is listed in pages (one ``Replace`` per kind), then watched from the
list's resourceVersion with bookmarks and a server-side timeout; ``410 Gone`` relists and sends a
new ``Replace`` so deletions missed while disconnected are applied; any other failure retries,
resuming from the last resourceVersion: at once when a shared probe finds an unreachable API
server back, after a per-kind jittered backoff when the server answered with an error
(``kube_link.py``).

Required kinds (Services, EndpointSlices, this Node, as kube-proxy, which waits for its Node
informer before it syncs) hold up the first sync until they are listed; a permission refused on
one of them is reported (``on_unavailable``, for ``/healthz``) and retried. A refusal of a kind
read before is reported only once it outlasts a grace period (``REFUSAL_GRACE``): a restarting
API server refuses everyone for a moment. An optional kind
(ServiceCIDRs) that this identity may not read, or the cluster does not serve, is sent as absent
and retried in the background, so the rest is programmed at once.

It must not emit anything because the API is unreachable: a ``Replace`` only ever comes from a
complete, successful list, so an outage leaves the programmed rules alone. Blocking HTTP runs in
worker threads (``kube_http.py``); nothing here blocks the event loop.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, NoReturn
from urllib.parse import urlsplit

import trio
import yaml

from nlproxy.cluster import kube_client
from nlproxy.cluster.kube_http import (
    Forbidden,
    Gone,
    Http,
    KindSpec,
    KubeApiError,
    Listing,
    NotServed,
    PageHook,
    RequestHook,
    Unreachable,
    WatchStream,
    deliver_to,
    list_kind,
)
from nlproxy.cluster.kube_link import ApiLink, Backoff, Unavailable
from nlproxy.cluster.kubeconfig import (
    checked,
    in_provider,
    loader_cause,
    loader_words,
    provider_problem,
    user_of,
)
from nlproxy.cluster.model import Change, Invalid, IPNetwork, Replace, Skip, Upsert
from nlproxy.cluster.ratelimit import TokenBucket
from nlproxy.cluster.sections import HEADLESS_LABEL, SERVICE_PROXY_NAME_LABEL
from nlproxy.cluster.token_file import TokenFileRefresh, exec_plugin_of, token_file_of
from nlproxy.errors import ConfigError
from nlproxy.log import get_logger
from nlproxy.runtime import hotpath

__all__ = [
    "Backoff",
    "KindSpec",
    "KubeApiError",
    "KubeSource",
    "Unavailable",
    "api_client_from_config",
    "kinds",
]

# kube-proxy's informer selectors: objects owned by another proxy and headless services' objects
# are filtered by the server, so they never cost us a byte.
NOT_OURS = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"


def ours(proxy_name: str | None) -> str:
    """The label selector of the Services (and slices) a proxy named ``proxy_name`` serves:
    kube-proxy's ``NOT_OURS`` for the default, unnamed proxy; exactly those labelled
    ``service.kubernetes.io/service-proxy-name=<name>`` for a named one (``sections.not_ours``).
    A Service whose label changes moves in or out of the selection: the server sends a watch
    event for it (``DELETED`` when it leaves)."""
    if proxy_name is None:
        return NOT_OURS
    return f"{SERVICE_PROXY_NAME_LABEL}={proxy_name},!{HEADLESS_LABEL}"


# A watch that ends normally this soon without delivering anything still backs off, so a server
# that closes every watch at once cannot make us spin.
_HEALTHY_WATCH_SECONDS = 5.0
_DENIED = {401: "unauthorized", 403: "forbidden"}
REFUSAL_GRACE = 10.0
"""Seconds a required kind that was read before may be refused before it is reported: for up
to about 1.5 s after it starts, kube-apiserver's authorizer answers 403 to every identity
without cluster-admin rights, and every node would fail ``/healthz`` at once."""


def kinds(node_name: str, proxy_name: str | None = None) -> tuple[KindSpec, ...]:
    """What the source watches, with the server-side selectors that narrow each kind; only the
    Services and slices of ``proxy_name`` (``ours``)."""
    selected = ours(proxy_name)
    return (
        KindSpec("Service", "/api/v1/services", label_selector=selected, proxy_name=proxy_name),
        KindSpec(
            "EndpointSlice",
            "/apis/discovery.k8s.io/v1/endpointslices",
            label_selector=f"kubernetes.io/service-name,{selected}",
            proxy_name=proxy_name,
        ),
        KindSpec("Node", "/api/v1/nodes", field_selector=f"metadata.name={node_name}"),
        KindSpec("ServiceCIDR", "/apis/networking.k8s.io/v1/servicecidrs", optional=True),
    )


def api_client_from_config(
    kubeconfig: str | None, *, context: str | None = None, server: str | None = None
) -> kube_client.Client:
    """The client (``kube_client.Client``: the ``kubernetes`` package's configuration and REST
    client) from a kubeconfig file, or in-cluster when ``kubeconfig`` is None.

    Token files, exec plugins and their refresh come from the ``kubernetes`` package; a
    kubeconfig user's ``tokenFile`` is also read again while the daemon runs
    (``token_file.py``), which the package's loader does not do.
    ``server`` (``https://host:port``) replaces the address the kubeconfig or the in-cluster
    environment names, keeping their credentials: in a pod, ``KUBERNETES_SERVICE_HOST`` is the
    ``kubernetes`` Service's ClusterIP, which only a service proxy's rules make reachable.

    Raises:
        ConfigError: the kubeconfig cannot be loaded, or none was given outside a pod.
    """
    cfg = kube_client.Configuration()
    try:
        _load(cfg, kubeconfig, context, server)
        # No retries inside a request: the source retries with its own backoff and probes
        # (kube_link.py), and the client's would repeat a connect timeout three times more,
        # each with a "Retrying (Retry(total=...))" warning of urllib3's.
        cfg.retries = False
    except kube_client.ConfigException as exc:
        raise ConfigError(f"kubeconfig {kubeconfig or '(in-cluster)'}", loader_words(exc)) from exc
    except (OSError, yaml.YAMLError) as exc:
        # A file the kubeconfig names (a tokenFile, a certificate-authority) is named itself:
        # "kubeconfig X: No such file or directory" read as if X were missing.
        if isinstance(exc, OSError):
            named = f"{exc.filename}: " if exc.filename and exc.filename != kubeconfig else ""
            why = named + (exc.strerror or str(exc))
        else:
            why = str(exc)
        raise ConfigError(f"kubeconfig {kubeconfig}", why) from exc
    token_file: str | None
    if kubeconfig is not None:
        token_file = token_file_of(kubeconfig, context)
        where = f"kubeconfig {kubeconfig}"
        plugin = exec_plugin_of(kubeconfig, context)
        if plugin is not None:  # its failures are said naming it (kube_client.plugin_failures)
            where = f"{plugin} ({where})"
    else:
        # The pod's service account token, read as a kubeconfig's tokenFile is (trimmed, again
        # every TOKEN_FILE_SECONDS): the in-cluster loader sends the file as it is, and a
        # trailing newline ends every request with "Invalid header value".
        token_file = kube_client.in_cluster_loading().SERVICE_TOKEN_FILENAME
        where = "kubeconfig (in-cluster)"
    if token_file is not None:
        _renew_token_file(cfg, token_file, where)
    credentials = f"token file {token_file}" if token_file is not None else where
    return kube_client.Client(cfg, credentials)


def _load(
    cfg: kube_client.Configuration, kubeconfig: str | None, context: str | None, server: str | None
) -> None:
    """Load ``cfg`` with the client's loader (see :func:`api_client_from_config`).

    Raises:
        ConfigException: also when the kubeconfig user's exec plugin failed, which the loader
            catches and logs (``kube_client.plugin_failures``): there is nothing to send.
    """
    if kubeconfig is not None:
        checked(kubeconfig, context, server=server is None)
        with kube_client.plugin_failures() as failed:
            try:
                _load_kubeconfig(cfg, kubeconfig, context, server)
            except (OSError, yaml.YAMLError):
                raise
            except Exception as exc:
                # The loader fails on a file's shape in ways it does not declare (KeyError,
                # TypeError, a JSON error on a token): the user's to fix, said as such.
                raise _refused(kubeconfig, context, exc) from exc
        if failed:
            plugin = exec_plugin_of(kubeconfig, context) or "exec plugin"
            raise kube_client.ConfigException(f"{plugin}: {failed[-1]}")
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        _in_cluster_loader(server).load_and_set(cfg)
    else:
        raise ConfigError("kubeconfig", "none given, and not running in a pod")


def _load_kubeconfig(
    cfg: kube_client.Configuration, kubeconfig: str, context: str | None, server: str | None
) -> None:
    if server is not None:
        _kubeconfig_loader(kubeconfig, context, server).load_and_set(cfg)
    else:
        kube_client.kubeconfig_loading().load_kube_config(
            config_file=kubeconfig,
            context=context,
            client_configuration=cfg,
            persist_config=False,
        )


def _refused(kubeconfig: str, context: str | None, exc: Exception) -> Exception:
    """What to raise for the loader's failure on ``kubeconfig``: a ``ConfigError`` naming the
    file and user when the user's ``auth-provider`` is what it could not use (it failed in
    its steps for one, ``kubeconfig.PROVIDER_STEPS``, as a ``KeyError``, a ``TypeError``, or a
    dump of the user's section), else its own ``ConfigException``; anything else it raised is
    said as a ``ConfigException`` too, for the loader fails on a file's shape in ways it does
    not declare (a list where a mapping is due).
    """
    found = user_of(kubeconfig, context) if in_provider(exc) else None
    problem = provider_problem(found[2], loader_cause(exc)) if found is not None else None
    if found is not None and problem is not None:
        return ConfigError(f"kubeconfig {found[0]}", f"user {found[1]}: {problem}")
    if isinstance(exc, kube_client.ConfigException):
        return exc
    return kube_client.ConfigException(f"cannot be loaded ({type(exc).__name__}: {exc})")


def _renew_token_file(cfg: kube_client.Configuration, token_file: str, where: str) -> None:
    """Have ``cfg`` read ``token_file`` again while the daemon runs (``token_file.py``: the
    loaders would send the first token for good, the in-cluster one untrimmed).

    Raises:
        ConfigError: the token file cannot be read now (named with ``where`` the
            credentials come from).
    """
    refresh: Any = TokenFileRefresh(token_file)
    try:
        refresh(cfg)  # read as the daemon reads it from now on (trimmed)
    except OSError as exc:
        raise ConfigError(where, f"{token_file}: {exc.strerror}") from exc
    except kube_client.ConfigException as exc:
        raise ConfigError(where, str(exc)) from exc
    cfg.refresh_api_key_hook = refresh  # the stubs type the hook None


# The loaders' token-refresh hooks copy their own host into the configuration before every
# request (from any thread): the server is replaced in what they load, never in the
# configuration afterwards.


def _kubeconfig_loader(path: str, context: str | None, server: str) -> Any:
    """A kubeconfig loader whose current cluster's ``server`` is ``server``.

    ``path`` is read as ``load_kube_config`` reads it: several files joined by ``:`` merged
    (the first definition of a name wins, a file that does not exist is skipped), relative
    file names resolved beside the file that defines them.
    """
    loading = kube_client.kubeconfig_loading()
    merged = loading.KubeConfigMerger(path).config
    if merged is None:  # no file of the list exists: said as the loader says it
        raise kube_client.ConfigException("Invalid kube-config file. No configuration found.")
    doc = merged.value
    name = context or doc.get("current-context")
    # The merged lists hold each file's entries wrapped (their ``value`` is the entry).
    contexts = {e.get("name"): e.get("context") for e in map(_entry, doc.get("contexts") or ())}
    ctx = contexts.get(name)
    for entry in map(_entry, doc.get("clusters") or ()):
        if isinstance(ctx, dict) and entry.get("name") == ctx.get("cluster"):
            entry.setdefault("cluster", {})["server"] = server
    # No base path: each file's relative names resolve beside it (``load_kube_config``'s way).
    return loading.KubeConfigLoader(
        config_dict=merged, active_context=context, config_base_path=None
    )


def _entry(node: Any) -> dict[str, Any]:
    """A merged kubeconfig list's entry as a dict (the merger wraps each in a node)."""
    value = getattr(node, "value", node)
    return value if isinstance(value, dict) else {}


def _in_cluster_loader(server: str | None) -> Any:
    """The in-cluster loader (the pod's service account token and CA), reaching ``server``
    instead of ``KUBERNETES_SERVICE_HOST``/``PORT`` when given."""
    incluster = kube_client.in_cluster_loading()
    environ = dict(os.environ)
    if server is not None:
        url = urlsplit(server)
        environ["KUBERNETES_SERVICE_HOST"] = url.hostname or ""
        environ["KUBERNETES_SERVICE_PORT"] = str(url.port or 443)
    return incluster.InClusterConfigLoader(
        token_filename=incluster.SERVICE_TOKEN_FILENAME,
        cert_filename=incluster.SERVICE_CERT_FILENAME,
        environ=environ,
    )


class KubeSource:
    """List + watch the API server and stream changes into a trio channel.

    Args:
        api_client: the client (``kube_client.Client``, see ``api_client_from_config``).
        node_name: this node; only its Node object is watched.
        page_size: objects per list page (``limit``).
        watch_timeout: server-side ``timeoutSeconds`` of every watch.
        backoff_initial, backoff_max: retry delays of a kind after an error answer, in seconds.
        probe_initial, probe_max: the probe interval while the API server is unreachable.
        service_cidrs: the configured ``--service-cidr``; only named in the log line saying
            what the drop rule for unallocated ClusterIPs uses without ServiceCIDR objects.
        on_unavailable: called with every kind that may not be read right now (empty when all
            can), each time that set changes: for the metrics and ``/healthz``.
        refusal_grace: how long a required kind read before may be refused before it is
            reported (``_in_grace``).
        on_request: told of every request (method, ``host:port``, status or None, seconds):
            client-go's ``rest_client_*`` metrics.
        on_down: told why the API server does not answer once an outage is warned of, and
            ``None`` when it answers again (``ApiLink``): for ``/healthz``.
        unreachable: the reason to give when it does not answer (``in_cluster.unreachable``
            for the in-cluster fallback); default: the error.
        limit: the client's rate limit (``TokenBucket`` of ``--kube-api-qps`` and
            ``--kube-api-burst``), taken by every request; None: no limit.
        proxy_name: serve only the Services labelled
            ``service.kubernetes.io/service-proxy-name`` with this name (``--service-proxy-name``,
            a canary beside kube-proxy); None: those without the label, as kube-proxy.
        on_page: told of each page of the initial lists as soon as it is decoded, on the
            event loop, before the lists are complete and sent (``ClusterState.preload``: the
            state is built while the API server prepares the next pages, not after the last).
            Relists do not call it: the sync loop runs then.
        on_listed: told, on the event loop, of each kind whose initial list is complete
            (its pages all handed to ``on_page``), before the lists are sent.
    """

    def __init__(
        self,
        api_client: kube_client.Client,
        *,
        node_name: str,
        page_size: int = 500,
        watch_timeout: int = 300,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        probe_initial: float = 0.1,
        probe_max: float = 1.0,
        service_cidrs: Sequence[IPNetwork] = (),
        on_unavailable: Callable[[Mapping[str, Unavailable]], None] | None = None,
        refusal_grace: float = REFUSAL_GRACE,
        on_request: RequestHook | None = None,
        on_down: Callable[[str | None], None] | None = None,
        unreachable: str = "",
        proxy_name: str | None = None,
        limit: TokenBucket | None = None,
        on_page: PageHook | None = None,
        on_listed: Callable[[str], object] | None = None,
    ) -> None:
        self._http = Http(api_client, on_request, limit)
        self.node_name = node_name
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self._backoff = (backoff_initial, backoff_max)
        self.link = ApiLink(
            self._http.probe,
            initial=probe_initial,
            maximum=probe_max,
            on_down=on_down,
            unreachable=unreachable,
        )
        self.kinds = kinds(node_name, proxy_name)
        self.unavailable: dict[str, Unavailable] = {}
        self._on_unavailable = on_unavailable
        self._service_cidrs = tuple(service_cidrs)
        self._log = get_logger("kube-source")
        self._refusal_grace = refusal_grace
        self._was_read: set[str] = set()
        self._refused_since: dict[str, float] = {}
        self._on_page = on_page
        self._on_listed = on_listed

    async def run(
        self,
        send: trio.MemorySendChannel[Sequence[Change]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> NoReturn:
        """Send one batch with a ``Replace`` per kind, report started, then stream changes.

        Retries until every required kind is listed; an optional kind this identity may not
        read (or the cluster does not serve) is sent as an empty ``Replace`` and retried in the
        background. Never returns. May be run again after it failed: its lists are then
        sent as they are (no ``on_page``, ``on_listed``), replacing what the state holds.

        Raises:
            trio.BrokenResourceError: the receiving end of ``send`` was closed.

        Cancellation: stops promptly; requests in flight are aborted or abandoned to their
        threads, which end within the socket timeouts.
        """
        versions = await self._initial_lists(send)
        # The page hooks are a cold start's (they run before the sync loop does): a source
        # run again (the daemon runs it once; a failure ends the daemon) sends Replaces only.
        self._on_page = self._on_listed = None
        task_status.started()
        async with trio.open_nursery() as nursery:
            for spec in self.kinds:
                nursery.start_soon(self._follow, spec, versions[spec.kind], send)
        raise AssertionError("watch loops never return")

    async def _initial_lists(
        self, send: trio.MemorySendChannel[Sequence[Change]]
    ) -> dict[str, str | None]:
        """List every kind and send one batch of a ``Replace`` per kind; returns the lists'
        resourceVersions (None: not listed, the watch loop lists it). Its own frame, so the
        lists (every object of the cluster) are not kept alive by this source once the cluster
        state holds them."""
        versions: dict[str, str | None] = {}
        replaces: dict[str, Replace] = {}
        async with trio.open_nursery() as nursery:
            for spec in self.kinds:
                nursery.start_soon(self._initial, spec, replaces, versions)
        await send.send([replaces[spec.kind] for spec in self.kinds])
        self._log.info(
            "source.synced",
            **{s.kind: len(replaces[s.kind].changes) for s in self.kinds},
            unavailable=sorted(self.unavailable),
        )
        return versions

    async def _initial(
        self, spec: KindSpec, replaces: dict[str, Replace], versions: dict[str, str | None]
    ) -> None:
        backoff = Backoff(*self._backoff)
        while True:
            try:
                listing = await self._list(spec, initial=True)
            except (Forbidden, NotServed) as exc:
                self._refused(spec, exc)
                if spec.optional:  # absent for now: the watch loop keeps trying to list it
                    replaces[spec.kind] = Replace(kind=spec.kind, changes=())
                    versions[spec.kind] = None
                    return
                await trio.sleep(backoff.next())
                continue
            except Unreachable as exc:
                await self.link.wait_until_back(spec.kind, exc)
                continue
            except KubeApiError as exc:
                await self._wait_retry(backoff, spec, "source.list_error", exc)
                continue
            replaces[spec.kind] = Replace(kind=spec.kind, changes=listing.changes)
            versions[spec.kind] = listing.resource_version
            if self._on_listed is not None:
                self._on_listed(spec.kind)
            return

    async def _follow(
        self,
        spec: KindSpec,
        rv: str | None,
        send: trio.MemorySendChannel[Sequence[Change]],
    ) -> NoReturn:
        """Watch ``spec`` forever from ``rv``; relist (sending a Replace) when ``rv`` is None."""
        backoff = Backoff(*self._backoff)
        while True:
            relisted = rv is None
            try:
                if rv is None:
                    rv = await self._relist(spec, send)
                started = trio.current_time()
                stream = WatchStream(
                    self._http,
                    spec,
                    rv,
                    self.watch_timeout,
                    deliver_to(send),
                    opened=partial(trio.from_thread.run_sync, self._watching, spec),
                )
                try:
                    await self._watch(stream)
                finally:  # resume from the last event or bookmark, even after an error
                    rv, events = stream.resource_version, stream.events
            except Gone as exc:
                self._log.info("source.relist", kind=spec.kind, reason=str(exc))
                rv = None
                if relisted:  # Gone right after a fresh list: don't hammer a confused server
                    await trio.sleep(backoff.next())
            except (Forbidden, NotServed) as exc:
                # Keep what was listed (as in an outage) and ask again later: a role that
                # gains the permission takes effect without a restart. A kind the cluster does
                # not serve only appears with an upgrade: asked about every watch timeout.
                self._refused(spec, exc)
                absent = isinstance(exc, NotServed) and spec.optional
                await trio.sleep(self.watch_timeout if absent else self._retry_in(spec, backoff))
            except Unreachable as exc:
                await self.link.wait_until_back(spec.kind, exc)
            except KubeApiError as exc:
                await self._wait_retry(backoff, spec, "source.watch_error", exc)
            else:
                if events or trio.current_time() - started >= _HEALTHY_WATCH_SECONDS:
                    backoff.reset()
                else:  # ended at once with nothing: don't let a server spin us
                    await trio.sleep(backoff.next())

    async def _relist(self, spec: KindSpec, send: trio.MemorySendChannel[Sequence[Change]]) -> str:
        """List ``spec`` and send it as a ``Replace``; returns the list's resourceVersion (the
        list itself is not kept by the watch loop)."""
        listing = await self._list(spec)
        await send.send([Replace(kind=spec.kind, changes=listing.changes)])
        return listing.resource_version

    def _refused(self, spec: KindSpec, exc: Forbidden | NotServed) -> None:
        """Record that ``spec`` may not be read; warn once (not at every retry)."""
        verb = exc.verb if isinstance(exc, Forbidden) else "list"
        reason = "not-served" if isinstance(exc, NotServed) else _DENIED.get(exc.status, "denied")
        problem = Unavailable(spec.kind, verb, reason, not spec.optional, exc.reason)
        if self._in_grace(spec, problem):
            return
        if self.unavailable.get(spec.kind) == problem:
            self._log.debug("source.kind_unavailable", kind=spec.kind, verb=verb, reason=reason)
            return
        self.unavailable[spec.kind] = problem
        if spec.optional:
            # A cluster before 1.33 has no ServiceCIDRs: expected there, so not a warning.
            log = self._log.info if isinstance(exc, NotServed) else self._log.warning
            log(
                "source.kind_unavailable",
                kind=spec.kind,
                verb=verb,
                reason=reason,
                error=exc.reason,
                meanwhile=self._without(spec.kind),
            )
        else:
            self._log.error(
                "source.kind_unavailable",
                kind=spec.kind,
                verb=verb,
                reason=reason,
                error=exc.reason,
                meanwhile="not followed until it can be read (rules already programmed stay); "
                "/healthz reports not ready",
            )
        self._report()

    def _watching(self, spec: KindSpec) -> None:
        """The server accepted a watch of ``spec``."""
        self.link.answered()
        self._readable(spec, "watch")

    def _readable(self, spec: KindSpec, verb: str) -> None:
        """``verb`` on ``spec`` succeeded: a refusal of it (any, after a watch) is over."""
        self._was_read.add(spec.kind)
        since = self._refused_since.pop(spec.kind, None)
        if since is not None and spec.kind not in self.unavailable:
            refused_ms = round((trio.current_time() - since) * 1000, 1)
            self._log.info("source.kind_readable_again", kind=spec.kind, refused_ms=refused_ms)
        problem = self.unavailable.get(spec.kind)
        if problem is not None and verb in (problem.verb, "watch"):
            del self.unavailable[spec.kind]
            self._log.info("source.kind_available", kind=spec.kind)
            self._report()

    def _report(self) -> None:
        if self._on_unavailable is not None:
            self._on_unavailable(dict(self.unavailable))

    def _in_grace(self, spec: KindSpec, problem: Unavailable) -> bool:
        """Whether a refusal of ``spec`` is not reported yet: a required kind this source has
        read before, refused for less than ``refusal_grace`` (a restarting API server's
        authorizer; the rules and the state stay as they were meanwhile). A kind never read,
        or refused for longer, is reported at once; the kind's retries come at the end of the
        grace at the latest (``_retry_in``)."""
        if spec.optional or spec.kind not in self._was_read or spec.kind in self.unavailable:
            return False
        now = trio.current_time()
        first = spec.kind not in self._refused_since
        since = self._refused_since.setdefault(spec.kind, now)
        if now - since >= self._refusal_grace:
            return False
        if not first:
            return True
        self._log.info(
            "source.kind_refused",
            kind=spec.kind,
            verb=problem.verb,
            reason=problem.reason,
            error=problem.detail,
            reported_in=round(self._refusal_grace - (now - since), 3),
        )
        return True

    def _retry_in(self, spec: KindSpec, backoff: Backoff) -> float:
        """The next retry of a refused ``spec``: its backoff, but no later than just after its
        grace ends, so a refusal that lasts is reported on time."""
        delay = backoff.next()
        since = self._refused_since.get(spec.kind)
        if since is not None and spec.kind not in self.unavailable:
            left = self._refusal_grace - (trio.current_time() - since)
            delay = min(delay, max(left, 0.0) + 0.05)
        return delay

    def _without(self, kind: str) -> str:
        """What nlproxy does without ``kind`` (an optional one), for the log line."""
        if kind != "ServiceCIDR":
            return f"synced without {kind} objects"
        if self._service_cidrs:
            ranges = ",".join(map(str, self._service_cidrs))
            return f"unallocated ClusterIPs are dropped within --service-cidr {ranges} only"
        return "no drop rule for unallocated ClusterIPs (no ServiceCIDR objects, no --service-cidr)"

    async def _wait_retry(
        self, backoff: Backoff, spec: KindSpec, event: str, exc: KubeApiError
    ) -> None:
        delay = backoff.next()
        self._log.warning(event, kind=spec.kind, error=str(exc), retry_in=round(delay, 3))
        await trio.sleep(delay)

    async def _list(self, spec: KindSpec, *, initial: bool = False) -> Listing:
        """List ``spec`` in a worker thread; ``initial``: one of the lists before the first
        ``Replace``, whose pages go to ``on_page`` as they come."""
        started = trio.current_time()
        hook = self._on_page if initial else None
        on_page: PageHook | None = None
        if hook is not None:

            def on_page(changes: Sequence[Upsert | Skip | Invalid]) -> None:
                trio.from_thread.run_sync(hook, changes)  # on the event loop, one at a time

        # A list builds an object per Service, slice and endpoint (10k x 10: 150k), none of
        # them garbage; a collection of the young generation that the growth triggers walks
        # them all (a relist took up to 2.5 times as long at 10k x 10). Paused while any list
        # runs, if it ran before (the daemon pauses it itself for its cold start).
        with hotpath.collection_paused():
            listing = await trio.to_thread.run_sync(
                partial(list_kind, self._http, spec, self.page_size, on_page=on_page),
                abandon_on_cancel=True,
            )
        self.link.answered()
        self._readable(spec, "list")
        invalid = sum(1 for c in listing.changes if isinstance(c, Invalid))
        self._log.info(
            "source.listed",
            kind=spec.kind,
            objects=len(listing.changes),
            invalid=invalid,
            pages=listing.pages,
            resource_version=listing.resource_version,
            duration_ms=round((trio.current_time() - started) * 1000, 1),
        )
        return listing

    async def _watch(self, stream: WatchStream) -> None:
        """Run one watch request in a worker thread (its changes go straight to the channel)."""
        try:
            await trio.to_thread.run_sync(stream.run, abandon_on_cancel=True)
        finally:
            stream.abort()  # after a cancellation: unblock the abandoned thread's read
        self._log.debug(
            "source.watch_ended",
            kind=stream.spec.kind,
            resource_version=stream.resource_version,
            events=stream.events,
        )
