"""The Kubernetes API source: list + watch Services, EndpointSlices, this Node and ServiceCIDRs.

First stage of the flow (DESIGN §1): turns the API server's objects into change events for the
cluster state. Each kind is listed in pages (one ``Replace`` per kind), then watched from the
list's resourceVersion with bookmarks and a server-side timeout; ``410 Gone`` relists and sends a
new ``Replace`` so deletions missed while disconnected are applied; any other failure retries with
exponential backoff and jitter, resuming from the last resourceVersion.

It must not emit anything because the API is unreachable: a ``Replace`` only ever comes from a
complete, successful list, so an outage leaves the programmed rules alone. Blocking HTTP runs in
worker threads (``kube_http.py``); nothing here blocks the event loop.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from typing import Any, NoReturn

import kubernetes
import trio

from nlproxy.cluster.kube_http import (
    Gone,
    Http,
    KindSpec,
    KubeApiError,
    Listing,
    NotServed,
    WatchStream,
    deliver_to,
    list_kind,
)
from nlproxy.cluster.model import Change, Invalid, Replace
from nlproxy.errors import ConfigError
from nlproxy.log import get_logger

__all__ = ["Backoff", "KindSpec", "KubeApiError", "KubeSource", "api_client_from_config", "kinds"]

# kube-proxy's informer selectors: objects owned by another proxy and headless services' objects
# are filtered by the server, so they never cost us a byte.
NOT_OURS = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"
# A watch that ends normally this soon without delivering anything still backs off, so a server
# that closes every watch at once cannot make us spin.
_HEALTHY_WATCH_SECONDS = 5.0


def kinds(node_name: str) -> tuple[KindSpec, ...]:
    """What the source watches, with the server-side selectors that narrow each kind."""
    return (
        KindSpec("Service", "/api/v1/services", label_selector=NOT_OURS),
        KindSpec(
            "EndpointSlice",
            "/apis/discovery.k8s.io/v1/endpointslices",
            label_selector=f"kubernetes.io/service-name,{NOT_OURS}",
        ),
        KindSpec("Node", "/api/v1/nodes", field_selector=f"metadata.name={node_name}"),
        KindSpec("ServiceCIDR", "/apis/networking.k8s.io/v1/servicecidrs", optional=True),
    )


class Backoff:
    """Exponential backoff with jitter: each delay is drawn from [d/2, d], d doubling up to
    ``maximum``; ``reset()`` after a success."""

    def __init__(
        self, initial: float = 0.5, maximum: float = 30.0, *, rng: random.Random | None = None
    ) -> None:
        self.initial, self.maximum = initial, maximum
        self._rng = rng or random.Random()
        self._delay = initial

    def next(self) -> float:
        delay = self._delay
        self._delay = min(self.maximum, self._delay * 2)
        return self._rng.uniform(delay / 2, delay)

    def reset(self) -> None:
        self._delay = self.initial


def api_client_from_config(
    kubeconfig: str | None, *, context: str | None = None
) -> kubernetes.client.ApiClient:
    """An ``ApiClient`` from a kubeconfig file, or in-cluster when ``kubeconfig`` is None.

    Token files, exec plugins and their refresh come from the ``kubernetes`` package.

    Raises:
        ConfigError: the kubeconfig cannot be loaded, or none was given outside a pod.
    """
    cfg = kubernetes.client.Configuration()
    loaders: Any = kubernetes.config  # untyped package: its loaders are called through Any
    try:
        if kubeconfig is not None:
            loaders.load_kube_config(
                config_file=kubeconfig,
                context=context,
                client_configuration=cfg,
                persist_config=False,
            )
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            loaders.load_incluster_config(client_configuration=cfg)
        else:
            raise ConfigError("kubeconfig", "none given, and not running in a pod")
    except kubernetes.config.ConfigException as exc:
        raise ConfigError(f"kubeconfig {kubeconfig or '(in-cluster)'}", str(exc)) from exc
    except OSError as exc:
        raise ConfigError(f"kubeconfig {kubeconfig}", exc.strerror or str(exc)) from exc
    return kubernetes.client.ApiClient(configuration=cfg)


class KubeSource:
    """List + watch the API server and stream changes into a trio channel.

    Args:
        api_client: a ``kubernetes.client.ApiClient`` (see ``api_client_from_config``).
        node_name: this node; only its Node object is watched.
        page_size: objects per list page (``limit``).
        watch_timeout: server-side ``timeoutSeconds`` of every watch.
        backoff_initial, backoff_max: retry delays after errors, in seconds.
    """

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        *,
        node_name: str,
        page_size: int = 500,
        watch_timeout: int = 300,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
    ) -> None:
        self._http = Http(api_client)
        self.node_name = node_name
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self._backoff = (backoff_initial, backoff_max)
        self.kinds = kinds(node_name)
        self._log = get_logger("kube-source")

    async def run(
        self,
        send: trio.MemorySendChannel[Sequence[Change]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> NoReturn:
        """Send one batch with a ``Replace`` per kind, report started, then stream changes.

        Retries (with backoff) until the initial lists succeed; never returns.

        Raises:
            trio.BrokenResourceError: the receiving end of ``send`` was closed.

        Cancellation: stops promptly; requests in flight are aborted or abandoned to their
        threads, which end within the socket timeouts.
        """
        versions = await self._initial_lists(send)
        task_status.started()
        async with trio.open_nursery() as nursery:
            for spec in self.kinds:
                nursery.start_soon(self._follow, spec, versions[spec.kind], send)
        raise AssertionError("watch loops never return")

    async def _initial_lists(
        self, send: trio.MemorySendChannel[Sequence[Change]]
    ) -> dict[str, str | None]:
        """List every kind and send one batch of a ``Replace`` per kind; returns the lists'
        resourceVersions. Its own frame, so the lists (every object of the cluster) are not
        kept alive by this source once the cluster state holds them."""
        versions: dict[str, str | None] = {}
        replaces: dict[str, Replace] = {}
        async with trio.open_nursery() as nursery:
            for spec in self.kinds:
                nursery.start_soon(self._initial, spec, replaces, versions)
        await send.send([replaces[spec.kind] for spec in self.kinds])
        self._log.info(
            "source.synced", **{s.kind: len(replaces[s.kind].changes) for s in self.kinds}
        )
        return versions

    async def _initial(
        self, spec: KindSpec, replaces: dict[str, Replace], versions: dict[str, str | None]
    ) -> None:
        backoff = Backoff(*self._backoff)
        while True:
            try:
                listing = await self._list(spec)
            except KubeApiError as exc:
                if isinstance(exc, NotServed) and spec.optional:
                    self._log.info("source.kind_unavailable", kind=spec.kind)
                    replaces[spec.kind] = Replace(kind=spec.kind, changes=())
                    versions[spec.kind] = None
                    return
                await self._wait_retry(backoff, spec, "source.list_error", exc)
                continue
            replaces[spec.kind] = Replace(kind=spec.kind, changes=listing.changes)
            versions[spec.kind] = listing.resource_version
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
                stream = WatchStream(self._http, spec, rv, self.watch_timeout, deliver_to(send))
                try:
                    await self._watch(stream)
                finally:  # resume from the last event or bookmark, even after an error
                    rv, events = stream.resource_version, stream.events
            except Gone as exc:
                self._log.info("source.relist", kind=spec.kind, reason=str(exc))
                rv = None
                if relisted:  # Gone right after a fresh list: don't hammer a confused server
                    await trio.sleep(backoff.next())
            except NotServed as exc:
                if not spec.optional:
                    await self._wait_retry(backoff, spec, "source.watch_error", exc)
                    continue
                rv = None
                await trio.sleep(self.watch_timeout)  # probe again later: the kind may appear
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

    async def _wait_retry(
        self, backoff: Backoff, spec: KindSpec, event: str, exc: KubeApiError
    ) -> None:
        delay = backoff.next()
        self._log.warning(event, kind=spec.kind, error=str(exc), retry_in=round(delay, 3))
        await trio.sleep(delay)

    async def _list(self, spec: KindSpec) -> Listing:
        started = trio.current_time()
        listing = await trio.to_thread.run_sync(
            list_kind, self._http, spec, self.page_size, abandon_on_cancel=True
        )
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
