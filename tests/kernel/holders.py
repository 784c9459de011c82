"""Idle connections held against a daemon's HTTP port, as an attacker (or a crowd of idle
clients) holds them: the shape the descriptor and connection budgets are tested with."""

from __future__ import annotations

import socket
import threading

from nlproxy.netlink import netns


class Holders:
    """One idle connection to ``dst`` from each of ``sources`` (an address listed twice holds
    two), opened again as soon as the server drops it (an attacker's loop), until the block
    ends."""

    def __init__(self, ns: str, sources: list[str], dst: tuple[str, int]) -> None:
        self.ns, self.dst = ns, dst
        self.slots: list[tuple[str, socket.socket | None]] = [(s, None) for s in sources]
        self.done = threading.Event()
        self.rounds = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Holders:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(timeout=30)
        for _, s in self.slots:
            if s is not None:
                s.close()

    def _connect(self, source: str) -> socket.socket | None:
        with netns.entered(self.ns):
            s = socket.socket()
        s.setblocking(False)
        try:
            s.bind((source, 0))
            s.connect_ex(self.dst)
        except OSError:
            s.close()
            return None
        return s

    def _run(self) -> None:
        while not self.done.is_set():
            for i, (source, s) in enumerate(self.slots):
                if s is not None:
                    try:
                        if s.recv(1) == b"":
                            raise ConnectionResetError
                    except BlockingIOError:
                        continue  # still held
                    except OSError:
                        pass
                    s.close()
                self.slots[i] = (source, self._connect(source))
            self.rounds += 1
            self.done.wait(0.05)
