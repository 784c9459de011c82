"""The small HTTP server: status lines, bodies, HEAD, 405."""

import functools

import trio

from nlproxy.serve.budget import MAX_PER_CLIENT, DescriptorBudget
from nlproxy.serve.http import Response, serve


async def fetch(port: int, request: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


async def handler(path: str) -> Response:
    if path == "/healthz":
        return Response(200, b'{"ok": true}')
    if path == "/broken":
        raise RuntimeError("dictionary changed size during iteration")
    return Response(404, b"not found\n", content_type="text/plain")


async def test_serves_get_head_and_rejects_other_methods() -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve, "127.0.0.1:0", handler)
            got = await fetch(port, b"GET /healthz?x=1 HTTP/1.1\r\nHost: x\r\n\r\n")
            assert got.startswith(b"HTTP/1.1 200 OK\r\n")
            assert got.endswith(b'\r\n\r\n{"ok": true}')
            head = await fetch(port, b"HEAD /healthz HTTP/1.1\r\n\r\n")
            assert b"Content-Length: 12" in head
            assert head.endswith(b"\r\n\r\n")
            assert (await fetch(port, b"GET /nope HTTP/1.1\r\n\r\n")).startswith(
                b"HTTP/1.1 404 Not Found"
            )
            assert (await fetch(port, b"POST /healthz HTTP/1.1\r\n\r\n")).startswith(
                b"HTTP/1.1 405"
            )
            nursery.cancel_scope.cancel()


async def test_a_failing_handler_answers_500_and_the_server_goes_on() -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve, "127.0.0.1:0", handler)
            got = await fetch(port, b"GET /broken HTTP/1.1\r\n\r\n")
            assert got.startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
            again = await fetch(port, b"GET /healthz HTTP/1.1\r\n\r\n")
            assert again.startswith(b"HTTP/1.1 200 OK\r\n")
            nursery.cancel_scope.cancel()


async def test_many_loopback_addresses_cannot_starve_a_probe() -> None:
    """A local user may bind any of 127.0.0.0/8: 300 idle connections from 300 of them hold no
    more than one client's share, and a probe (itself from loopback) is answered at once."""
    budget = DescriptorBudget(limit=96)  # 32 connections
    held: list[trio.socket.SocketType] = []
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(
                functools.partial(serve, budget=budget), "127.0.0.1:0", handler
            )
            try:
                for i in range(300):
                    s = trio.socket.socket()
                    await s.bind((f"127.0.{1 + i // 250}.{2 + i % 250}", 0))
                    await s.connect(("127.0.0.1", port))
                    held.append(s)
                for _ in range(10):
                    got = await fetch(port, b"GET /healthz HTTP/1.1\r\n\r\n")
                    assert got.startswith(b"HTTP/1.1 200 OK\r\n")
                assert budget.held <= MAX_PER_CLIENT
                # The evicted were closed by the server: all but the cap's worth read EOF.
                closed = 0
                for s in held:
                    with trio.move_on_after(0.01):  # an open idle one has nothing to read
                        closed += await s.recv(1) == b""
                assert closed >= len(held) - MAX_PER_CLIENT
            finally:
                for s in held:
                    s.close()
            nursery.cancel_scope.cancel()
