"""The API server ``preflight`` reports for a kubeconfig is the one ``run`` would reach: one file,
named as written, read as the client's loader reads it (a differential test against the loader
itself); a kubeconfig ``run`` could not use is one ``FAIL`` line naming the file and why, from
the command line too, with no raw ``[Errno N]`` text and no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nlproxy.cli import main
from nlproxy.cluster import kube_client
from nlproxy.cluster.kubeconfig import merged, server_of
from nlproxy.errors import ConfigError
from nlproxy.operate import preflight_api as pfa


def _doc(**sections: object) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Config", **sections})


def _cluster(name: str, server: str) -> dict[str, object]:
    return {"name": name, "cluster": {"server": server}}


def _context(name: str, cluster: str) -> dict[str, object]:
    return {"name": name, "context": {"cluster": cluster, "user": "u"}}


USERS = [{"name": "u", "user": {"token": "t"}}]


def _loaders_host(kubeconfig: str) -> str:
    """The address the ``kubernetes`` package's own loader loads from ``kubeconfig``."""
    cfg = kube_client.Configuration()
    kube_client.kubeconfig_loading().load_kube_config(
        config_file=kubeconfig, client_configuration=cfg, persist_config=False
    )
    return str(cfg.host)


LISTS = [
    pytest.param(
        [
            {"clusters": [_cluster("c", "https://192.0.2.1:6443")], "current-context": "a"},
            {
                "clusters": [_cluster("c", "https://192.0.2.2:6443")],
                "contexts": [_context("a", "c")],
                "users": USERS,
            },
        ],
        "https://192.0.2.1:6443",
        id="first-definition-of-a-cluster-wins",
    ),
    pytest.param(
        [
            {
                "clusters": [_cluster("one", "https://192.0.2.1:6443")],
                "contexts": [_context("a", "one")],
                "current-context": "a",
                "users": USERS,
            },
            {
                "clusters": [_cluster("two", "https://192.0.2.2:6443")],
                "contexts": [_context("b", "two")],
                "current-context": "b",
            },
        ],
        "https://192.0.2.2:6443",
        id="last-current-context-wins",
    ),
    pytest.param(
        [
            None,  # a file of the list that does not exist is skipped
            {
                "clusters": [_cluster("c", "https://192.0.2.3:6443")],
                "contexts": [_context("a", "c"), _context("a", "nowhere")],
                "current-context": "a",
                "users": USERS,
            },
        ],
        "https://192.0.2.3:6443",
        id="absent-file-skipped-first-context-of-a-name",
    ),
]


@pytest.mark.parametrize(("docs", "server"), LISTS)
def test_the_server_is_the_one_the_loader_loads_from_a_merged_list(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    docs: list[dict[str, object] | None],
    server: str,
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    names = []
    for i, doc in enumerate(docs):
        if doc is not None:
            (tmp_path / f"k{i}").write_text(_doc(**doc))
        names.append(f"~/k{i}")  # expanded, as the loader expands it
    joined = ":".join(names)
    assert _loaders_host(joined) == server
    assert server_of(joined) == server


def test_a_user_is_taken_from_the_file_that_defines_it_first(tmp_path: Path) -> None:
    (tmp_path / "a").write_text(_doc(users=[{"name": "u", "user": {"token": "first"}}]))
    (tmp_path / "b").write_text(_doc(users=[{"name": "u", "user": {"token": "second"}}]))
    found = merged(f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    assert found is not None
    assert found.users["u"] == (str(tmp_path / "a"), {"token": "first"})


GOOD = _doc(
    clusters=[_cluster("c", "https://127.0.0.1:1")],
    contexts=[_context("x", "c")],
    users=USERS,
    **{"current-context": "x"},
)

BAD = [
    pytest.param(None, "{p}: No such file or directory", id="missing"),
    pytest.param("", "kubeconfig {p}: the file is empty", id="empty"),
    pytest.param("- a\n- b\n", "kubeconfig {p}: not a YAML mapping", id="yaml-list"),
    pytest.param("a: [b\n", "kubeconfig {p}: not YAML: ", id="not-yaml"),
    pytest.param(b"\xff: x\n", "kubeconfig {p}: not YAML: ", id="not-utf-8"),
    pytest.param(
        _doc(clusters=[_cluster("c", "https://127.0.0.1:1")]),
        "kubeconfig {p}: no current-context",
        id="no-contexts",
    ),
    pytest.param(
        GOOD.replace("current-context: x", "current-context: y"),
        "kubeconfig {p}: current-context y: no context of that name",
        id="unknown-context",
    ),
    pytest.param(
        GOOD.replace("cluster: c", "cluster: gone"),
        "kubeconfig {p}: context x: cluster gone: no cluster of that name",
        id="context-names-a-missing-cluster",
    ),
    pytest.param(
        GOOD.replace("server: https://127.0.0.1:1", "insecure-skip-tls-verify: true"),
        "kubeconfig {p}: cluster c has no server",
        id="cluster-without-server",
    ),
    pytest.param(
        GOOD.replace("server: https://127.0.0.1:1", "server: 6443"),
        "kubeconfig {p}: cluster c: server 6443 is no URL",
        id="server-not-a-string",
    ),
    pytest.param(
        GOOD.replace("context:\n    cluster: c\n    user: u", "context: null"),
        "kubeconfig {p}: context x: its context is empty",
        id="context-null",
    ),
    pytest.param(
        GOOD.replace("user:\n    token: t", "user: null"),
        "kubeconfig {p}: user u: its user is empty",
        id="user-null",
    ),
    pytest.param(
        GOOD.replace("current-context: x", "current-context: 5"),
        "kubeconfig {p}: current-context 5: no context of that name",
        id="current-context-a-number",
    ),
]


def _written(path: Path, text: str | bytes | None) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "says"), BAD)
def test_a_kubeconfig_run_could_not_use_is_one_line_naming_the_file(
    tmp_path: Path, text: str | bytes | None, says: str
) -> None:
    path = _written(tmp_path / "kubeconfig", text)
    with pytest.raises(ConfigError) as info:
        pfa.kubeconfig_server(str(path))
    assert says.format(p=path) in str(info.value)
    assert "Errno" not in str(info.value)
    assert "\n" not in str(info.value)


def _preflight_api_lines(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[int, list[str]]:
    status = main(["preflight", *argv])
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    assert "Errno" not in out.out + out.err
    return status, [line for line in out.out.splitlines() if " api-server " in line]


@pytest.mark.parametrize(("text", "says"), BAD)
def test_preflight_says_it_in_one_fail_line_and_exits_1(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    text: str | bytes | None,
    says: str,
) -> None:
    monkeypatch.delenv("NLPROXY_API_SERVER", raising=False)
    path = _written(tmp_path / "kubeconfig", text)
    status, lines = _preflight_api_lines(["--kubeconfig", str(path)], capsys)
    assert status == 1
    assert len(lines) == 1
    assert lines[0].startswith("FAIL  api-server")
    assert says.format(p=path) in lines[0]


NOT_FOUND = "No such file or directory"


@pytest.mark.parametrize(
    ("given", "why"),
    [
        pytest.param(
            "{d}/k:{d}/k", f"{NOT_FOUND} (one file; a ':'-joined list is not merged)", id="list"
        ),
        pytest.param(
            "~/k", f"{NOT_FOUND} (one file, named as written: a '~' is not expanded)", id="home"
        ),
        pytest.param("{d}", "Is a directory", id="directory"),
    ],
)
def test_preflight_refuses_what_run_refuses_in_runs_words(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    given: str,
    why: str,
) -> None:
    """``run`` opens its kubeconfig as one file named as written (kube-proxy's reading), so
    a list or a ``~`` that the client's loader would take is no kubeconfig of ``run``'s, and
    ``preflight``'s finding is ``run``'s refusal, word for word."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("NLPROXY_API_SERVER", raising=False)
    (tmp_path / "k").write_text(GOOD)
    path = given.format(d=tmp_path)
    assert main(["run", "--kubeconfig", path, "--hostname-override", "n1"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"nlproxy: --kubeconfig: {path}: {why}"]
    status, lines = _preflight_api_lines(["--kubeconfig", path], capsys)
    assert status == 1
    assert lines == [f"FAIL  api-server  --kubeconfig: {path}: {why}"]
