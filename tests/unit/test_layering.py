"""The layering of ``nlproxy/`` (DESIGN.md, "Layout") as a test over the import graph.

Every import in every module counts, the ones inside functions too (a lazy import is still a
dependency). A rule names the modules it binds, what they must not import, and why; the last tests
feed the checker made-up modules to show each rule can fail.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
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
)


@dataclass(frozen=True)
class Rule:
    why: str
    modules: str  # a package or module; its submodules are bound too
    forbidden: tuple[str, ...]
    exempt: tuple[str, ...] = ()


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


def breaches(edges: dict[str, set[str]], rules: Iterable[Rule]) -> list[str]:
    out = []
    for rule in rules:
        for module, targets in sorted(edges.items()):
            if not within(module, rule.modules) or any(within(module, e) for e in rule.exempt):
                continue
            out.extend(
                f"{module} imports {target}: {rule.why}"
                for target in sorted(targets)
                if any(within(target, f) for f in rule.forbidden)
            )
    return out


def test_the_tree_keeps_its_layers() -> None:
    edges = graph(PACKAGE)
    assert len(edges) > 100, "the walk found the package"
    assert breaches(edges, RULES) == []


def test_proxy_opens_no_files() -> None:
    """No I/O also means no ``open()``: the planner gets its inputs as values."""
    calls = [
        f"{path.name}:{node.lineno}"
        for path in sorted((PACKAGE / "proxy").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open"
    ]
    assert calls == []


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
        ("nlproxy.explain.x", "from nlproxy.demo import testbed", "only the demo command"),
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
