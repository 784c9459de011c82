"""``nlproxy demo``: the whole proxy on a throwaway node, with real traffic, in under a minute.

Sits on top of everything: it builds a test bed (``testbed.py``: a node, one pod per endpoint of
the example EndpointSlice, an outside client), runs the real engine in the node's namespace
through the command line (``run --once``, ``rules``), sends requests through the ClusterIP and the
NodePort, and shows which pod answered and what source address it saw. Then it removes one
endpoint, re-runs, and shows the traffic move. It owns no proxy logic, and it must leave nothing
behind: every namespace goes, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import os
import re
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from nlproxy.demo.echo import Outcome, Result, request
from nlproxy.demo.ns import sweep_stale
from nlproxy.demo.testbed import Testbed
from nlproxy.errors import NlproxyError

DEFAULT_REQUESTS = 20
GIVE_UP_AFTER = 3  # consecutive failures on one path: the rest would fail the same way
TIMEOUT = 1.0
NAMESPACE_TAG = "demo"


class DemoError(NlproxyError):
    """The demo's manifests do not describe a topology it can build, or a step failed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoPort:
    name: str
    protocol: str  # "tcp" or "udp"
    port: int
    node_port: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoSpec:
    """What the demo needs from the example manifests."""

    service: str  # namespace/name
    cluster_ip: str
    ports: tuple[DemoPort, ...]
    endpoints: tuple[tuple[str, str], ...]  # (pod name, IP), in slice order
    pod_ports: tuple[int, ...]  # the EndpointSlice's ports: where the echo servers listen
    node_name: str
    slice_file: Path


@dataclass(frozen=True, slots=True, kw_only=True)
class Probe:
    """One way into the service: who sends (a namespace), to which address and port."""

    label: str
    netns: str
    addr: str
    port: int
    protocol: str
    sender: str = ""  # the sending pod's name, when a pod sends


EXAMPLES = Path("share") / "nlproxy" / "examples" / "demo"  # where the wheel installs them


def find_examples() -> Path:
    """The demo's manifests: ``examples/demo`` of a source checkout, else the installed copy.

    A wheel carries them as data files under ``share/nlproxy/examples/demo`` of the scheme it
    was installed with (a venv, ``--user``, ``--prefix``): its own file list says where. When
    neither is found, the path under ``sys.prefix`` is returned for the error message.
    """
    checkout = Path(__file__).resolve().parents[2] / "examples" / "demo"
    if checkout.is_dir():
        return checkout
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        for file in importlib.metadata.files("nlproxy") or ():
            if Path(file).parent.parts[-len(EXAMPLES.parts) :] == EXAMPLES.parts:
                return Path(str(file.locate())).resolve().parent
    return Path(sys.prefix) / EXAMPLES


def _documents(directory: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in sorted(directory.glob("*.yaml")):
        try:
            docs = list(yaml.safe_load_all(path.read_text()))
        except (OSError, yaml.YAMLError) as exc:
            raise DemoError(f"manifest {path}", str(exc)) from exc
        for doc in docs:
            if isinstance(doc, dict):
                yield path, doc


def read_spec(directory: Path) -> DemoSpec:
    """Read the Service, its EndpointSlice and the Node from ``directory``.

    Raises:
        DemoError: naming the file or object that is missing or unusable.
    """
    if not directory.is_dir():
        raise DemoError(f"manifests {directory}", "not a directory")
    found: dict[str, tuple[Path, dict[str, Any]]] = {}
    for path, doc in _documents(directory):
        found.setdefault(str(doc.get("kind")), (path, doc))
    missing = [k for k in ("Service", "EndpointSlice", "Node") if k not in found]
    if missing:
        raise DemoError(f"manifests {directory}", f"no {', '.join(missing)} object")
    try:
        return _spec(found)
    except (KeyError, TypeError, ValueError) as exc:
        raise DemoError(f"manifests {directory}", f"unexpected shape: {exc!r}") from exc


def _spec(found: dict[str, tuple[Path, dict[str, Any]]]) -> DemoSpec:
    _, svc = found["Service"]
    slice_path, eps = found["EndpointSlice"]
    _, node = found["Node"]
    meta = svc["metadata"]
    ports = tuple(
        DemoPort(
            name=str(p.get("name", "")),
            protocol=str(p.get("protocol", "TCP")).lower(),
            port=int(p["port"]),
            node_port=int(p["nodePort"]) if p.get("nodePort") else None,
        )
        for p in svc["spec"]["ports"]
    )
    endpoints = tuple(
        (str(ep["targetRef"]["name"]), str(ep["addresses"][0])) for ep in eps["endpoints"]
    )
    return DemoSpec(
        service=f"{meta.get('namespace', 'default')}/{meta['name']}",
        cluster_ip=str(svc["spec"]["clusterIP"]),
        ports=ports,
        endpoints=endpoints,
        pod_ports=tuple(sorted({int(p["port"]) for p in eps["ports"]})),
        node_name=str(node["metadata"]["name"]),
        slice_file=slice_path,
    )


def without_endpoint(spec: DemoSpec, src: Path, dst: Path, pod: str) -> None:
    """Copy the manifests in ``src`` to ``dst``, leaving ``pod``'s endpoint out of the slice."""
    shutil.copytree(src, dst, dirs_exist_ok=True)
    target = dst / spec.slice_file.name
    docs = list(yaml.safe_load_all(target.read_text()))
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "EndpointSlice":
            doc["endpoints"] = [
                ep for ep in doc["endpoints"] if ep.get("targetRef", {}).get("name") != pod
            ]
    target.write_text(yaml.safe_dump_all(docs, sort_keys=False))


Command = Callable[[Sequence[str]], int]
"""nlproxy's own command line (argv without the program name -> exit status), run in-process."""


class Demo:
    """One run of the demo; ``out`` gets the report, the engine's logs go to stderr."""

    def __init__(self, spec: DemoSpec, *, requests: int, out: TextIO, nlproxy: Command) -> None:
        self.spec = spec
        self.nlproxy = nlproxy
        self.requests = requests
        self.out = out
        self.problems: list[str] = []

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def section(self, title: str) -> None:
        self.say()
        self.say(f"== {title} ==")

    # -- steps -----------------------------------------------------------------------------

    def check_topology(self, tb: Testbed) -> None:
        if self.spec.node_name != tb.node.name:
            raise DemoError(
                "Node in the demo manifests",
                f"is called {self.spec.node_name}; the demo node is {tb.node.name}",
            )
        for name, ip in self.spec.endpoints:
            if str(tb.pod(name).ipv4) != ip:
                raise DemoError(
                    f"EndpointSlice in {self.spec.slice_file}",
                    f"pod {name} has {ip}, but the demo node gives it {tb.pod(name).ipv4}"
                    " (endpoints must be 10.244.1.4, .5, ... in order)",
                )

    def show_topology(self, tb: Testbed) -> None:
        self.section("1. A throwaway node in network namespaces")
        self.say(f"node   {tb.node.name:<8} netns {tb.node.netns}  InternalIP {tb.node.ipv4}")
        for pod in tb.local_pods:
            ports = ",".join(str(p) for p in tb.ports)
            self.say(f"pod    {pod.name:<8} netns {pod.netns}  {pod.ipv4} (echo server :{ports})")
        n2 = tb.node2
        self.say(f"node   {n2.name:<8} netns {n2.netns}  InternalIP {n2.ipv4} (no demo pods)")
        client = ", ".join(str(a) for a in tb.client.ipv4)
        self.say(f"client {'outside':<8} netns {tb.client.netns}  {client}")

    def apply(self, tb: Testbed, manifests: Path, title: str) -> None:
        self.section(title)
        argv = node_argv(tb, "run", "--manifests", str(manifests), "--once")
        self.say("$ nlproxy " + " ".join(argv))
        status = self.nlproxy(argv)
        if status == 3:
            self.say("applied; some objects were invalid and left out (see above)")
        elif status != 0:
            raise DemoError("nlproxy run --once", f"exited with status {status}")
        else:
            self.say("applied")

    def paths(self, tb: Testbed) -> list[Probe]:
        spec, first = self.spec, tb.local_pods[0]
        out = []
        for p in spec.ports:
            proto = p.protocol.upper()
            out.append(
                Probe(
                    label=f"ClusterIP {spec.cluster_ip}:{p.port}/{proto} from pod {first.name}",
                    netns=first.netns,
                    addr=spec.cluster_ip,
                    port=p.port,
                    protocol=p.protocol,
                    sender=first.name,
                )
            )
        tcp = [p for p in spec.ports if p.protocol == "tcp"]
        if tcp:
            out.append(
                Probe(
                    label=f"ClusterIP {spec.cluster_ip}:{tcp[0].port}/TCP from the node",
                    netns=tb.node.netns,
                    addr=spec.cluster_ip,
                    port=tcp[0].port,
                    protocol="tcp",
                )
            )
        for p in spec.ports:
            if p.node_port is not None:
                proto = p.protocol.upper()
                out.append(
                    Probe(
                        label=f"NodePort {tb.node.ipv4}:{p.node_port}/{proto} from the client",
                        netns=tb.client.netns,
                        addr=str(tb.node.ipv4),
                        port=p.node_port,
                        protocol=p.protocol,
                    )
                )
        return out

    def traffic(self, tb: Testbed, title: str) -> dict[str, Counter[str]]:
        """Send the requests on every path; print and return the answering pods per path."""
        self.section(f"{title}: {self.requests} requests per path")
        names = _names(tb)
        per_path: dict[str, Counter[str]] = {}
        for path in self.paths(tb):
            outcomes = self._send(path)
            per_path[path.label] = Counter(o.pod for o in outcomes if o.pod)
            self.say(path.label)
            pods = [p.name for p in tb.local_pods]
            for line in _summary(outcomes, pods, names, path.sender):
                self.say("    " + line)
            if len(outcomes) < self.requests:
                self.say(f"    (gave up after {GIVE_UP_AFTER} failures in a row)")
            failed = [o for o in outcomes if o.result is not Result.ANSWERED]
            if failed:
                self.problems.append(f"{path.label}: {failed[0]}")
        return per_path

    def _send(self, path: Probe) -> list[Outcome]:
        outcomes: list[Outcome] = []
        failures = 0
        for _ in range(self.requests):
            o = request(path.protocol, path.netns, path.addr, path.port, timeout=TIMEOUT)
            outcomes.append(o)
            failures = 0 if o.result is Result.ANSWERED else failures + 1
            if failures >= GIVE_UP_AFTER:
                break
        return outcomes

    def show_rules(self, tb: Testbed) -> None:
        self.section(f"4. What nlproxy programmed for {self.spec.service}")
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            status = self.nlproxy(node_argv(tb, "rules"))
        if status != 0:
            self.problems.append(f"nlproxy rules exited with status {status}")
        lines = buf.getvalue().splitlines()
        keys = [self.spec.service, self.spec.cluster_ip, *(ip for _, ip in self.spec.endpoints)]
        keys += [str(p.node_port) for p in self.spec.ports if p.node_port]
        shown = _relevant(lines, keys)
        for line in shown:
            self.say("  " + line.replace("\t", "  "))
        self.say(f"  ({len(shown)} of {len(lines)} lines; all of it: `nlproxy rules`)")


def node_argv(tb: Testbed, *args: str) -> list[str]:
    """``nlproxy`` arguments for a subcommand in the node's namespace, as the node's proxy."""
    common = ["--netns", tb.node.netns, "--log-level", "warning"]
    if args[0] != "run":
        return [*common, *args]
    return [
        *common,
        "run",
        *tb.run_args(),
        *args[1:],
    ]


def _names(tb: Testbed) -> dict[str, str]:
    """Who owns each address, to explain the source a pod saw."""
    names = {str(p.ipv4): f"pod {p.name}" for p in tb.pods.values()}
    names[str(tb.node.gateway_v4)] = f"{tb.node.name}, masqueraded"
    names[str(tb.node.ipv4)] = f"{tb.node.name}, masqueraded"
    for addr in tb.client.ipv4:
        names[str(addr)] = "the client, kept"
    return names


def _summary(
    outcomes: Sequence[Outcome], pods: Sequence[str], names: dict[str, str], sender: str
) -> list[str]:
    """Aligned lines: pod, count, the sources it saw; then failures by kind."""
    lines = []
    for pod in pods:
        got = [o for o in outcomes if o.pod == pod]
        seen = sorted({str(o.src) for o in got})
        where = ", ".join(f"{s} ({names.get(s, '?')})" for s in seen)
        if got and pod == sender:
            where += " - hairpin: the pod reached itself"
        lines.append(f"{pod:<10} {len(got):>4}  {'saw ' + where if got else ''}".rstrip())
    failures = Counter(o.result.value for o in outcomes if o.result is not Result.ANSWERED)
    lines += [f"{kind:<10} {n:>4}" for kind, n in sorted(failures.items())]
    return lines


def _blocks(lines: Sequence[str]) -> list[list[str]]:
    """The sets, maps and chains of the first table in ``nlproxy rules`` text, line by line."""
    blocks: list[list[str]] = []
    depth = 0
    for line in lines:
        if depth == 0 and blocks:
            break  # the first table only: the demo is IPv4
        if depth == 1:
            blocks.append([])
        if depth >= 1:
            blocks[-1].append(line)
        depth += line.count("{") - line.count("}")
    return [b for b in blocks if b and b[0].rstrip().endswith("{")]


def _relevant(lines: Sequence[str], keys: Sequence[str]) -> list[str]:
    """Where the service shows up: matching lines under their set/map header, then the chains
    those lines jump to, in full."""
    shown: list[str] = []
    targets: set[str] = set()
    blocks = _blocks(lines)
    for block in blocks:
        hits = [line for line in block[1:-1] if any(k in line for k in keys)]
        if hits:
            shown += [block[0], *hits, block[-1]]
            targets.update(re.findall(r"(?:goto|jump) ([\w-]+)", " ".join(hits)))
    for block in blocks:
        words = block[0].split()
        if words[0] == "chain" and words[1] in targets:
            shown += block
    return shown


def run_demo(*, manifests: Path, requests: int, nlproxy: Command, out: TextIO | None = None) -> int:
    """Run the demo on ``manifests`` (Service, EndpointSlice, Node); 0 when it all worked.

    ``nlproxy`` runs the steps' subcommands (the demo is itself one; it is handed the command
    line rather than importing it, as nothing below ``commands/`` does). ``out`` defaults to the
    current ``sys.stdout``.

    Raises:
        DemoError: the manifests do not fit, or a step failed; namespaces are gone by then.
    """
    if os.geteuid() != 0:
        raise DemoError("nlproxy demo", "needs root: it creates network namespaces (try sudo)")
    out = out or sys.stdout
    spec = read_spec(manifests)
    for stale in sweep_stale(NAMESPACE_TAG):
        print(f"(deleted {stale}, left by an earlier demo that was killed)", file=out)
    pods = [name for name, _ in spec.endpoints]
    with (
        tempfile.TemporaryDirectory(prefix="nlproxy-demo-") as tmp,
        Testbed(local_pods=pods, remote_pods=(), ports=spec.pod_ports, tag=NAMESPACE_TAG) as tb,
    ):
        demo = Demo(spec, requests=requests, out=out, nlproxy=nlproxy)
        demo.check_topology(tb)
        made = [
            tb.node.netns,
            tb.node2.netns,
            tb.client.netns,
            *(p.netns for p in tb.pods.values()),
        ]
        _story(demo, tb, manifests, Path(tmp))
    demo.section("Cleaned up")
    demo.say(f"deleted {len(made)} network namespaces and stopped {len(pods)} echo servers")
    if demo.problems:
        demo.say("")
        demo.say("Problems:")
        for problem in demo.problems:
            demo.say("  - " + problem)
        return 1
    return 0


def _story(demo: Demo, tb: Testbed, manifests: Path, tmp: Path) -> None:
    spec = demo.spec
    demo.show_topology(tb)
    work = tmp / "manifests"
    shutil.copytree(manifests, work)
    demo.apply(tb, work, f"2. Program the rules for {spec.service} from {manifests}")
    demo.traffic(tb, "3. Traffic through the service")
    demo.show_rules(tb)
    gone, gone_ip = spec.endpoints[-1]
    edited = tmp / "without"
    without_endpoint(spec, work, edited, gone)
    demo.apply(tb, edited, f"5. Remove endpoint {gone} ({gone_ip}) and run again")
    after = demo.traffic(tb, "6. Traffic after the change")
    leaked = sum(c[gone] for c in after.values())
    if leaked:
        demo.problems.append(f"{gone} still answered {leaked} requests after its removal")
    else:
        demo.say(f"-> {gone} gets no traffic any more")
