"""A kubeconfig whose sections the client's loader cannot use is one line naming the file and
the section, with or without a server replacing the kubeconfig's (``--master``): where the
loader would dump a section (``Expected key context in /path/{'context': None, ...}``), fail
with a Python ``TypeError`` or ``AttributeError``, say "File does not exist" of a directory, or
load a cluster without a ``server`` and send every request nowhere. (``preflight``'s finding for
the same files: ``tests/unit/test_kubeconfig_read.py``; ``run`` and ``plan`` through the command
line: ``tests/kernel/test_auth_provider_cli.py``.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from nlproxy.cluster.kube import api_client_from_config
from nlproxy.errors import ConfigError

SERVER = "https://127.0.0.1:1"


def kubeconfig(path: Path, *, cluster: Any = None, user: Any = None, **top: Any) -> Path:
    """A kubeconfig of one cluster ``c``, one user ``u`` and the current context ``x``, with
    ``cluster``/``user`` sections (default: a server and a token) and top-level keys
    replaced."""
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": SERVER} if cluster is None else cluster}],
        "users": [{"name": "u", "user": {"token": "t"} if user is None else user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    doc.update(top)
    path.write_text(yaml.safe_dump(doc))
    return path


def bad_files(d: Path) -> dict[str, tuple[dict[str, Any], str, bool]]:
    """Per case: ``kubeconfig``'s arguments, what is said after ``kubeconfig PATH: ``, and
    whether a server given (``--master``) makes the file usable."""
    return {
        "cluster-without-server": (
            {"cluster": {"insecure-skip-tls-verify": True}}, "cluster c has no server", True
        ),
        "server-not-a-string": ({"cluster": {"server": 6443}}, "cluster c: server 6443 is no URL",
                                True),
        "cluster-empty": ({"cluster": {}}, "cluster c has no server", True),
        "cluster-null": ({"clusters": [{"name": "c", "cluster": None}]},
                         "cluster c: its cluster is empty", False),
        "context-null": ({"contexts": [{"name": "x", "context": None}]},
                         "context x: its context is empty", False),
        "user-null": ({"users": [{"name": "u", "user": None}]}, "user u: its user is empty", False),
        "user-a-string": ({"users": [{"name": "u", "user": "token"}]},
                          "user u: its user is not a mapping", False),
        "current-context-a-number": ({"current-context": 5},
                                     "current-context 5: no context of that name", False),
        "context-names-a-missing-cluster": (
            {"contexts": [{"name": "x", "context": {"cluster": "gone", "user": "u"}}]},
            "context x: cluster gone: no cluster of that name", False,
        ),
        "certificate-authority-a-directory": (
            {"cluster": {"server": SERVER, "certificate-authority": str(d)}},
            f"{d}: Is a directory", False,
        ),
        "certificate-authority-missing": (
            {"cluster": {"server": SERVER, "certificate-authority": str(d / "ca.crt")}},
            f"{d / 'ca.crt'}: No such file or directory", False,
        ),
        "client-key-a-directory": (
            {"user": {"client-certificate-data": "Y2VydA==", "client-key": str(d)}},
            f"{d}: Is a directory", False,
        ),
    }  # fmt: skip


CASES = list(bad_files(Path("/")))


@pytest.mark.parametrize("override", [False, True], ids=["own-server", "server-given"])
@pytest.mark.parametrize("case", CASES)
def test_a_section_the_loader_cannot_use_is_one_line_naming_the_file(
    tmp_path: Path, case: str, override: bool
) -> None:
    args, says, usable_with_a_server = bad_files(tmp_path)[case]
    path = kubeconfig(tmp_path / "kubeconfig", **args)
    server = "https://127.0.0.1:2" if override else None
    if override and usable_with_a_server:
        with api_client_from_config(str(path), server=server) as client:
            assert client.configuration.host == server
        return
    with pytest.raises(ConfigError) as info:
        api_client_from_config(str(path), server=server)
    assert str(info.value) == f"kubeconfig {path}: {says}"
