"""The layering of ``nlproxy/`` (DESIGN.md, "Layout") as a test over the import graph.

Every import in every module counts, the ones inside functions too (a lazy import is still a
dependency). Three checks:

- ``LAYERS``: the packages in the order DESIGN.md draws the pipeline, bottom first; a module
  imports only from its own package or a lower layer (siblings in one layer do not import each
  other).
- ``RULES``: what a package must not reach, directly or through any chain of nlproxy modules
  (the transitive closure: ``nft/`` may not reach services through ``conntrack/`` or ``config``).
- No import cycle between modules.

The last tests feed the checkers made-up modules to show each one can fail.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "nlproxy"

# What "I/O" means for the planner: sockets, processes, the kernel, the API server, event loops.
# netlink/'s codec and protocol table are data, not I/O: its socket and namespaces are.
IO_MODULES = (
    "socket",
    "subprocess",
    "select",
    "selectors",
    "ctypes",
    "trio",
    "pyroute2",
    "kubernetes",
    "urllib3",
    "http",
    "nlproxy._nftshim",
    "nlproxy.netlink.nlsock",
    "nlproxy.netlink.netns",
    "nlproxy.nft.backend",
    "nlproxy.nft.monitor",
    "nlproxy.nft.dump",
    "nlproxy.nft.readback",
    "nlproxy.conntrack",
    "nlproxy.inspect",
    "nlproxy.serve",
    "nlproxy.sync",
    "nlproxy.daemon",
    # the clock, logging and files: the planner gets time and inputs as values
    "time",
    "logging",
    "structlog",
    "nlproxy.log",
    "os",
    "io",
    "shutil",
    "tempfile",
    "nlproxy.operate",
)


@dataclass(frozen=True)
class Rule:
    why: str
    modules: str  # a package or module; its submodules are bound too
    forbidden: tuple[str, ...]
    exempt: tuple[str, ...] = ()


STAGES = (
    "cluster",
    "proxy",
    "nft",
    "sync",
    "conntrack",
    "inspect",
    "serve",
    "daemon",
    "operate",
)

LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "nlproxy",
        "nlproxy.errors",
        "nlproxy.log",
        "nlproxy.runtime",
    ),  # version, errors, logs; the process's own machinery (memory, imports, inotify)
    ("nlproxy.netlink",),  # transport: one socket, one attribute codec
    ("nlproxy.demo",),  # the throwaway node (only commands/demo imports it: a rule below)
    ("nlproxy.cluster", "nlproxy.nft"),  # ① sources → state;  ③ the kernel's objects
    ("nlproxy.proxy",),  # ② the planner
    # ⑤ the effects of a sync and what the node exposes, on one floor: they are handed what
    # they need (``/configz``'s bytes included), so none imports the settings
    ("nlproxy.conntrack", "nlproxy.inspect", "nlproxy.serve"),
    ("nlproxy.config",),  # one typed Settings over them all
    ("nlproxy.sync",),  # ④ one sync, the loop
    # wiring only;  the operator commands' logic, one module per command (neither imports the
    # other: the daemon runs no command, a command starts no daemon)
    ("nlproxy.daemon", "nlproxy.operate"),
    ("nlproxy.commands",),  # one thin module per subcommand
    ("nlproxy.cli",),
    ("nlproxy.__main__",),
)
"""The packages bottom first, as DESIGN.md's pipeline draws them."""

KNOWN_UPWARD: set[tuple[str, str]] = set()
"""Edges against ``LAYERS`` or ``RULES`` that are known and scheduled to go; one that is gone
fails the test, so the list only shrinks (it is empty: add none)."""

ALLOWED_UPWARD = {
    ("nlproxy.commands.demo", "nlproxy.cli"): "the demo's steps are the command line's own",
}
"""Edges up the layers that are meant, and why."""

RULES = (
    Rule(
        "cluster/ knows no rules and no nftables",
        "nlproxy.cluster",
        ("nlproxy.nft", "nlproxy.proxy", "nlproxy.sync", "nlproxy._nftshim"),
    ),
    Rule(
        "nft/ knows no Kubernetes and no services",
        "nlproxy.nft",
        ("nlproxy.cluster", "nlproxy.proxy", "nlproxy.sync", "kubernetes"),
    ),
    Rule("proxy/ does no I/O", "nlproxy.proxy", IO_MODULES),
    Rule(
        "netlink/ imports no stage",
        "nlproxy.netlink",
        tuple(f"nlproxy.{p}" for p in STAGES),
    ),
    Rule("sync/ does not import daemon/", "nlproxy.sync", ("nlproxy.daemon",)),
    *(
        Rule(
            f"{effect}/ is an effect: it imports neither the other effects nor the settings",
            f"nlproxy.{effect}",
            tuple(
                f"nlproxy.{p}" for p in ("conntrack", "inspect", "serve", "config") if p != effect
            ),
        )
        for effect in ("conntrack", "inspect", "serve")
    ),
    Rule(
        "nothing below commands/ imports the command line",
        "nlproxy",
        ("nlproxy.cli", "nlproxy.commands", "argparse"),
        exempt=("nlproxy.cli", "nlproxy.__main__", "nlproxy.commands"),
    ),
    Rule(
        "only the demo command imports demo/",
        "nlproxy",
        ("nlproxy.demo",),
        exempt=("nlproxy.demo", "nlproxy.commands.demo"),
    ),
)


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(module: str, source: str, *, is_package: bool) -> Iterator[str]:
    """Every module ``source`` imports, absolute; ``from a import b`` yields ``a`` and ``a.b``."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            yield target
            yield from (f"{target}.{alias.name}" for alias in node.names)


def graph(root: Path) -> dict[str, set[str]]:
    return {
        module_name(path, root): set(
            imports(
                module_name(path, root), path.read_text(), is_package=path.name == "__init__.py"
            )
        )
        for path in sorted(root.rglob("*.py"))
    }


def resolve(name: str, modules: Iterable[str]) -> str | None:
    """The module ``name`` is (``a.b`` of ``from a import b`` may be a name in ``a``), or None
    outside the package."""
    known = set(modules)
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def reach(edges: dict[str, set[str]]) -> dict[str, dict[str, str]]:
    """For every module: each name it reaches through nlproxy modules, with the chain that
    does (``a -> b -> c``)."""
    local = {m: {r for t in ts if (r := resolve(t, edges)) and r != m} for m, ts in edges.items()}
    out: dict[str, dict[str, str]] = {}
    for start in edges:
        seen: dict[str, str] = {}
        todo = [(start, start)]
        visited = {start}
        while todo:
            module, chain = todo.pop()
            for target in edges.get(module, ()):
                seen.setdefault(target, f"{chain} -> {target}")
            for nxt in local.get(module, ()):
                if nxt not in visited:
                    visited.add(nxt)
                    todo.append((nxt, f"{chain} -> {nxt}"))
        out[start] = seen
    return out


def breaches(
    edges: dict[str, set[str]],
    rules: Iterable[Rule],
    known: Collection[tuple[str, str]] = (),
) -> list[str]:
    """Each module that reaches what a rule forbids, with the chain, but for ``known`` edges
    (a chain through one of them is still a breach of the modules further up)."""
    out = []
    reached = reach(
        {m: {t for t in ts if (m, resolve(t, edges)) not in known} for m, ts in edges.items()}
    )
    for rule in rules:
        for module, targets in sorted(reached.items()):
            if not within(module, rule.modules) or any(within(module, e) for e in rule.exempt):
                continue
            out.extend(
                f"{module} imports {target} ({chain}): {rule.why}"
                for target, chain in sorted(targets.items())
                if any(within(target, f) for f in rule.forbidden)
            )
    return out


def layer(module: str) -> tuple[int, str] | None:
    """(index in ``LAYERS``, the package) of a module of nlproxy; the root package only as
    itself."""
    best: tuple[int, str] | None = None
    for i, names in enumerate(LAYERS):
        for name in names:
            hit = module == name if name == "nlproxy" else within(module, name)
            if hit and (best is None or len(name) > len(best[1])):
                best = (i, name)
    return best


def upward(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Edges to a higher layer or to a sibling package of the same layer."""
    out = set()
    for module, targets in edges.items():
        here = layer(module)
        for target in targets:
            resolved = resolve(target, edges) or target
            there = layer(resolved)
            if here is None or there is None or here[1] == there[1]:
                continue
            if there[0] >= here[0]:
                out.add((module, resolved))
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles between nlproxy modules (strongly connected components, Tarjan)."""
    local = {m: {r for t in ts if (r := resolve(t, edges)) and r != m} for m, ts in edges.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(local.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(local):
        if v not in index:
            visit(v)
    return out


def test_the_tree_keeps_its_rules() -> None:
    edges = graph(PACKAGE)
    assert len(edges) > 100, "the walk found the package"
    assert breaches(edges, RULES, KNOWN_UPWARD) == []


def test_every_package_has_a_layer() -> None:
    packages = {m for m in graph(PACKAGE) if m.count(".") <= 1 and not m.endswith("_nftshim")}
    assert [m for m in sorted(packages) if layer(m) is None] == []


def test_no_import_climbs_back_up() -> None:
    found = upward(graph(PACKAGE)) - set(ALLOWED_UPWARD)
    assert sorted(found - KNOWN_UPWARD) == []
    assert sorted(KNOWN_UPWARD - found) == [], "gone: take it off KNOWN_UPWARD"


def test_no_import_cycles() -> None:
    assert cycles(graph(PACKAGE)) == []


FILE_CALLS = ("open", "read_text", "read_bytes", "write_text", "write_bytes", "iterdir", "glob")


def file_calls(source: str) -> list[int]:
    """Lines calling ``open()`` or a ``Path``'s readers and writers (by name: the planner has
    no other use for them)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id == "open")
            or (isinstance(node.func, ast.Attribute) and node.func.attr in FILE_CALLS)
        )
    ]


def test_proxy_opens_no_files() -> None:
    """No I/O also means no ``open()`` or ``Path.read_text()``: the planner gets its inputs as
    values."""
    calls = [
        f"{path.name}:{line}"
        for path in sorted((PACKAGE / "proxy").rglob("*.py"))
        for line in file_calls(path.read_text())
    ]
    assert calls == []


@pytest.mark.parametrize(
    "source",
    ["open('f')", "Path('f').read_text()", "def f(p):\n    return p.read_bytes()"],
)
def test_a_file_read_is_caught(source: str) -> None:
    assert file_calls(source) != []


@pytest.mark.parametrize(
    ("edges", "breach"),
    [
        pytest.param(
            {
                "nlproxy.nft.x": {"nlproxy.conntrack.y"},
                "nlproxy.conntrack.y": {"nlproxy.cluster.model"},
                "nlproxy.cluster.model": set(),
            },
            "nft/ knows no Kubernetes",
            id="nft-reaches-cluster-through-conntrack",
        ),
        pytest.param(
            {
                "nlproxy.proxy.x": {"nlproxy.cluster.y"},
                "nlproxy.cluster.y": {"nlproxy.log"},
                "nlproxy.log": {"structlog"},
            },
            "proxy/ does no I/O",
            id="proxy-logs-through-cluster",
        ),
        pytest.param(
            {"nlproxy.config": {"nlproxy.operate.x"}, "nlproxy.nft.x": {"nlproxy.config"}},
            "nft/ knows no Kubernetes",
            id="nft-reaches-services-through-config",
        ),
    ],
)
def test_each_rule_holds_through_other_modules(edges: dict[str, set[str]], breach: str) -> None:
    edges = {**edges, "nlproxy.operate.x": {"nlproxy.proxy.z"}, "nlproxy.proxy.z": set()}
    found = breaches(edges, RULES)
    assert any(breach in line for line in found), found


@pytest.mark.parametrize(
    ("module", "target"),
    [
        pytest.param("nlproxy.netlink.x", "nlproxy.nft.ir", id="netlink-imports-a-stage"),
        pytest.param("nlproxy.proxy.x", "nlproxy.sync.loop", id="planner-imports-the-sync"),
        pytest.param("nlproxy.conntrack.x", "nlproxy.inspect.rtnl", id="sibling-effects"),
        pytest.param("nlproxy.cluster.x", "nlproxy.config", id="source-imports-config"),
        pytest.param(
            "nlproxy.serve.x", "nlproxy.operate.explain", id="serve-imports-an-operator-command"
        ),
        pytest.param("nlproxy.daemon.x", "nlproxy.commands.run", id="daemon-imports-a-command"),
        pytest.param("nlproxy.daemon.x", "nlproxy.operate.status", id="daemon-imports-operate"),
        pytest.param("nlproxy.operate.run", "nlproxy.daemon.run", id="operate-imports-daemon"),
        pytest.param("nlproxy.sync.loop", "nlproxy.daemon.memory", id="sync-imports-daemon"),
        pytest.param("nlproxy.inspect.x", "nlproxy.operate.explain", id="effect-imports-operate"),
    ],
)
def test_an_import_up_the_layers_is_caught(module: str, target: str) -> None:
    edges = {module: {target}, target: set()}
    assert upward(edges) == {(module, target)}


def test_a_cycle_is_caught() -> None:
    edges = {
        "nlproxy.nft.a": {"nlproxy.nft.b"},
        "nlproxy.nft.b": {"nlproxy.nft.c.name"},  # ``from nlproxy.nft.c import name``
        "nlproxy.nft.c": {"nlproxy.nft.a"},
        "nlproxy.nft.d": {"nlproxy.nft.a"},
    }
    assert cycles(edges) == [["nlproxy.nft.a", "nlproxy.nft.b", "nlproxy.nft.c"]]


@pytest.mark.parametrize(
    ("module", "source", "breach"),
    [
        ("nlproxy.cluster.x", "from nlproxy.nft.ir import Table", "cluster/ knows no rules"),
        ("nlproxy.cluster.x", "from ..proxy import planner", "cluster/ knows no rules"),
        ("nlproxy.nft.x", "import kubernetes.client", "nft/ knows no Kubernetes"),
        ("nlproxy.nft.x", "from nlproxy.cluster.model import Service", "nft/ knows no Kubernetes"),
        ("nlproxy.proxy.x", "def f():\n    import socket", "proxy/ does no I/O"),
        ("nlproxy.proxy.x", "from nlproxy.nft.backend import NftBackend", "proxy/ does no I/O"),
        ("nlproxy.proxy.x", "from nlproxy.netlink.nlsock import open_socket", "proxy/ does no I/O"),
        ("nlproxy.daemon.x", "import argparse", "nothing below commands/"),
        ("nlproxy.sync.x", "from nlproxy.cli import main", "nothing below commands/"),
        ("nlproxy.operate.x", "from nlproxy.demo import testbed", "only the demo command"),
        ("nlproxy.proxy.x", "import time", "proxy/ does no I/O"),
        ("nlproxy.proxy.x", "from nlproxy.log import get_logger", "proxy/ does no I/O"),
        ("nlproxy.proxy.x", "from nlproxy.operate import explain", "proxy/ does no I/O"),
        ("nlproxy.netlink.x", "from nlproxy.conntrack import messages", "netlink/ imports no"),
        ("nlproxy.sync.x", "from nlproxy.daemon.memory import release", "sync/ does not import"),
    ],
)
def test_each_rule_catches_a_breach(module: str, source: str, breach: str) -> None:
    found = breaches({module: set(imports(module, source, is_package=False))}, RULES)
    assert any(breach in line for line in found), found


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("nlproxy.proxy.x", "from nlproxy.nft.ir import Table"),
        ("nlproxy.proxy.x", "from nlproxy.netlink.protocols import NFT_NAMES"),
        ("nlproxy.nft.x", "from nlproxy.nft import ir"),
        ("nlproxy.commands.run", "import argparse"),
        ("nlproxy.commands.demo", "from nlproxy.demo.run import run_demo"),
        ("nlproxy.demo.testbed", "from nlproxy.demo import ns"),
    ],
)
def test_allowed_imports_pass(module: str, source: str) -> None:
    assert breaches({module: set(imports(module, source, is_package=False))}, RULES) == []
