"""Echo server for one VM test pod: answers every TCP connection and UDP datagram on PORT with one
JSON line naming the pod and the source address and port it saw.

Runs inside the pod's network namespace (vm-echo@POD.service, `ip netns exec POD`) with the VM's
system python3, standard library only. It only answers; it must not start connections.

    python3 echo.py POD PORT
"""

from __future__ import annotations

import json
import socket
import socketserver
import sys
import threading


def reply(pod: str, addr: tuple[str, int]) -> bytes:
    return json.dumps({"pod": pod, "src": addr[0], "sport": addr[1]}).encode() + b"\n"


def main(pod: str, port: int) -> None:
    class Tcp(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.settimeout(5.0)
            try:
                self.request.recv(4096)
                self.request.sendall(reply(pod, self.client_address))
            except OSError:
                return  # the client went away

    class Udp(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            sock: socket.socket = self.request[1]
            sock.sendto(reply(pod, self.client_address), self.client_address)

    socketserver.ThreadingTCPServer.allow_reuse_address = True
    socketserver.ThreadingTCPServer.daemon_threads = True
    tcp = socketserver.ThreadingTCPServer(("0.0.0.0", port), Tcp)
    udp = socketserver.UDPServer(("0.0.0.0", port), Udp)
    threading.Thread(target=udp.serve_forever, daemon=True).start()
    print(f"echo {pod} on {port}/tcp+udp", flush=True)
    tcp.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
