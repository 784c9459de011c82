"""A minimal HTTP/1.1 server on trio for ``/healthz``, ``/livez``, ``/metrics`` and health-check
node ports. One request per connection, GET/HEAD only, bounded request size and read time.

Listens in the network namespace the rules are in (``--netns``): a load balancer probes the
node's address, and ``nlproxy status`` dials where the daemon programs.

Knows nothing of what it serves: a handler maps a path to (status, headers, body). A handler
that fails answers 500 and is logged; it never takes the server (and the daemon's nursery) down.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import socket
import sys
import termios
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from nlproxy.log import get_logger
from nlproxy.netlink import netns
from nlproxy.serve.budget import Connection, DescriptorBudget

MAX_REQUEST = 8192
READ_TIMEOUT = 5.0
"""Seconds a client has to send its request headers (a slow client is dropped after it)."""
WRITE_TIMEOUT = 5.0
"""Seconds a client has to take the answer."""
REASONS = {
    200: "OK",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = field(default=())
    content_type: str = "application/json"


Handler = Callable[[str], Awaitable[Response]]


def split_hostport(addr: str) -> tuple[str, int]:
    """``0.0.0.0:10256`` / ``[::]:10256`` / ``:10256`` → (host, port)."""
    host, _, port = addr.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


async def _read_request(stream: trio.SocketStream) -> bytes:
    """The request's head (or what came of it within :data:`READ_TIMEOUT`).

    Read with ``os.read`` once the socket is readable, not ``receive_some``, which yields after
    taking the bytes: between the bytes leaving the socket and the caller marking the
    connection busy no other task runs, so a connection whose request has come is never taken
    for an idle one (its bytes are either in its socket, which :func:`_unread` sees, or read).
    """
    sock = stream.socket
    data = b""
    with trio.move_on_after(READ_TIMEOUT):
        while b"\r\n\r\n" not in data and len(data) < MAX_REQUEST:
            await trio.lowlevel.wait_readable(sock)
            try:
                chunk = os.read(sock.fileno(), 4096)
            except BlockingIOError:
                continue
            except OSError:  # reset by the client
                break
            if not chunk:
                break
            data += chunk
    return data


def _unread(sock: trio.socket.SocketType) -> bool:
    """Whether bytes wait in ``sock`` (its client has spoken and waits for an answer)."""
    try:
        buf = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except OSError:  # closed meanwhile
        return False
    return int.from_bytes(buf, sys.byteorder) > 0


async def _handle(stream: trio.SocketStream, handler: Handler, conn: Connection) -> None:
    async with stream:
        request = await _read_request(stream)
        line = request.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(line) < 2:
            return
        method, target = line[0], line[1]
        if method not in ("GET", "HEAD"):
            resp = Response(405, b"method not allowed\n", content_type="text/plain")
        else:
            conn.busy = True  # a request to answer: not evicted while its handler works
            try:
                resp = await _answer(handler, target.split("?", 1)[0])
            finally:
                conn.busy = False
        head = [f"HTTP/1.1 {resp.status} {REASONS.get(resp.status, 'OK')}"]
        head.append(f"Content-Type: {resp.content_type}")
        head.append(f"Content-Length: {len(resp.body)}")
        head += [f"{k}: {v}" for k, v in resp.headers]
        head.append("Connection: close")
        payload = ("\r\n".join(head) + "\r\n\r\n").encode()
        if method == "GET":
            payload += resp.body
        with contextlib.suppress(trio.BrokenResourceError), trio.move_on_after(WRITE_TIMEOUT):
            await stream.send_all(payload)  # a client that went away or reads too slowly


async def _answer(handler: Handler, path: str) -> Response:
    try:
        return await handler(path)
    except Exception:  # noqa: BLE001 - a bug behind one path must not stop health and metrics
        get_logger("http").exception("http.handler_failed", path=path)
        return Response(500, b"internal error\n", content_type="text/plain")


def _peer(stream: trio.SocketStream) -> str:
    try:
        return str(stream.socket.getpeername()[0])
    except OSError:
        return "?"


def listening_socket(addr: str, netns_name: str | None = None) -> socket.socket:
    """A TCP socket listening on ``addr`` in network namespace ``netns_name``.

    ``::`` takes IPv4 too (as kube-proxy's listeners do).

    Raises:
        OSError: the address cannot be bound (in use, not an address of the namespace).
        ConfigError: the namespace cannot be entered.
    """
    host, port = split_hostport(addr)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with netns.entered(netns_name):
        sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


async def serve(
    addr: str,
    handler: Handler,
    *,
    netns_name: str | None = None,
    budget: DescriptorBudget | None = None,
    listener_taken: bool = False,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``handler`` on ``addr`` (in ``netns_name``) until cancelled;
    ``task_status.started(port)`` once bound.

    Args:
        budget: the descriptors of every HTTP server of the daemon (one of its own by default).
            The listener is counted in it as essential, unless ``listener_taken``: the caller
            has taken its place already (:meth:`DescriptorBudget.try_listener`).

    Raises:
        OSError: the address cannot be bound.

    Cancellation: stops accepting and closes open connections.
    """
    host, _ = split_hostport(addr)
    limits = budget if budget is not None else DescriptorBudget()
    sock = listening_socket(addr, netns_name)
    if not listener_taken:
        limits.open_listener()
    try:
        listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(sock))]
        bound = sock.getsockname()[1]
        get_logger("http").debug("http.listening", addr=f"{host}:{bound}")

        async def on_conn(stream: trio.SocketStream) -> None:
            conn = limits.take(_peer(stream), spoke=functools.partial(_unread, stream.socket))
            if conn is None:
                await trio.aclose_forcefully(stream)  # nothing can make room: it goes at once
                return
            try:
                with conn.scope:
                    await _handle(stream, handler, conn)
            finally:
                limits.give(conn)

        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, on_conn, listeners)
            task_status.started(bound)
    finally:
        sock.close()  # closed with its trio socket too; closing twice is harmless
        if not listener_taken:
            limits.close_listener()
