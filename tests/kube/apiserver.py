"""A small Kubernetes API server for testing the kube source over real HTTP.

Speaks the list/watch protocol of the resources nlproxy reads (Services, EndpointSlices, Nodes,
ServiceCIDRs): chunked lists (``limit``/``continue``) served from a consistent snapshot, label and
field selectors, watches streaming JSON lines over chunked transfer encoding, BOOKMARK events,
``410 Gone`` for compacted resource versions, server-side ``timeoutSeconds``, ``/readyz``. Tests
drive it as a cluster would change and fail: add/modify/delete objects (one global, increasing
resourceVersion), replay a burst of updates, compact history, send bookmarks, drop connections,
refuse a verb on a kind with the real server's 403, serve a kind or not (404), stop and restart
on the same port (``/readyz`` 500 for a while after a start, like a server filling its caches;
403 to everything for a while, like its authorizer before its RBAC caches are filled), and
speak HTTPS at another address (``tls``, with ``tests/kube/tls.py``).
With ``tests/kube/realistic.py`` it holds objects with the bodies a real server sends (10k
Services and 10k EndpointSlices for the benchmarks).

It is a test double of the API server, not of the client: the ``kubernetes`` package talks to it
over TCP on 127.0.0.1 exactly as it would to a real cluster.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.kube.selectors import Query, Selector

Obj = dict[str, Any]


@dataclass(frozen=True)
class Resource:
    plural: str
    path: str
    kind: str
    api_version: str


RESOURCES = {
    r.path: r
    for r in (
        Resource("services", "/api/v1/services", "Service", "v1"),
        Resource(
            "endpointslices",
            "/apis/discovery.k8s.io/v1/endpointslices",
            "EndpointSlice",
            "discovery.k8s.io/v1",
        ),
        Resource("nodes", "/api/v1/nodes", "Node", "v1"),
        Resource(
            "servicecidrs",
            "/apis/networking.k8s.io/v1/servicecidrs",
            "ServiceCIDR",
            "networking.k8s.io/v1",
        ),
    )
}
BY_PLURAL = {r.plural: r for r in RESOURCES.values()}


def status(code: int, reason: str, message: str) -> Obj:
    """A metav1.Status object, as the API server returns for errors."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj["metadata"]
    return (meta.get("namespace", ""), meta["name"])


@dataclass
class Event:
    rv: int
    plural: str
    type: str
    obj: Obj
    old: Obj | None


@dataclass
class Store:
    """Objects and their change history; one Condition guards all and wakes watchers."""

    cond: threading.Condition = field(
        default_factory=lambda: threading.Condition(threading.RLock())
    )
    rv: int = 1000
    compacted: int = 0
    objects: dict[str, dict[tuple[str, str], Obj]] = field(
        default_factory=lambda: {p: {} for p in BY_PLURAL}
    )
    history: list[Event] = field(default_factory=list)
    snapshots: dict[str, tuple[int, list[Obj]]] = field(default_factory=dict)
    bookmark_gen: int = 0
    expire_gen: int = 0
    end_status: Obj = field(default_factory=dict)
    encoded: dict[int, tuple[Obj, bytes]] = field(default_factory=dict)
    """A stored object's JSON as a list item, by its id (with the object, so an id reused by
    a later object never matches): kube-apiserver keeps each object's serialization with it
    in its watch cache too, so a list is assembled, not encoded object by object."""

    def item_json(self, obj: Obj) -> bytes:
        """``obj`` as an item of a list: without ``kind`` and ``apiVersion``, as the API
        server writes the items of a typed list. Stored objects are never changed in place
        (``put`` stores a copy), so the encoding is made once per version of an object."""
        cached = self.encoded.get(id(obj))
        if cached is not None and cached[0] is obj:
            return cached[1]
        bare = {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
        data = json.dumps(bare).encode()
        self.encoded[id(obj)] = (obj, data)
        return data

    def _forget(self, obj: Obj | None) -> None:
        if obj is not None:
            self.encoded.pop(id(obj), None)

    def put(self, plural: str, obj: Mapping[str, Any]) -> Obj:
        """Add or replace an object; returns the stored copy with its new resourceVersion."""
        res = BY_PLURAL[plural]
        with self.cond:
            new = copy.deepcopy(dict(obj))
            new["kind"], new["apiVersion"] = res.kind, res.api_version
            old = self.objects[plural].get(_key(new))
            self._forget(old)
            self.rv += 1
            meta = new.setdefault("metadata", {})
            meta["resourceVersion"] = str(self.rv)
            meta.setdefault("uid", f"uid-{plural}-{meta['name']}-{self.rv}")
            self.objects[plural][_key(new)] = new
            kind = "MODIFIED" if old is not None else "ADDED"
            self.history.append(Event(self.rv, plural, kind, new, old))
            self.cond.notify_all()
            return new

    def put_many(self, plural: str, objs: Iterable[Mapping[str, Any]]) -> int:
        """Add or replace many objects at once, as one burst of events (watchers are woken
        once); returns the resourceVersion of the last."""
        with self.cond:
            for obj in objs:
                self.put(plural, obj)
            return self.rv

    def delete(self, plural: str, namespace: str, name: str) -> None:
        with self.cond:
            old = self.objects[plural].pop((namespace, name))
            self._forget(old)
            self.rv += 1
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = str(self.rv)
            self.history.append(Event(self.rv, plural, "DELETED", gone, old))
            self.cond.notify_all()

    def compact(self) -> None:
        """Forget all history: watches and continue tokens from older versions get 410 Gone."""
        with self.cond:
            self.compacted = self.rv
            self.history.clear()
            self.snapshots.clear()
            # Encodings made for pages of older versions (a continue token's snapshot) are of
            # objects no longer stored: nothing serves them now.
            live = {id(o) for objs in self.objects.values() for o in objs.values()}
            self.encoded = {k: v for k, v in self.encoded.items() if k in live}
            self.cond.notify_all()

    def events_after(self, rv: int) -> list[Event]:
        lo, hi = 0, len(self.history)
        while lo < hi:  # history is sorted by rv
            mid = (lo + hi) // 2
            if self.history[mid].rv <= rv:
                lo = mid + 1
            else:
                hi = mid
        return self.history[lo:]


def watch_event(ev: Event, query: Query) -> Obj | None:
    """The event a watcher with ``query`` sees, or None: objects moving out of a selector are
    reported DELETED and moving in ADDED, as the API server does."""
    now, was = query.matches(ev.obj), query.matches(ev.old)
    if ev.type == "DELETED":
        return {"type": "DELETED", "object": ev.obj} if was else None
    if now and was:
        return {"type": "MODIFIED", "object": ev.obj}
    if now:
        return {"type": "ADDED", "object": ev.obj}
    if was:
        return {"type": "DELETED", "object": ev.obj}
    return None


class ApiServer:
    """The server: ``start()``/``stop()`` (same port across restarts) and test controls.

    Attributes:
        store: the objects; tests may hold ``store.cond`` to make several changes atomically.
        requests: ``(path, query)`` of every request, for assertions.
        token: bearer token every request must carry, or None.
        disabled: paths answering 404 (an older cluster without ServiceCIDRs).
        forbidden: plural -> verbs (``list``, ``watch``) answered 403, as kube-apiserver's RBAC
            authorizer answers a role without them (see ``forbid``).
        unready_for: seconds after each ``start()`` during which ``/readyz`` answers 500.
        forbidden_for: seconds after each ``start()`` during which every list and watch is
            answered 403, as kube-apiserver's authorizer answers identities without
            cluster-admin rights until its RBAC caches are filled (about 0.4-1.5 s).
        refused: how many requests were answered 403.
        bookmark_interval: seconds between periodic bookmarks on watches that allow them.
        after_page: called with the plural after each list page is sent (changes mid-list).
        gone_as_http: answer a watch from a compacted version with HTTP 410 instead of an
            ERROR event (both happen in practice).
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        host: str = "127.0.0.1",
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.store = Store()
        self.host = host
        self.tls = tls
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.token = token
        self.disabled: set[str] = set()
        self.forbidden: dict[str, set[str]] = {}
        self.unready_for = 0.0
        self.forbidden_for = 0.0
        self.refused = 0
        self.started_at = 0.0
        self.user = "system:serviceaccount:kube-system:nlproxy"
        self.bookmark_interval = 60.0
        self.gone_as_http = False
        self.after_page: Callable[[str], None] | None = None
        self.port = 0
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self._drop_gen = 0
        self.bookmarks_sent = 0
        self.active_watches = 0

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def forbid(self, plural: str, *verbs: str) -> None:
        """Refuse ``verbs`` (default: list and watch) on ``plural`` from now on."""
        self.forbidden.setdefault(plural, set()).update(verbs or ("list", "watch"))

    def allow(self, plural: str) -> None:
        """Grant every verb on ``plural`` again (a role fixed while nlproxy runs)."""
        self.forbidden.pop(plural, None)

    def ready(self) -> bool:
        return time.monotonic() - self.started_at >= self.unready_for

    def start(self) -> None:
        self.started_at = time.monotonic()
        handler = type("Handler", (_Handler,), {"api": self})
        self._httpd = ThreadingHTTPServer((self.host, self.port), handler)
        self._httpd.daemon_threads = True
        if self.tls is not None:  # the handshake is made in the connection's thread
            self._httpd.socket = self.tls.wrap_socket(
                self._httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop listening and cut every connection (an outage); state is kept for ``start()``."""
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        assert self._thread is not None
        self._thread.join()
        self._httpd = None
        self.drop_connections()

    def drop_connections(self) -> None:
        """Reset every open connection abruptly, mid-stream (no terminating chunk)."""
        with self.store.cond:
            self._drop_gen += 1
            self.store.cond.notify_all()
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def send_bookmarks(self) -> None:
        """Send a BOOKMARK at the current resourceVersion on every watch that allows them."""
        with self.store.cond:
            self.store.bookmark_gen += 1
            self.store.cond.notify_all()

    def expire_watches(self) -> None:
        """Compact history and end every open watch with an ERROR event carrying 410 Gone."""
        with self.store.cond:
            self.store.compact()
            self.end_watches(410, "Expired", "too old resource version")

    def end_watches(self, code: int, reason: str, message: str) -> None:
        """End every open watch with an ERROR event carrying this Status."""
        with self.store.cond:
            self.store.end_status = status(code, reason, message)
            self.store.expire_gen += 1
            self.store.cond.notify_all()

    def open_connections(self) -> int:
        with self._conns_lock:
            return len(self._conns)

    def watch_count(self, plural: str) -> int:
        """How many watch requests were made for ``plural`` so far."""
        path = BY_PLURAL[plural].path
        return sum(1 for p, q in self.requests if p == path and q.get("watch") in ("1", "true"))

    # Hooks for the handler.

    def track(self, conn: socket.socket, add: bool) -> None:
        with self._conns_lock:
            (self._conns.add if add else self._conns.discard)(conn)

    def dropped_since(self, gen: int) -> bool:
        return self._drop_gen != gen or self._httpd is None

    def drop_gen(self) -> int:
        return self._drop_gen


def _continue_token(snap: str, offset: int, rv: int) -> str:
    raw = json.dumps({"snap": snap, "offset": offset, "rv": rv}).encode()
    return base64.urlsafe_b64encode(raw).decode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    api: ApiServer

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()  # OSError (a failed handshake) ends this connection
        super().setup()
        self.api.track(self.connection, True)

    def finish(self) -> None:
        self.api.track(self.connection, False)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except OSError:
            self.close_connection = True

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        self.api.requests.append((url.path, query))
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        # The scheme is case-insensitive (RFC 9110); the in-cluster loader sends "bearer".
        if self.api.token and (scheme.lower() != "bearer" or token != self.api.token):
            self._json(401, status(401, "Unauthorized", "Unauthorized"))
            return
        if url.path in ("/readyz", "/livez", "/healthz"):
            self._health(url.path)
            return
        res = RESOURCES.get(url.path)
        if res is None or url.path in self.api.disabled:
            self._json(404, status(404, "NotFound", "the server could not find the resource"))
            return
        verb = "watch" if query.get("watch") in ("1", "true") else "list"
        warming = time.monotonic() - self.api.started_at < self.api.forbidden_for
        if warming or verb in self.api.forbidden.get(res.plural, ()):
            self.api.refused += 1
            self._json(403, self._forbidden(res, verb))
            return
        try:
            sel = Query(
                Selector(query.get("labelSelector", "")), Selector(query.get("fieldSelector", ""))
            )
        except ValueError as exc:
            self._json(400, status(400, "BadRequest", str(exc)))
            return
        if query.get("watch") in ("1", "true"):
            with self.api.store.cond:
                self.api.active_watches += 1
            try:
                self._watch(res, sel, query)
            finally:
                with self.api.store.cond:
                    self.api.active_watches -= 1
        else:
            self._list(res, sel, query)

    def _health(self, path: str) -> None:
        ok = path != "/readyz" or self.api.ready()
        text = b"ok" if ok else b"[-]informer-sync failed: not finished\nreadyz check failed"
        self.send_response(200 if ok else 500)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def _forbidden(self, res: Resource, verb: str) -> Obj:
        """kube-apiserver's answer when RBAC denies ``verb`` on ``res`` cluster-wide."""
        group = res.api_version.rpartition("/")[0]
        qualified = f"{res.plural}.{group}" if group else res.plural
        message = (
            f'{qualified} is forbidden: User "{self.api.user}" cannot {verb} resource '
            f'"{res.plural}" in API group "{group}" at the cluster scope'
        )
        body = status(403, "Forbidden", message)
        body["details"] = {"group": group, "kind": res.plural}
        return body

    def _json(self, code: int, body: Obj) -> None:
        self._send(code, json.dumps(body).encode())

    def _send(self, code: int, data: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _gone(self, message: str) -> Obj:
        return status(410, "Expired", message)

    def _list(self, res: Resource, sel: Query, query: dict[str, str]) -> None:
        store = self.api.store
        limit = int(query.get("limit") or 0)
        with store.cond:
            if query.get("continue"):
                tok = json.loads(base64.urlsafe_b64decode(query["continue"]))
                snap = store.snapshots.get(tok["snap"])
                if snap is None or tok["rv"] < store.compacted:
                    self._json(410, self._gone("The provided continue parameter is too old"))
                    return
                rv, items, offset = snap[0], snap[1], tok["offset"]
            else:
                asked = query.get("resourceVersion")
                exact = query.get("resourceVersionMatch") == "Exact"
                if exact and asked and int(asked) < store.compacted:
                    self._json(410, self._gone(f"too old resource version: {asked}"))
                    return
                rv, offset = store.rv, 0
                objs = sorted(store.objects[res.plural].items())
                items = [o for _, o in objs if sel.matches(o)]
        page = items[offset : offset + limit] if limit else items[offset:]
        meta: Obj = {"resourceVersion": str(rv)}
        if limit and offset + limit < len(items):
            snap_id = f"{res.plural}-{rv}-{id(items)}"
            with store.cond:
                store.snapshots[snap_id] = (rv, items)
            meta["continue"] = _continue_token(snap_id, offset + limit, rv)
            if not (query.get("labelSelector") or query.get("fieldSelector")):
                meta["remainingItemCount"] = len(items) - offset - limit  # unknown otherwise
        head = {"kind": f"{res.kind}List", "apiVersion": res.api_version, "metadata": meta}
        # json.dumps of the whole body would give the same bytes; a page is assembled from
        # each object's encoding made once (``Store.item_json``).
        listed = b", ".join(store.item_json(o) for o in page)
        self._send(200, b'%s, "items": [%s]}' % (json.dumps(head).encode()[:-1], listed))
        if self.api.after_page is not None:
            self.api.after_page(res.plural)

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _events(self, events: list[Obj]) -> None:
        if events:
            self._chunk(b"".join(json.dumps(e).encode() + b"\n" for e in events))

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if readable and isinstance(self.connection, ssl.SSLSocket):
                return True  # no peeking through TLS: a watching client sends nothing but a close
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _watch(self, res: Resource, sel: Query, query: dict[str, str]) -> None:
        store, api = self.api.store, self.api
        timeout = float(query.get("timeoutSeconds") or 1800)
        bookmarks = query.get("allowWatchBookmarks") in ("1", "true")
        asked = query.get("resourceVersion") or "0"
        with store.cond:
            drop_gen, bm_gen, exp_gen = api.drop_gen(), store.bookmark_gen, store.expire_gen
            gone = asked != "0" and int(asked) < store.compacted
            initial: list[Obj] = []
            if asked == "0":  # "any": synthetic ADDED for the current state, then changes
                objs = sorted(store.objects[res.plural].items())
                initial = [{"type": "ADDED", "object": o} for _, o in objs if sel.matches(o)]
            pos = store.rv if asked == "0" else int(asked)
        if gone and api.gone_as_http:
            self._json(410, self._gone(f"too old resource version: {asked}"))
            return
        self._start_stream()
        if gone:
            error = self._gone(f"too old resource version: {asked} ({store.compacted})")
            self._events([{"type": "ERROR", "object": error}])
        else:
            self._events(initial)
            if not self._stream(res, sel, pos, timeout, bookmarks, (drop_gen, bm_gen, exp_gen)):
                return  # dropped: no terminating chunk
        self.wfile.write(b"0\r\n\r\n")

    def _stream(
        self,
        res: Resource,
        sel: Query,
        pos: int,
        timeout: float,
        bookmarks: bool,
        gens: tuple[int, int, int],
    ) -> bool:
        """Send events after ``pos`` until the timeout; False if the connection was dropped."""
        store, api = self.api.store, self.api
        drop_gen, bm_gen, exp_gen = gens
        deadline = time.monotonic() + timeout
        next_bookmark = time.monotonic() + (api.bookmark_interval if bookmarks else timeout + 1)
        while True:
            with store.cond:
                wake = min(deadline, next_bookmark)
                while not (
                    self._client_gone()
                    or api.dropped_since(drop_gen)
                    or store.expire_gen != exp_gen
                    or store.bookmark_gen != bm_gen
                    or (store.history and store.history[-1].rv > pos)
                    or pos < store.compacted
                    or time.monotonic() >= wake
                ):
                    # Poll the socket too: like the real server, notice a client hanging up.
                    store.cond.wait(min(0.1, max(0.0, wake - time.monotonic())))
                if self._client_gone() or api.dropped_since(drop_gen):
                    self.close_connection = True
                    return False
                if store.expire_gen != exp_gen:
                    self._events([{"type": "ERROR", "object": store.end_status}])
                    return True
                if pos < store.compacted:
                    error = self._gone(f"too old resource version: {pos} ({store.compacted})")
                    self._events([{"type": "ERROR", "object": error}])
                    return True
                seen = (watch_event(ev, sel) for ev in store.events_after(pos))
                events = [e for e in seen if e is not None and e["object"]["kind"] == res.kind]
                pos = max(pos, store.history[-1].rv if store.history else pos)
                bookmark_now = bookmarks and (
                    store.bookmark_gen != bm_gen or time.monotonic() >= next_bookmark
                )
                bm_gen = store.bookmark_gen
                if bookmark_now:
                    pos = store.rv
                    next_bookmark = time.monotonic() + api.bookmark_interval
                    mark = {"kind": res.kind, "apiVersion": res.api_version}
                    mark["metadata"] = {"resourceVersion": str(pos)}
                    events.append({"type": "BOOKMARK", "object": mark})
            self._events(events)
            if bookmark_now:
                with store.cond:
                    api.bookmarks_sent += 1
            if time.monotonic() >= deadline:
                return True
