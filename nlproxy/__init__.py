"""nlproxy: a Kubernetes service proxy that programs nftables over netlink."""

# Read on first use (PEP 562), not at import: importing the package loads nothing else, so that
# the entry module can set its signal handler before any import (tests/unit/test_interrupt.py).
__version__: str
"""``[project] version`` of pyproject.toml, its one place, as the build stamped it."""
BUILD: dict[str, str]
"""The build's ``git_commit``, ``git_tree_state`` and ``build_date``, as Kubernetes stamps them."""


def __getattr__(name: str) -> object:
    if name not in ("__version__", "BUILD"):
        raise AttributeError(f"module 'nlproxy' has no attribute {name!r}")
    version, build = _stamp()
    globals().update(__version__=version, BUILD=build)
    return version if name == "__version__" else build


def _stamp() -> tuple[str, dict[str, str]]:
    """A built package carries ``nlproxy/_build.py``, which packaging/build-wheel.sh writes into
    the copy it builds (never into the repository). A checkout (make deps installs it in place)
    reads the version from its pyproject.toml, and has no commit or date."""
    import importlib
    import os

    try:
        build = importlib.import_module("nlproxy._build")
    except ModuleNotFoundError:
        empty = {"git_commit": "", "git_tree_state": "", "build_date": ""}
        pyproject = os.path.join(os.path.dirname(os.path.dirname(__file__)), "pyproject.toml")
        section = ""
        try:
            with open(pyproject, encoding="utf-8") as f:
                for line in f:
                    if line.startswith("["):
                        section = line.strip()
                    elif section == "[project]" and line.startswith("version = "):
                        return line.split("=", 1)[1].strip().strip('"'), empty
        except OSError:
            pass
        return "0+unknown", empty
    keys = ("git_commit", "git_tree_state", "build_date")
    return str(build.VERSION), {k: str(getattr(build, k.upper())) for k in keys}
