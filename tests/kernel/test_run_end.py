"""``nlproxy run`` hands the daemon an ``end`` that may end the process only from the console
entry point: called in-process (tests, an embedding program), the stop deadline's thread must not
``os._exit`` the caller's process when a hand of it is slow (``daemon/stop.py``). Root: the
namespace lock is taken before the daemon would start."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from pathlib import Path

import pytest

import nlproxy.daemon.run as daemon_run
from nlproxy.cli import main
from nlproxy.commands import _fastexit


@pytest.mark.parametrize("entry", [False, True], ids=["in-process", "console-entry"])
def test_the_daemon_gets_an_end_only_where_it_may_end_the_process(
    entry: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ends: list[Callable[[int], object] | None] = []

    def run_daemon(_settings: object, **kw: Callable[[int], object] | None) -> int:
        ends.append(kw["end"])
        return 0

    monkeypatch.setattr(daemon_run, "run_daemon", run_daemon)

    def command() -> int:
        if entry:
            _fastexit.allow()  # what cli.entry does; in this copied context only
        return main(["run", "--manifests", str(tmp_path), "--node-name", "n"])

    assert contextvars.copy_context().run(command) == 0
    assert ends == ([_fastexit.end] if entry else [None])
