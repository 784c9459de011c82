"""Probe client for the VM tests: talks to services and prints one JSON line per attempt.

Installed on every VM; the host-side tests run it over SSH, on the client or inside a pod
(`ip netns exec POD python3 probe.py ...`). System python3, standard library only. It only sends
to the address it is given and reports what came back; it decides nothing.

    probe.py tcp HOST PORT [--count N]      N connections: {"ok", "pod", "src", "sport"|"error"}
    probe.py udp HOST PORT [--count N]      N datagrams, each from a new socket
    probe.py udp-session HOST PORT          one socket; one datagram per line read on stdin
    probe.py tcp-loop HOST PORT --stop FILE connect until FILE exists, then one summary line
    probe.py http URL                       {"status", "body"}
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from typing import Any

TIMEOUT = 3.0


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def answer(data: bytes) -> dict[str, Any]:
    try:
        reply: dict[str, Any] = json.loads(data.decode().strip())
    except ValueError:
        return {"ok": False, "error": f"unexpected reply {data!r}"}
    return {"ok": True, **reply}


def tcp_once(host: str, port: int) -> dict[str, Any]:
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT) as s:
            s.sendall(b"hello\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
    except OSError as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return answer(data)


def udp_ask(sock: socket.socket, host: str, port: int) -> dict[str, Any]:
    try:
        sock.sendto(b"hello\n", (host, port))
        data, _ = sock.recvfrom(4096)
    except OSError as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    out = answer(data)
    out["local_port"] = sock.getsockname()[1]
    return out


def udp_socket() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(TIMEOUT)
    s.bind(("0.0.0.0", 0))
    return s


def tcp_loop(host: str, port: int, stop: str) -> dict[str, Any]:
    sent, failed = 0, []
    while not os.path.exists(stop):
        result = tcp_once(host, port)
        sent += 1
        if not result["ok"]:
            failed.append(result["error"])
        time.sleep(0.02)
    return {"sent": sent, "ok": sent - len(failed), "failed": failed}


def http(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as resp:
            return {"status": resp.status, "body": resp.read().decode()}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "body": exc.read().decode()}
    except OSError as exc:
        return {"status": 0, "body": "", "error": f"{type(exc).__name__}: {exc}"}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="probe.py")
    parser.add_argument("mode", choices=["tcp", "udp", "udp-session", "tcp-loop", "http"])
    parser.add_argument("target")
    parser.add_argument("port", type=int, nargs="?", default=0)
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--stop", default="")
    args = parser.parse_args(argv)
    if args.mode == "tcp":
        for _ in range(args.count):
            emit(tcp_once(args.target, args.port))
    elif args.mode == "udp":
        for _ in range(args.count):
            with udp_socket() as s:
                emit(udp_ask(s, args.target, args.port))
    elif args.mode == "udp-session":
        with udp_socket() as s:
            for _ in sys.stdin:
                emit(udp_ask(s, args.target, args.port))
    elif args.mode == "tcp-loop":
        emit(tcp_loop(args.target, args.port, args.stop))
    else:
        emit(http(args.target))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
