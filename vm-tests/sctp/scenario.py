"""SCTP Services through nlproxy with real SCTP associations, run as root inside a VM whose kernel
has SCTP (vm-tests/boot.sh; tests/packaging/test_sctp_vm.py drives it). Python 3 standard
library and iproute2 only.

``scenario.py`` (no arguments) builds a node in the VM's own network namespace:

    client 172.18.0.10 ── veth ── node1 172.18.0.2            pods (ptp, gateway 10.244.1.1):
    (default route via node1)      nlproxy run --manifests      pod-a 10.244.1.4  (endpoint)
                                                                pod-b 10.244.1.5  (endpoint)
                                                                pod-c 10.244.1.6  (a client pod)

Service default/diameter: NodePort, protocol SCTP, ClusterIP 10.96.0.30 port 3868, node port
30868, targetPort 8080, externalTrafficPolicy Cluster, endpoints pod-a and pod-b. Each pod
answers every association with one JSON line: its name and the peer address it accepted.

It prints one ``== result NAME JSON`` line per step (the test judges them) and the daemon's log
as ``nlproxy| LINE``:

- ``clusterip``, ``nodeport``, ``pod-clusterip``: ASSOCIATIONS associations each, from the
  client to the ClusterIP and to the node port, and from pod-c to the ClusterIP: who answered
  and which source it saw;
- ``held``: one open association per endpoint through the ClusterIP and one through the node
  port, with the conntrack flow of each (``nlproxy conntrack list``);
- ``removed``: pod-a is taken out of the EndpointSlice: whether its flows went (and pod-b's
  stayed), the daemon's ``conntrack.flushed`` events, and whether pod-b's held associations
  still answer;
- ``after-clusterip``, ``after-nodeport``: new associations after the removal.

``scenario.py serve NAME PORT`` is a pod's server; ``probe ADDR PORT N`` makes N associations
and prints what each saw; ``hold ADDR PORT`` keeps one open, answering a line on stdin with an
echo through it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

HERE = Path(__file__).resolve()
MANIFESTS = Path("/tmp/manifests")
DAEMON_LOG = Path("/tmp/nlproxy.log")
NODE_IP, CLIENT_IP, GATEWAY = "172.18.0.2", "172.18.0.10", "10.244.1.1"
PODS = {"pod-a": "10.244.1.4", "pod-b": "10.244.1.5", "pod-c": "10.244.1.6"}
ENDPOINTS = ("pod-a", "pod-b")
VIP, PORT, NODE_PORT, TARGET = "10.96.0.30", 3868, 30868, 8080
FRONTENDS = {"clusterip": (VIP, PORT), "nodeport": (NODE_IP, NODE_PORT)}
ASSOCIATIONS = 24
BOUND = 120.0  # seconds any wait inside the VM may take (software CPU, a loaded host)


def sctp_socket() -> socket.socket:
    return socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_SCTP)


def read_line(sock: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError(f"association closed after {data!r}")
        data += chunk
    return data.decode().strip()


# --- inside the pods and the client -------------------------------------------------------


def serve(name: str, port: int) -> None:
    """Answer each association with {"pod", "peer"}, then echo every line until it closes."""
    srv = sctp_socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(64)

    def talk(conn: socket.socket, peer: tuple[str, int]) -> None:
        with conn:
            conn.sendall((json.dumps({"pod": name, "peer": peer[0]}) + "\n").encode())
            while data := conn.recv(4096):
                conn.sendall(data)

    while True:
        conn, peer = srv.accept()
        threading.Thread(target=talk, args=(conn, peer), daemon=True).start()


def associate(addr: str, port: int) -> tuple[socket.socket, dict[str, Any]]:
    sock = sctp_socket()
    sock.settimeout(20)
    sock.connect((addr, port))
    answer: dict[str, Any] = json.loads(read_line(sock))
    answer["local_port"] = sock.getsockname()[1]
    return sock, answer


def probe(addr: str, port: int, count: int) -> None:
    """``count`` associations one after the other; one JSON list of what each saw."""
    seen: list[dict[str, Any]] = []
    for _ in range(count):
        try:
            sock, answer = associate(addr, port)
            sock.close()
            seen.append(answer)
        except OSError as exc:
            seen.append({"error": f"{type(exc).__name__}: {exc}"})
    print(json.dumps(seen), flush=True)


def hold(addr: str, port: int) -> None:
    """One association kept open: its greeting, then an echo for every line on stdin."""
    try:
        sock, answer = associate(addr, port)
    except OSError as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return
    print(json.dumps(answer), flush=True)
    sock.settimeout(30)
    for line in sys.stdin:
        try:
            sock.sendall(line.encode())
            print(json.dumps({"echo": read_line(sock)}), flush=True)
        except OSError as exc:
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)


# --- the node ------------------------------------------------------------------------------


def sh(*cmd: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def in_ns(ns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", ns, sys.executable, str(HERE), *args]


def result(name: str, value: Any) -> None:
    print(f"== result {name} {json.dumps(value, sort_keys=True)}", flush=True)


def wait_for(what: str, cond: Any) -> Any:
    deadline = time.monotonic() + BOUND
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {BOUND:.0f} s")
        time.sleep(0.5)


def ip(args: str) -> None:
    sh("ip", *args.split())


def network() -> None:
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
    ip("link set lo up")
    ip("netns add client")
    ip("link add veth-client type veth peer name eth0 netns client")
    ip(f"addr add {NODE_IP}/24 dev veth-client")
    ip("link set veth-client up")
    ip("-n client link set lo up")
    ip(f"-n client addr add {CLIENT_IP}/24 dev eth0")
    ip("-n client link set eth0 up")
    ip(f"-n client route add default via {NODE_IP}")
    # Pods as a ptp CNI plugin makes them: the pod's /32, the gateway on every node-side veth.
    for pod, addr in PODS.items():
        veth = f"veth-{pod}"
        ip(f"netns add {pod}")
        ip(f"link add {veth} type veth peer name eth0 netns {pod}")
        ip(f"addr add {GATEWAY}/32 dev {veth}")
        ip(f"link set {veth} up")
        ip(f"-n {pod} link set lo up")
        ip(f"-n {pod} addr add {addr}/32 dev eth0")
        ip(f"-n {pod} link set eth0 up")
        ip(f"-n {pod} route add {GATEWAY} dev eth0 scope link")
        ip(f"-n {pod} route add default via {GATEWAY} dev eth0")
        ip(f"route add {addr}/32 dev {veth} scope link")


def write(path: Path, doc: dict[str, Any]) -> None:
    """Replaced by rename, as a ConfigMap or an editor does."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.rename(path)


def endpoint_slice(pods: tuple[str, ...]) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "diameter-x1", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "diameter"}},
        "addressType": "IPv4",
        "ports": [{"name": "diameter", "protocol": "SCTP", "port": TARGET}],
        "endpoints": [
            {"addresses": [PODS[p]], "nodeName": "node1",
             "conditions": {"ready": True, "serving": True, "terminating": False},
             "targetRef": {"kind": "Pod", "namespace": "default", "name": p}}
            for p in pods
        ],
    }  # fmt: skip


def manifests() -> None:
    MANIFESTS.mkdir()
    write(MANIFESTS / "node.json", {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node1", "labels": {"kubernetes.io/hostname": "node1"}},
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]},
        "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]},
    })  # fmt: skip
    write(MANIFESTS / "service.json", {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "diameter", "namespace": "default"},
        "spec": {
            "type": "NodePort", "clusterIP": VIP, "clusterIPs": [VIP], "ipFamilies": ["IPv4"],
            "externalTrafficPolicy": "Cluster", "selector": {"app": "diameter"},
            "ports": [{"name": "diameter", "protocol": "SCTP", "port": PORT,
                       "targetPort": TARGET, "nodePort": NODE_PORT}],
        },
    })  # fmt: skip
    write(MANIFESTS / "endpointslice.json", endpoint_slice(ENDPOINTS))


def events(since: int = 0) -> list[dict[str, Any]]:
    """The daemon's JSON log events from byte ``since`` on."""
    out = []
    with DAEMON_LOG.open("rb") as f:
        f.seek(since)
        for line in f.read().decode(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
    return out


def flows(**filters: str) -> list[dict[str, Any]]:
    """``nlproxy conntrack list --proto sctp`` with ``filters`` (--dst, --endpoint, ...)."""
    args = [f"--{k}={v}" for k, v in filters.items()]
    listed = json.loads(sh("nlproxy", "conntrack", "list", "--proto", "sctp", *args, "--json"))
    found: list[dict[str, Any]] = listed["flows"]
    return found


def run_probe(ns: str, addr: str, port: int, count: int = ASSOCIATIONS) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = json.loads(sh(*in_ns(ns, "probe", addr, str(port), str(count))))
    return seen


def answers(pod: str) -> bool:
    """Whether ``pod`` answers an association to its own address from the client."""
    [seen] = run_probe("client", PODS[pod], TARGET, 1)
    return seen.get("pod") == pod


def associations(name: str, ns: str, addr: str, port: int) -> None:
    seen = run_probe(ns, addr, port)
    pods: dict[str, int] = {}
    for s in seen:
        if "pod" in s:
            pods[s["pod"]] = pods.get(s["pod"], 0) + 1
    result(name, {
        "to": f"{addr}:{port}", "from": ns, "count": len(seen), "pods": pods,
        "peers": sorted({s["peer"] for s in seen if "peer" in s}),
        "errors": [s["error"] for s in seen if "error" in s],
    })  # fmt: skip


class Held:
    """``hold`` in the client namespace: one association kept open through ``addr:port``."""

    def __init__(self, addr: str, port: int) -> None:
        self.addr, self.port = addr, port
        self.proc = subprocess.Popen(
            in_ns("client", "hold", addr, str(port)),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.greeting = self._line()

    def _line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        doc: dict[str, Any] = json.loads(line) if line else {"error": "hold ended"}
        return doc

    def echo(self, text: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        return self._line()

    def flows(self) -> list[dict[str, Any]]:
        """This association's conntrack flows."""
        return [
            f for f in flows(dst=self.addr, dport=str(self.port))
            if f["orig"]["sport"] == self.greeting["local_port"]
        ]  # fmt: skip

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def hold_one_per_endpoint(addr: str, port: int) -> dict[str, Held]:
    """An open association to each endpoint through ``addr:port`` (random balancing: as many
    tries as it takes, within 40)."""
    held: dict[str, Held] = {}
    for _ in range(40):
        h = Held(addr, port)
        answered = h.greeting.get("pod")
        if answered in held or answered is None:
            h.close()
        else:
            held[answered] = h
        if len(held) == len(ENDPOINTS) or answered is None:
            break
    return held


def remove_endpoint(held: dict[str, dict[str, Held]]) -> None:
    """Take the first endpoint out of the EndpointSlice; what became of the held associations'
    flows, and whether the other endpoint's associations still answer."""
    gone, kept = ENDPOINTS
    mark = DAEMON_LOG.stat().st_size
    write(MANIFESTS / "endpointslice.json", endpoint_slice((kept,)))
    try:
        wait_for(
            f"the flows to {gone} deleted",
            lambda: not any(by_pod[gone].flows() for by_pod in held.values()),
        )
        deleted = True
    except TimeoutError:
        deleted = False
    wait_for(
        "the daemon's sync after the change",
        lambda: [e for e in events(mark) if e.get("event") == "sync.applied"],
    )
    result("removed", {
        "gone": gone, "kept": kept, "gone_flows_deleted": deleted,
        "gone_flows_left": {
            name: flows(endpoint=PODS[gone], dst=FRONTENDS[name][0]) for name in held
        },
        "kept_flows": {name: by_pod[kept].flows() for name, by_pod in held.items()},
        "kept_echo": {name: by_pod[kept].echo("still there") for name, by_pod in held.items()},
        "events": [e for e in events(mark) if e.get("event") == "conntrack.flushed"],
    })  # fmt: skip


def start_daemon(log: BinaryIO) -> subprocess.Popen[bytes]:
    """``nlproxy run --manifests`` in the background, its first sync done (or its exit)."""
    daemon = subprocess.Popen(
        ["nlproxy", "--log-format", "json", "run", "--manifests", str(MANIFESTS),
         "--node-name", "node1", "--cluster-cidr", "10.244.0.0/16",
         "--service-cidr", "10.96.0.0/12"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip

    def first_sync() -> list[dict[str, Any]]:
        if daemon.poll() is not None:
            return [{"exited": daemon.returncode}]
        return [e for e in events() if e.get("event") == "sync.applied"]

    result("daemon", wait_for("the daemon's first sync", first_sync)[0])
    return daemon


def steps() -> None:
    associations("clusterip", "client", *FRONTENDS["clusterip"])
    associations("nodeport", "client", *FRONTENDS["nodeport"])
    associations("pod-clusterip", "pod-c", *FRONTENDS["clusterip"])
    # SCTP conntrack is nf_conntrack's own (built in, no module of its own): its sysctls appear
    # with nf_conntrack.
    established = Path("/proc/sys/net/netfilter/nf_conntrack_sctp_timeout_established")
    result("kernel", {
        "release": os.uname().release,
        "sctp_module": Path("/sys/module/sctp").is_dir(),
        "sctp_established_timeout": established.exists() and int(established.read_text()),
        "bound": BOUND,
    })  # fmt: skip

    held = {name: hold_one_per_endpoint(*frontend) for name, frontend in FRONTENDS.items()}
    result("held", {
        name: {pod: {"greeting": h.greeting, "flows": h.flows()} for pod, h in by_pod.items()}
        for name, by_pod in held.items()
    })  # fmt: skip
    try:
        if all(len(by_pod) == len(ENDPOINTS) for by_pod in held.values()):
            remove_endpoint(held)
    finally:
        for by_pod in held.values():
            for h in by_pod.values():
                h.close()
    associations("after-clusterip", "client", *FRONTENDS["clusterip"])
    associations("after-nodeport", "client", *FRONTENDS["nodeport"])


def scenario() -> None:
    Path("/proc/sys/kernel/printk").write_text("1\n")  # kernel messages off the console
    network()
    servers = [
        subprocess.Popen(in_ns(pod, "serve", pod, str(TARGET)), stdout=subprocess.DEVNULL)
        for pod in ENDPOINTS
    ]
    for pod in ENDPOINTS:  # the servers listen: a direct association answers
        wait_for(f"{pod} answering", lambda pod=pod: answers(pod))
    manifests()
    try:
        with DAEMON_LOG.open("wb") as log:
            daemon = start_daemon(log)
            try:
                if daemon.poll() is None:
                    steps()
            finally:
                daemon.terminate()
                try:
                    daemon.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                for s in servers:
                    s.kill()
    finally:
        for line in DAEMON_LOG.read_text(errors="replace").splitlines()[-60:]:
            print(f"nlproxy| {line}", flush=True)
    print("== scenario done", flush=True)


def main(argv: list[str]) -> None:
    if not argv:
        scenario()
    elif argv[0] == "serve":
        serve(argv[1], int(argv[2]))
    elif argv[0] == "probe":
        probe(argv[1], int(argv[2]), int(argv[3]))
    elif argv[0] == "hold":
        hold(argv[1], int(argv[2]))
    else:
        sys.exit(f"scenario.py: unknown command {argv[0]!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
