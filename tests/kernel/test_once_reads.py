"""run --once reads the manifests directory once, as the loader reads it: a link out of the
directory is named and never opened (not even to hash it for the restart record), and a FIFO
does not hold the run up."""

from __future__ import annotations

import ctypes
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from nlproxy.cli import main
from tests.kernel import topo

NODE = "node-x"
IN_OPEN = 0x20
_libc = ctypes.CDLL(None, use_errno=True)


def _run_once(netns: str, directory: Path) -> int:
    return main(
        [
            "--netns", netns, "--log-format", "json", "run", "--once",
            "--manifests", str(directory), "--node-name", NODE,
            "--cluster-cidr", "10.244.0.0/16", "--service-cidr", "10.96.0.0/16",
        ]
    )  # fmt: skip


def _applied(err: str) -> dict[str, object]:
    lines = [json.loads(x) for x in err.splitlines() if x.startswith("{")]
    [applied] = [x for x in lines if x.get("event") == "sync.applied"]
    return applied


def _opened(fd: int) -> bool:
    """Whether the watched file was opened since the last look."""
    try:
        return bool(os.read(fd, 4096))
    except BlockingIOError:
        return False


def test_a_link_out_of_the_directory_is_never_opened(
    make_netns: Callable[[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = make_netns("once-link")
    d = tmp_path / "m"
    eps = [topo.endpoint("10.244.1.7", NODE)]
    topo.write_manifests(d, [topo.service("web", "10.96.2.1"), topo.endpoint_slice("web", eps)])
    outside = tmp_path / "outside"
    topo.write_manifests(outside, [topo.service("secret", "10.96.2.2")])
    [target] = sorted(outside.iterdir())
    (d / "zz-link.yaml").symlink_to(target)
    fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert fd >= 0
    try:
        assert _libc.inotify_add_watch(fd, os.fsencode(target), IN_OPEN) >= 0
        for _ in range(2):  # and again: a run with a problem leaves no files digest to trust
            assert _run_once(ns, d) == 3
            err = capsys.readouterr().err
            assert f"zz-link.yaml: a symbolic link to {target}, outside {d}; not read" in err
            assert not _opened(fd), "the file outside the directory was opened"
    finally:
        os.close(fd)
    rules = main(["--netns", ns, "rules"])
    assert rules == 0
    text = capsys.readouterr().out
    assert "10.96.2.1" in text
    assert "10.96.2.2" not in text


def test_a_fifo_is_named_and_does_not_hold_the_run_up(
    make_netns: Callable[[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = make_netns("once-fifo")
    d = tmp_path / "m"
    topo.write_manifests(d, [topo.service("web", "10.96.2.1")])
    os.mkfifo(d / "pipe.yaml")
    assert _run_once(ns, d) == 3
    err = capsys.readouterr().err
    assert "pipe.yaml: not a regular file; not read" in err
    assert _applied(err)["ops"] > 0
