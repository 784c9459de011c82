"""Blocking list and watch requests to the Kubernetes API, decoded straight from raw JSON.

Sits under ``kube.py`` (the trio source): it runs only in worker threads, uses the ``kubernetes``
package's configuration and REST client (``kube_client.Client``) for the URL, authentication
(token refresh, exec plugins), TLS and HTTP,
and decodes every page and event straight from its bytes (``typed.change``: typed structs, the
parser for what they do not plainly fit) — neither the client's generated models nor a dict per
object are built.
It must not touch the trio event loop except through ``trio.from_thread.run`` in ``WatchStream``,
and must not decide anything about retries or relists: it reports what happened and ``kube.py``
decides.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
import trio
import urllib3

from nlproxy.cluster import typed
from nlproxy.cluster.kube_client import ApiException, Client
from nlproxy.cluster.model import Change, Delete, Invalid, Skip, Upsert
from nlproxy.cluster.ratelimit import TokenBucket
from nlproxy.cluster.sections import object_ref
from nlproxy.cluster.structs import LENIENT
from nlproxy.errors import NlproxyError
from nlproxy.log import get_logger

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

CONNECT_TIMEOUT = 10.0
LIST_READ_TIMEOUT = 60.0
# A watch may stay silent until its server-side timeout; the socket read timeout only has to
# catch a connection that died without a FIN (a node or load balancer vanishing).
WATCH_READ_GRACE = 30.0
# The readiness probe while the API server is unreachable: short, as it is repeated.
PROBE_TIMEOUT = 2.0
_READ_SIZE = 1 << 16


@dataclass(frozen=True, slots=True)
class KindSpec:
    """One watched kind: its collection path and the selectors that narrow it server-side."""

    kind: str
    path: str
    label_selector: str = ""
    field_selector: str = ""
    optional: bool = False
    proxy_name: str | None = None
    """The ``service-proxy-name`` whose objects are read (``sections.not_ours``), matching what
    ``label_selector`` asks the server for."""

    def params(self) -> list[tuple[str, str]]:
        params = []
        if self.label_selector:
            params.append(("labelSelector", self.label_selector))
        if self.field_selector:
            params.append(("fieldSelector", self.field_selector))
        return params


class KubeApiError(NlproxyError):
    """A request to the API server failed: unreachable, refused, or answered with an error.

    Attributes:
        status: the HTTP status, or 0 when no answer was received.
    """

    def __init__(self, ref: str, reason: str, *, status: int = 0) -> None:
        self.status = status
        super().__init__(ref, reason)


class Gone(KubeApiError):
    """410 Gone: the resourceVersion (or continue token) is older than the server's history."""


class NotServed(KubeApiError):
    """404 on a collection: this cluster does not serve the kind (ServiceCIDR before 1.33)."""


class Forbidden(KubeApiError):
    """401 or 403: this identity may not ``verb`` the kind (a role without it, a bad token).

    Attributes:
        verb: the refused verb, ``list`` or ``watch``.
    """

    def __init__(self, ref: str, reason: str, *, status: int, verb: str) -> None:
        self.verb = verb
        super().__init__(ref, reason, status=status)


class Unreachable(KubeApiError):
    """No answer: the connection was refused, reset or timed out, or a stream broke off."""


class Aborted(Exception):
    """The trio side gave up on this request (cancellation); the thread just ends."""


def _status_error(spec: KindSpec, status: int, body: bytes, verb: str) -> KubeApiError:
    try:
        message = str(json.loads(body).get("message", ""))
    except (ValueError, AttributeError):
        message = body[:200].decode(errors="replace")
    reason = f"HTTP {status}: {message}" if message else f"HTTP {status}"
    ref = f"{spec.kind} {spec.path}"
    if status == 410:
        return Gone(ref, reason, status=status)
    if status == 404:
        return NotServed(ref, reason, status=status)
    if status in (401, 403):
        return Forbidden(ref, reason, status=status, verb=verb)
    return KubeApiError(ref, reason, status=status)


RequestHook = Callable[[str, str, int | None, float], None]
"""Told of every request to the API server: method, ``host:port``, the answer's status (None:
no answer) and the seconds until it came (client-go's ``rest_client_*`` metrics)."""


def _log() -> FilteringBoundLogger:
    return get_logger("source")


def _ignore(_method: str, _host: str, _status: int | None, _seconds: float) -> None:
    return None


class Http:
    """GET requests through the client's REST client, returning the raw urllib3 response.

    Args:
        api_client: the configured client (URL, TLS, credentials: ``kube_client.Client``).
        on_request: told of every request (its status and duration), for the metrics.
        limit: every request (list page, watch, probe) first takes a token from it
            (``--kube-api-qps``/``--kube-api-burst``); None: no limit.
    """

    def __init__(
        self,
        api_client: Client,
        on_request: RequestHook | None = None,
        limit: TokenBucket | None = None,
    ) -> None:
        self.api = api_client
        self._on_request = on_request or _ignore
        self._limit = limit
        self.host = urllib.parse.urlsplit(str(api_client.configuration.host)).netloc
        self._said: str | None = None  # the token's renewal failure last said
        self._said_lock = threading.Lock()

    def get(
        self, spec: KindSpec, params: Sequence[tuple[str, str]], read_timeout: float
    ) -> urllib3.BaseHTTPResponse:
        """Open ``GET spec.path?params``; a non-200 answer raises (``Gone``, ``NotServed``, ...).

        Raises:
            Unreachable: no answer.
            KubeApiError: an error status (``Gone``, ``NotServed``, ``Forbidden``, ...), or
                the request could not be sent (a token no header can carry).
        """
        headers = self._headers("application/json")
        if self._limit is not None:
            self._limit.take()
        start = time.monotonic()
        try:
            resp = self.api.rest_client.request(
                "GET",
                self.api.url(spec.path, params),
                headers=headers,
                _request_timeout=(CONNECT_TIMEOUT, read_timeout),
            )
        except (urllib3.exceptions.HTTPError, OSError, ApiException) as exc:
            status = exc.status if isinstance(exc, ApiException) and exc.status else None
            self._on_request("GET", self.host, status, time.monotonic() - start)
            raise Unreachable(f"{spec.kind} {spec.path}", f"request failed: {exc}") from exc
        except ValueError:  # its text holds the header's value: the token
            self._on_request("GET", self.host, None, time.monotonic() - start)
            raise self._header_error(f"{spec.kind} {spec.path}") from None
        raw: urllib3.BaseHTTPResponse = resp.response
        try:
            self._on_request("GET", self.host, int(raw.status), time.monotonic() - start)
        except BaseException:  # the hook's fault: the connection is not left open for it
            raw.close()
            raw.release_conn()
            raise
        if raw.status != 200:
            try:
                body = raw.read()
            except (urllib3.exceptions.HTTPError, OSError):
                body = b""
            raw.release_conn()
            verb = "watch" if ("watch", "1") in params else "list"
            raise _status_error(spec, raw.status, body, verb)
        return raw

    def _headers(self, accept: str) -> dict[str, str]:
        """The client's headers for a request. A token its refresh could not renew (an
        in-cluster token file empty or gone while the kubelet rotates it) is said once per
        reason, as a warning naming where it comes from, and the last one is sent meanwhile:
        the server decides, and a 401 is the source's refusal (``/healthz``)."""
        headers, error = self.api.renewed_headers(accept)
        with self._said_lock:  # said in the order the threads saw it
            said, self._said = self._said, error
            if error is not None and error != said:
                _log().warning(
                    "source.credentials_not_renewed",
                    error=error,
                    meanwhile="the last token is sent until it can be renewed",
                )
            elif error is None and said is not None:
                _log().info("source.credentials_renewed", credentials=self.api.credentials)
        return headers

    def _header_error(self, ref: str) -> KubeApiError:
        """What ``http.client`` refused before sending (``Invalid header value``): the one
        header that varies, the token, holds a line break or a character outside latin-1.
        Said without the token, and retried as an API error (a token file is read again)."""
        return KubeApiError(
            ref,
            f"request not sent: the Authorization header from {self.api.credentials} holds a "
            "line break or a character outside latin-1, which no HTTP header may carry",
        )

    def probe(self, path: str = "/readyz", timeout: float = PROBE_TIMEOUT) -> int:
        """``GET path`` with short timeouts and no retries; returns the HTTP status.

        Goes to the client's connection pool directly (the URL, TLS and token are the
        client's): a probe repeated while the server is down must cost one connection attempt
        and log nothing, where the client's own retries would make four and warn of three.

        Raises:
            Unreachable: no answer.
            KubeApiError: the request could not be sent (a token no header can carry).
        """
        headers = self._headers("*/*")  # any answer, a 401 too, says the server is up
        if self._limit is not None:
            self._limit.take()
        start = time.monotonic()
        try:
            raw = self.api.rest_client.pool_manager.request(
                "GET",
                self.api.url(path),
                headers=headers,
                timeout=urllib3.Timeout(connect=timeout, read=timeout),
                retries=False,
                preload_content=True,
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            self._on_request("GET", self.host, None, time.monotonic() - start)
            raise Unreachable(f"API server {path}", f"request failed: {exc}") from exc
        except ValueError:  # its text holds the header's value: the token
            self._on_request("GET", self.host, None, time.monotonic() - start)
            raise self._header_error(f"API server {path}") from None
        self._on_request("GET", self.host, int(raw.status), time.monotonic() - start)
        return int(raw.status)

    def read_page(self, spec: KindSpec, raw: urllib3.BaseHTTPResponse) -> bytes:
        """A list page's body (``page_changes`` decodes it).

        Raises:
            Unreachable: the body could not be read.
        """
        try:
            return raw.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Unreachable(f"{spec.kind} {spec.path}", f"reading failed: {exc}") from exc
        finally:
            raw.release_conn()


class _ListMeta(msgspec.Struct):
    resourceVersion: str = ""
    # ``continue`` is a keyword: renamed.
    continue_: str = msgspec.field(default="", name="continue")


class _Page(msgspec.Struct):
    """One list page: the objects are kept as raw JSON for ``typed.change``."""

    metadata: _ListMeta
    items: list[msgspec.Raw] | None = None


class _Head(msgspec.Struct):
    """A list page's metadata alone (its items skipped, not built)."""

    metadata: _ListMeta


_PAGE = msgspec.json.Decoder(_Page)
_HEAD = msgspec.json.Decoder(_Head)
_TYPED_PAGES: dict[str, msgspec.json.Decoder[Any]] = {
    kind: msgspec.json.Decoder(
        msgspec.defstruct(
            f"{kind}Page",
            [("metadata", _ListMeta), ("items", list[t] | None, None)],  # type: ignore[valid-type]
        )
    )
    for kind, t in LENIENT.types.items()
}
"""A page of Services or EndpointSlices decoded in one call, its items into the structs
``typed.from_json`` decodes each item into (``typed.from_struct`` reads them)."""


def page_items(data: bytes) -> list[msgspec.Raw]:
    """The objects of a list page's JSON, each still raw.

    Raises:
        msgspec.DecodeError: not JSON; ``msgspec.ValidationError``: not a list page.
    """
    return _PAGE.decode(data).items or []


def page_changes(
    data: bytes, kind: str, proxy_name: str | None = None
) -> tuple[_ListMeta, list[Upsert | Skip | Invalid]]:
    """A list page's metadata and the change of each of its objects: what ``typed.change`` of
    each raw item gives, but a page of Services or slices is first decoded in one call (not an
    item at a time); the parser reads, from its raw JSON, each object that is not plainly
    valid, and a page whose items do not all fit the structs goes item by item.

    Raises:
        msgspec.DecodeError: not JSON; ``msgspec.ValidationError``: not a list page.
    """
    whole = _TYPED_PAGES.get(kind)
    if whole is not None:
        try:
            page = whole.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError):
            pass  # read again item by item (each item's own outcome), or the error raised
        else:
            got = [typed.from_struct(obj, kind, proxy_name) for obj in page.items or ()]
            if any(c is None for c in got):
                raws = page_items(data)
                return page.metadata, [
                    typed.change(raws[i], kind, proxy_name) if c is None else c
                    for i, c in enumerate(got)
                ]
            return page.metadata, got  # type: ignore[return-value]  # (no None left)
    raw = _PAGE.decode(data)
    return raw.metadata, [typed.change(item, kind, proxy_name) for item in raw.items or ()]


@dataclass(frozen=True, slots=True)
class Listing:
    """A complete list of one kind: every object as a change, and the list's resourceVersion."""

    changes: tuple[Upsert | Skip | Invalid, ...]
    resource_version: str
    pages: int


PageHook = Callable[[Sequence[Upsert | Skip | Invalid]], object]
"""Told of each page's changes as soon as the page is decoded (``list_kind``'s ``on_page``)."""


def list_kind(
    http: Http,
    spec: KindSpec,
    page_size: int,
    *,
    ahead: bool = False,
    on_page: PageHook | None = None,
) -> Listing:
    """List every object of ``spec`` in pages of ``page_size`` (a consistent snapshot).

    Each page is decoded as it arrives, and handed to ``on_page`` (in this thread) before the
    next one is asked for: work on the objects can then be done while the list goes on. A
    list restarted from its first page hands its pages again; the ``Listing`` returned holds
    the complete list only. With ``ahead``, the next page is requested (in a second
    thread) as soon as a page's ``continue`` token is known, so the server prepares it while
    this page is decoded. Not the default: against the in-repo API server in another process
    on this 2-CPU machine it gained nothing (10k Services and slices: 1.02x and 1.00x the time
    at load 3.5, 1.07x and 1.16x at load 4.4; ``bench/bench_kube_pages.py``), the server and
    the decoding competing for the same CPUs; a real API server on other machines is unmeasured.
    An expired continue token (the list took longer than the server keeps history) restarts the
    list from the first page, as client-go's pager does.

    Raises:
        KubeApiError: the API server could not be reached or answered with an error.
    """
    while True:
        try:
            return _list_pages(http, spec, page_size, ahead=ahead, on_page=on_page)
        except Gone:
            continue


def _list_pages(
    http: Http, spec: KindSpec, page_size: int, *, ahead: bool, on_page: PageHook | None
) -> Listing:
    def fetch(cont: str) -> bytes:
        params = [*spec.params(), ("limit", str(page_size))]
        if cont:
            params.append(("continue", cont))
        try:
            return http.read_page(spec, http.get(spec, params, LIST_READ_TIMEOUT))
        except Gone:
            if not cont:  # a fresh list has no version to be too old: this is an error
                raise KubeApiError(f"{spec.kind} {spec.path}", "410 Gone on a fresh list") from None
            raise

    def decoded(data: bytes) -> tuple[_ListMeta, list[Upsert | Skip | Invalid]]:
        try:
            return page_changes(data, spec.kind, spec.proxy_name)
        except msgspec.ValidationError as exc:
            raise KubeApiError(f"{spec.kind} {spec.path}", f"malformed list: {exc}") from exc
        except msgspec.DecodeError as exc:
            raise KubeApiError(f"{spec.kind} {spec.path}", f"not JSON: {exc}") from exc

    changes: list[Upsert | Skip | Invalid] = []
    pages = 0
    # One worker: at most one request in flight beside the page being decoded. Leaving the
    # block waits for a request already sent (bounded by its read timeout).
    with contextlib.ExitStack() as stack:
        pool = (
            stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="nlproxy-list"))
            if ahead
            else None
        )
        data = fetch("")
        while True:
            pages += 1
            following = None
            if pool is not None:  # the next page asked for before this one is decoded
                try:
                    cont = _HEAD.decode(data).metadata.continue_
                except (msgspec.ValidationError, msgspec.DecodeError):
                    cont = ""  # the decode below says what is wrong
                following = pool.submit(fetch, cont) if cont else None
            meta, page = decoded(data)
            del data
            changes.extend(page)
            if on_page is not None and page:
                on_page(page)
            del page
            if not meta.continue_:
                return Listing(tuple(changes), meta.resourceVersion, pages)
            data = following.result() if following is not None else fetch(meta.continue_)


class WatchStream:
    """One watch request, read in a worker thread; changes go to ``deliver`` as they arrive.

    ``run()`` returns the last resourceVersion seen (objects and bookmarks) when the server ends
    the stream; ``abort()``, from any thread, makes a blocked ``run()`` end promptly;
    ``opened``, if given, is called (in the worker thread) once the server accepted the watch.
    """

    def __init__(
        self,
        http: Http,
        spec: KindSpec,
        resource_version: str,
        timeout: int,
        deliver: Callable[[Sequence[Change]], None],
        opened: Callable[[], None] | None = None,
    ) -> None:
        self.http, self.spec, self.timeout, self.deliver = http, spec, timeout, deliver
        self.opened = opened
        self.resource_version = resource_version
        self.events = 0
        self._lock = threading.Lock()
        self._raw: urllib3.BaseHTTPResponse | None = None
        self._aborted = False

    def abort(self) -> None:
        with self._lock:
            self._aborted, raw = True, self._raw
        if raw is not None:
            # ValueError/RuntimeError: already closed or released, so no reader is blocked on it.
            with contextlib.suppress(ValueError, RuntimeError, OSError):
                raw.shutdown()

    def run(self) -> str:
        """Stream until the server ends the watch.

        Raises:
            Gone: the server reported 410 (the version is too old); relist.
            Unreachable: the connection failed or broke off; resume from ``resource_version``.
            KubeApiError: an error status or a garbled stream; resume from ``resource_version``.
            Aborted: ``abort()`` was called.
        """
        params = [
            *self.spec.params(),
            ("watch", "1"),
            ("resourceVersion", self.resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(self.timeout)),
        ]
        raw = self.http.get(self.spec, params, self.timeout + WATCH_READ_GRACE)
        with self._lock:
            if self._aborted:
                raw.close()
                raise Aborted
            self._raw = raw
        try:
            if self.opened is not None:
                self.opened()
            self._read(raw)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if self._aborted:
                raise Aborted from exc
            ref = f"{self.spec.kind} {self.spec.path}"
            raise Unreachable(ref, f"watch broken: {exc}") from exc
        finally:
            with self._lock:
                self._raw = None
            raw.close()
            raw.release_conn()
        return self.resource_version

    def _read(self, raw: urllib3.BaseHTTPResponse) -> None:
        pending = b""
        for chunk in raw.stream(_READ_SIZE):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            self._decode(lines)
        self._decode([pending])

    def _decode(self, lines: Sequence[bytes]) -> None:
        """Turn complete event lines into changes and deliver them; ERROR events raise after
        the changes before them were delivered."""
        changes: list[Change] = []
        error: KubeApiError | None = None
        for line in lines:
            if not line.strip():
                continue
            try:
                change, error = self._event(_EVENT.decode(line))
            except (msgspec.DecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
                error = KubeApiError(f"{self.spec.kind} {self.spec.path}", f"bad event: {exc}")
                change = None
            if change is not None:
                changes.append(change)
            if error is not None:
                break
        if changes:
            self.events += len(changes)
            self.deliver(changes)
        if error is not None:
            raise error

    def _event(self, event: _Event) -> tuple[Change | None, KubeApiError | None]:
        kind, raw = event.type, event.object
        change: Change | None = None
        if kind == "ERROR":
            obj = msgspec.json.decode(raw)
            code = int(obj.get("code") or 0)
            message = str(obj.get("message", ""))
            body = json.dumps({"message": message}).encode()
            return None, _status_error(self.spec, code, body, "watch")
        if kind in ("ADDED", "MODIFIED"):
            change = typed.change(raw, self.spec.kind, self.spec.proxy_name)
        elif kind == "DELETED":
            change = Delete(ref=object_ref(msgspec.json.decode(raw), self.spec.kind))
        elif kind != "BOOKMARK":
            raise ValueError(f"unknown watch event type {kind!r}")
        rv = _VERSION.decode(raw).metadata.resourceVersion
        if rv:
            self.resource_version = rv
        return change, None


class _Event(msgspec.Struct):
    """One watch event; the object stays raw JSON for ``typed.change``."""

    type: str
    object: msgspec.Raw


class _Versioned(msgspec.Struct):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)


_EVENT = msgspec.json.Decoder(_Event)
_VERSION = msgspec.json.Decoder(_Versioned)


def deliver_to(
    send: trio.MemorySendChannel[Sequence[Change]],
) -> Callable[[Sequence[Change]], None]:
    """A ``deliver`` for ``WatchStream`` that sends into a trio channel from a worker thread
    (blocking while the channel is full, so a slow consumer slows the watch, not memory)."""

    def deliver(changes: Sequence[Change]) -> None:
        trio.from_thread.run(send.send, changes)

    return deliver
