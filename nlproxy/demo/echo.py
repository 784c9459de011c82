"""Echo servers that run in pod namespaces, and the clients that talk to them.

Part of the test bed (``testbed.py`` starts one server per pod); used by ``nlproxy demo`` and the
datapath tests to see where a packet really went. Every server answers each TCP connection and
each UDP datagram with one JSON line: the pod's name and the source address and port it saw.
Servers run in forked children (no exec), which die with the process that forked them. Clients
open their sockets inside a namespace and use them from the calling thread.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import json
import multiprocessing
import multiprocessing.connection
import selectors
import signal
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address, ip_address
from types import TracebackType

from nlproxy.demo.ns import TestbedError, move_here
from nlproxy.netlink import netns

PR_SET_PDEATHSIG = 1
IP_RECVERR = 11
IPV6_RECVERR = 25
_READY = "ready"


def _seen(addr: str, port: int, pod: str) -> bytes:
    """The reply line: the pod's name and the source it saw (v4-mapped shown as plain IPv4)."""
    ip = ip_address(addr.split("%", 1)[0])
    if isinstance(ip, IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return json.dumps({"pod": pod, "src": str(ip), "sport": port}).encode() + b"\n"


def _serve_tcp_conn(conn: socket.socket, pod: str) -> None:
    with conn:
        conn.settimeout(5.0)
        peer = conn.getpeername()
        try:
            conn.recv(4096)
            conn.sendall(_seen(peer[0], peer[1], pod))
        except OSError:
            return  # the client went away; nothing to answer


def _listeners(ports: Sequence[int]) -> list[socket.socket]:
    """Dual-stack TCP and UDP sockets on every port (``::`` also takes IPv4, v4-mapped)."""
    socks = []
    for port in ports:
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            s = socket.socket(socket.AF_INET6, kind)
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("::", port))
            if kind == socket.SOCK_STREAM:
                s.listen(128)
            socks.append(s)
    return socks


def _server_main(
    ns: str, pod: str, ports: Sequence[int], ready: multiprocessing.connection.Connection
) -> None:
    """Child process: bind in ``ns``, report readiness, answer until killed."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        move_here(ns)  # the server lives in the pod: `ip netns pids` lists it there
        socks = _listeners(ports)
    except TestbedError as exc:
        ready.send(str(exc))
        return
    except OSError as exc:
        ready.send(f"bind: {exc.strerror}")
        return
    ready.send(_READY)
    ready.close()
    sel = selectors.DefaultSelector()
    for i, s in enumerate(socks):
        sel.register(s, selectors.EVENT_READ, i)
    while True:
        for key, _ in sel.select():
            s = socks[key.data]
            if s.type == socket.SOCK_STREAM:
                conn, _addr = s.accept()
                threading.Thread(target=_serve_tcp_conn, args=(conn, pod), daemon=True).start()
            else:
                _data, addr = s.recvfrom(4096)
                s.sendto(_seen(addr[0], addr[1], pod), addr)


class EchoServer:
    """A forked echo server for pod ``pod`` in namespace ``ns``, on TCP and UDP ``ports``."""

    def __init__(self, ns: str, pod: str, ports: Sequence[int]) -> None:
        self.ns = ns
        self.pod = pod
        self.ports = tuple(ports)
        self._proc: multiprocessing.process.BaseProcess | None = None

    def start(self, timeout: float = 10.0) -> None:
        """Fork the server and wait until it listens.

        Raises:
            TestbedError: the server could not bind, or did not report in time.
        """
        ctx = multiprocessing.get_context("fork")
        parent_end, child_end = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_server_main,
            args=(self.ns, self.pod, self.ports, child_end),
            name=f"echo-{self.pod}",
            daemon=True,
        )
        proc.start()
        self._proc = proc
        child_end.close()
        with parent_end:
            status = parent_end.recv() if parent_end.poll(timeout) else "no answer"
        if status != _READY:
            self.stop()
            raise TestbedError(f"echo server of pod {self.pod}", f"did not start: {status}")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and reap it; only this server is touched."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.is_alive():
            proc.terminate()
            proc.join(3.0)
        if proc.is_alive():
            proc.kill()
            proc.join(3.0)
        proc.close()


class Result(enum.StrEnum):
    """How a request ended."""

    ANSWERED = "answered"
    TIMEOUT = "timeout"  # dropped somewhere: no answer, no error
    REFUSED = "refused"  # TCP RST or ICMP port unreachable (nft `reject`)
    UNREACHABLE = "unreachable"  # ICMP host/net unreachable or administratively prohibited


@dataclass(frozen=True, slots=True)
class Outcome:
    """The outcome of one request: which pod answered and the source it saw, or why none did."""

    result: Result
    pod: str = ""
    src: IPv4Address | IPv6Address | None = None
    sport: int = 0
    detail: str = ""

    def __str__(self) -> str:
        if self.result is Result.ANSWERED:
            return f"{self.pod} (saw {self.src}:{self.sport})"
        return f"{self.result.value}" + (f": {self.detail}" if self.detail else "")


_UNREACHABLE = {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EACCES, errno.EPERM}


def _failure(exc: OSError) -> Outcome:
    if isinstance(exc, TimeoutError):
        return Outcome(Result.TIMEOUT, detail="no answer")
    if exc.errno == errno.ECONNREFUSED:
        return Outcome(Result.REFUSED, detail=exc.strerror or "")
    if exc.errno in _UNREACHABLE:
        return Outcome(Result.UNREACHABLE, detail=exc.strerror or "")
    raise exc


def _parse(line: bytes, what: str) -> Outcome:
    try:
        msg = json.loads(line)
        return Outcome(
            Result.ANSWERED, pod=str(msg["pod"]), src=ip_address(msg["src"]), sport=msg["sport"]
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise TestbedError(what, f"unexpected answer {line!r}") from exc


def _socket(ns: str, addr: str, kind: socket.SocketKind, src: str | None) -> socket.socket:
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with netns.entered(ns):
        s = socket.socket(family, kind)
    if kind == socket.SOCK_DGRAM:
        # Report every ICMP error on the socket, not only "hard" ones (port unreachable).
        if family == socket.AF_INET:
            s.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
        else:
            s.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVERR, 1)
    if src is not None:
        s.bind((src, 0))
    return s


def tcp_request(
    ns: str, addr: str, port: int, *, src: str | None = None, timeout: float = 2.0
) -> Outcome:
    """Connect from namespace ``ns`` to ``addr:port``, send a line, return who answered.

    Args:
        src: bind to this local address first (to pick one of the client's addresses).
        timeout: seconds for the connect and for the answer.
    """
    what = f"tcp {addr} port {port} from netns {ns}"
    with _socket(ns, addr, socket.SOCK_STREAM, src) as s:
        s.settimeout(timeout)
        try:
            s.connect((addr, port))
            s.sendall(b"hello\n")
            line = s.makefile("rb").readline()
        except OSError as exc:
            return _failure(exc)
    if not line:
        return Outcome(Result.REFUSED, detail="connection closed without an answer")
    return _parse(line, what)


class UdpSession:
    """One UDP socket (one source port) in namespace ``ns`` that asks ``addr:port`` repeatedly.

    Keeping the socket keeps the conntrack entry: every :meth:`ask` after the first follows the
    existing flow, which is what conntrack-cleanup tests need.
    """

    def __init__(
        self, ns: str, addr: str, port: int, *, src: str | None = None, timeout: float = 2.0
    ) -> None:
        self.what = f"udp {addr} port {port} from netns {ns}"
        self._sock = _socket(ns, addr, socket.SOCK_DGRAM, src)
        self._sock.settimeout(timeout)
        self._sock.connect((addr, port))

    @property
    def local(self) -> tuple[str, int]:
        """The socket's own address and port."""
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    def ask(self) -> Outcome:
        """Send one datagram and wait for the answer (or an ICMP error, or the timeout)."""
        try:
            self._sock.send(b"hello\n")
            data = self._sock.recv(4096)
        except OSError as exc:
            return _failure(exc)
        return _parse(data, self.what)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> UdpSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def udp_request(
    ns: str, addr: str, port: int, *, src: str | None = None, timeout: float = 2.0
) -> Outcome:
    """Send one UDP datagram from namespace ``ns`` (a fresh source port) and return who answered."""
    with UdpSession(ns, addr, port, src=src, timeout=timeout) as session:
        return session.ask()


def request(
    proto: str, ns: str, addr: str, port: int, *, src: str | None = None, timeout: float = 2.0
) -> Outcome:
    """:func:`tcp_request` or :func:`udp_request` by ``proto`` (``tcp``/``udp``, any case)."""
    if proto.lower() == "tcp":
        return tcp_request(ns, addr, port, src=src, timeout=timeout)
    if proto.lower() == "udp":
        return udp_request(ns, addr, port, src=src, timeout=timeout)
    raise TestbedError(f"request to {addr} port {port}", f"unknown protocol {proto!r}")
