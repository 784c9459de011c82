"""nlproxy: a Kubernetes service proxy that programs nftables over netlink."""

import importlib


def _stamp() -> tuple[str, dict[str, str]]:
    """The version, and the build's commit, tree state and date, as Kubernetes stamps them.

    The version's one place is ``[project] version`` of pyproject.toml. A built package carries
    ``nlproxy/_build.py``, which packaging/build-wheel.sh writes into the copy it builds from
    (never into the repository); a checkout installed in place (make deps) has only the installed
    metadata, and no commit or date."""
    try:
        build = importlib.import_module("nlproxy._build")
    except ModuleNotFoundError:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("nlproxy"), {"git_commit": "", "git_tree_state": "", "build_date": ""}
        except PackageNotFoundError:
            return "0+unknown", {"git_commit": "", "git_tree_state": "", "build_date": ""}
    keys = ("git_commit", "git_tree_state", "build_date")
    return str(build.VERSION), {k: str(getattr(build, k.upper())) for k in keys}


__version__, BUILD = _stamp()
