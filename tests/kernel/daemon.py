"""The daemon as the kernel tests run it: a child ``nlproxy run`` programming a test bed's node,
its manifests, its HTTP endpoints, and the probes that check the services it programs."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from nlproxy.demo.echo import Result, tcp_request
from nlproxy.demo.testbed import Testbed
from nlproxy.netlink import netns
from tests.kernel import topo
from tests.kube.apiserver import ApiServer

VIP_A = "10.96.0.10"
VIP_B = "10.96.0.11"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def two_free_ports() -> tuple[int, int]:
    """Two different free ports: both held while the second is chosen (two calls of
    :func:`free_port` may get the same port back, and the daemon's second bind then fails)."""
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        return int(a.getsockname()[1]), int(b.getsockname()[1])


def free_node_port() -> int:
    """A free port in the NodePort range (30000-32767), as a health-check node port must be."""
    for port in random.sample(range(30000, 32768), 200):
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port in 30000-32767")


def http_get(ns: str, port: int, path: str, timeout: float = 2) -> tuple[int, str]:
    """GET ``http://127.0.0.1:port/path`` from inside namespace ``ns`` (the daemon serves its
    ports where the rules are)."""
    with netns.entered(ns):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        conn.connect()  # the socket is made here, in the namespace
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


class Daemon:
    """``nlproxy run`` as a child process, with its JSON log lines collected."""

    def __init__(
        self,
        tb: Testbed,
        manifests: Path | None,
        *extra: str,
        ports: tuple[int, int] | None = None,
    ) -> None:
        """``ports``: the healthz and metrics ports the ``--config`` file binds (no bind flags
        are given then); None: free ports, bound by flags."""
        source = ["--manifests", str(manifests)] if manifests is not None else []
        self.netns = tb.node.netns
        self.healthz, self.metrics = ports or two_free_ports()
        binds = [
            "--healthz-bind-address",
            f"127.0.0.1:{self.healthz}",
            "--metrics-bind-address",
            f"127.0.0.1:{self.metrics}",
        ]
        self.lines: list[dict[str, Any]] = []
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nlproxy",
                "--netns",
                tb.node.netns,
                "--log-format",
                "json",
                "run",
                *source,
                *tb.run_args(),
                "--min-sync-period",
                "50ms",
                *(binds if ports is None else ()),
                *extra,
            ],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with contextlib.suppress(json.JSONDecodeError):
                self.lines.append(json.loads(line))

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in list(self.lines) if e.get("event") == name]

    def get(self, port: int, path: str) -> tuple[int, str]:
        """GET ``path`` on the daemon's ``port``, in the node's namespace where it listens."""
        return http_get(self.netns, port, path)

    def wait_ready(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}: {self.lines[-5:]}")
            with contextlib.suppress(OSError):
                if self.get(self.healthz, "/healthz")[0] == 200:
                    return
            time.sleep(0.05)
        raise AssertionError(f"daemon not healthy after {timeout}s: {self.lines[-5:]}")

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, then the exit status (``subprocess.TimeoutExpired`` after ``timeout``)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self._reader.join(timeout=5)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._reader.join(timeout=5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


class ScriptedDaemon(Daemon):
    """``nlproxy run`` from ``manifests``, started by ``script``: Python that changes something
    of nlproxy's (a fault at a chosen moment), then calls ``cli.main`` on its arguments. ``env``
    adds to the environment."""

    def __init__(
        self, tb: Testbed, manifests: Path, script: str, env: dict[str, str] | None = None
    ) -> None:
        self.netns = tb.node.netns
        self.healthz, self.metrics = two_free_ports()
        self.lines = []
        self.proc = subprocess.Popen(
            [
                sys.executable, "-c", script,
                "--netns", tb.node.netns, "--log-format", "json",
                "run", "--manifests", str(manifests), *tb.run_args(),
                "--min-sync-period", "50ms",
                "--healthz-bind-address", f"127.0.0.1:{self.healthz}",
                "--metrics-bind-address", f"127.0.0.1:{self.metrics}",
            ],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
            cwd=Path(__file__).resolve().parents[2], env={**os.environ, **(env or {})},
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()


@contextlib.contextmanager
def daemon(tb: Testbed, manifests: Path | None, *extra: str) -> Iterator[Daemon]:
    d = Daemon(tb, manifests, *extra)
    try:
        d.wait_ready()
        yield d
    finally:
        d.kill()


def objects(tb: Testbed, a_pods: list[str]) -> list[dict[str, Any]]:
    """Service a (endpoints ``a_pods``) and service b (always pod-c), plus the Node."""
    ep = lambda name: topo.endpoint(str(tb.pod(name).ipv4), tb.node.name)  # noqa: E731
    return [
        tb.node_manifest(),
        topo.service("a", VIP_A),
        topo.endpoint_slice("a", [ep(p) for p in a_pods]),
        topo.service("b", VIP_B),
        topo.endpoint_slice("b", [ep("pod-c")]),
    ]


def publish(directory: Path, objs: list[dict[str, Any]]) -> Path:
    """Replace the manifests atomically (one multi-document file, renamed into place), as a
    ConfigMap volume or a careful operator does: the daemon never sees a half-written set."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / ".objects.yaml.tmp"
    tmp.write_text(yaml.safe_dump_all(objs, sort_keys=False))
    os.replace(tmp, directory / "objects.yaml")
    return directory


LOADED_MACHINE_BOUND = 90.0
"""The least any wait gives a condition before failing: the test machines are shared, and at
load 10 what takes 1 s alone can take many. Tests never assert how long something took."""


def wait_until(check: Any, timeout: float, what: str) -> float:
    """Poll ``check()`` until true; return the seconds it took.

    ``timeout`` is how long it takes on a quiet machine at most; the wait goes on until
    ``LOADED_MACHINE_BOUND`` if that is longer, so only a condition that never comes fails."""
    bound = max(timeout, LOADED_MACHINE_BOUND)
    start = time.monotonic()
    while time.monotonic() - start < bound:
        if check():
            return time.monotonic() - start
        time.sleep(0.02)
    raise AssertionError(f"{what}: not within {bound:.0f} s")


def answered_by(tb: Testbed, vip: str, n: int = 12) -> set[str]:
    pods = set()
    for _ in range(n):
        out = tcp_request(tb.pod("pod-a").netns, vip, 80)
        if out.result is Result.ANSWERED:
            pods.add(out.pod)
    return pods


def nft(tb: Testbed, *args: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", tb.node.netns, "nft", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


class Probe:
    """A background loop of fresh TCP connections to one service; counts failures."""

    def __init__(self, tb: Testbed, vip: str) -> None:
        self.tb, self.vip = tb, vip
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            out = tcp_request(self.tb.pod("pod-b").netns, self.vip, 80, timeout=1.0)
            if out.result is Result.ANSWERED:
                self.ok += 1
            else:
                self.failures.append(str(out))

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def put_service(api: ApiServer, tb: Testbed, name: str, vip: str, pods: list[str]) -> None:
    """Service ``name`` at ``vip`` with ``pods`` as its endpoints, written into the API server."""
    eps = [topo.endpoint(str(tb.pod(p).ipv4), tb.pod(p).node) for p in pods]
    svc: dict[str, Any] = topo.service(name, vip)
    api.store.put("services", svc)
    api.store.put("endpointslices", topo.endpoint_slice(name, eps))


def lb_local(tb: Testbed, hc_port: int, pods: list[str]) -> list[dict[str, Any]]:
    """LoadBalancer ``lb`` with externalTrafficPolicy Local and a health-check node port."""
    ep = lambda name: topo.endpoint(  # noqa: E731
        str(tb.pod(name).ipv4), tb.pod(name).node
    )
    svc = topo.service(
        "lb",
        "10.96.0.20",
        ({"name": "tcp", "port": 80, "targetPort": 8080, "nodePort": 30080},),
        type="LoadBalancer",
        externalTrafficPolicy="Local",
        healthCheckNodePort=hc_port,
        status={"loadBalancer": {"ingress": [{"ip": "203.0.113.20"}]}},
    )
    return [svc, topo.endpoint_slice("lb", [ep(p) for p in pods])]


def write_manifests(path: Path, objs: list[dict[str, Any]]) -> None:
    """``objs`` as one YAML file at ``path``, replaced at once (never seen half written)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(yaml.safe_dump_all(objs, sort_keys=False))
    tmp.replace(path)


def local_endpoints(body: str) -> int:
    """``localEndpoints`` of a health-check node port's answer."""
    count: int = json.loads(body)["localEndpoints"]
    return count


def hc_get(proc: Daemon, port: int) -> tuple[int, str]:
    try:
        return proc.get(port, "/")
    except OSError:
        return 0, ""


def exposed_name(family: Metric) -> str:
    """The family's name as a query uses it (the parser drops a counter's ``_total``)."""
    return f"{family.name}_total" if family.type == "counter" else family.name


def scrape(proc: Daemon) -> dict[str, Metric]:
    """The daemon's /metrics, by exposed family name, after one /healthz and one /livez (so
    their counters have a series, as any probed kube-proxy's do)."""
    assert proc.get(proc.healthz, "/healthz")[0] == 200
    assert proc.get(proc.healthz, "/livez")[0] == 200
    status, body = proc.get(proc.metrics, "/metrics")
    assert status == 200
    return {exposed_name(f): f for f in text_string_to_metric_families(body)}


def running_daemon_families(tb: Testbed, tmp_path: Path) -> tuple[dict[str, Metric], str]:
    """Start a daemon on one service, let it sync, scrape it; (families, raw text)."""
    d = publish(tmp_path / "m", objects(tb, ["pod-a"]))
    with daemon(tb, d) as proc:
        got = scrape(proc)
        return got, proc.get(proc.metrics, "/metrics")[1]
