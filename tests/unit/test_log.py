"""Logging: in JSON mode every line on stderr is one JSON object (the standard library's records
and ``warnings`` too), and an exception carries its stack."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import warnings

import pytest

from nlproxy.log import configure, defer, get_logger


def test_json_lines_for_ours_the_standard_librarys_and_warnings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure(level="info", fmt="json")
    try:
        try:
            _boom()
        except ValueError:
            get_logger("test").exception("thing.failed", object="x")
        logging.getLogger("urllib3.connectionpool").warning("Retrying %s", "/api")
        with warnings.catch_warnings():
            warnings.simplefilter("always")  # the suite turns warnings into errors
            warnings.warn("deprecated thing", DeprecationWarning, stacklevel=1)
        lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    finally:
        logging.captureWarnings(False)
        logging.getLogger().handlers = []
    failed, retry, warned = lines
    assert failed["event"] == "thing.failed"
    assert "Traceback" in failed["exception"]
    assert "ValueError: boom" in failed["exception"]
    assert (retry["event"], retry["logger"], retry["level"]) == (
        "Retrying /api",
        "urllib3.connectionpool",
        "warning",
    )
    assert "deprecated thing" in warned["event"]


def _boom() -> None:
    raise ValueError("boom")


class _SlowStream:
    """A stream that yields to other threads inside every write, as a pipe under load may."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        before = self.text
        time.sleep(0.0001)
        self.text = before + text if self.text == before else self.text + text
        return len(text)

    def flush(self) -> None:
        pass


def test_lines_from_many_threads_are_never_mixed(monkeypatch: pytest.MonkeyPatch) -> None:
    """nlproxy's events and the standard library's records (urllib3 logs from the watch
    threads) are written from several threads at once: each line is still one JSON object."""
    stream = _SlowStream()
    monkeypatch.setattr(sys, "stderr", stream)
    configure(level="info", fmt="json")
    log, std = get_logger("t"), logging.getLogger("urllib3.connectionpool")

    def ours(i: int) -> None:
        for j in range(40):
            log.info("sync.applied", worker=i, n=j)

    def theirs(i: int) -> None:
        for j in range(40):
            std.warning("Retrying %d %d", i, j)

    threads = [threading.Thread(target=f, args=(i,)) for i in range(4) for f in (ours, theirs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = stream.text.splitlines()
    assert len(lines) == 8 * 40
    for line in lines:
        json.loads(line)


def test_deferred_logging_is_set_up_as_asked_by_the_first_logger(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import structlog

    structlog.reset_defaults()
    defer(level="warning", fmt="json")
    assert not structlog.is_configured()
    try:
        log = get_logger("conntrack")
        log.info("conntrack.flushed", deleted=1)  # below the level asked for
        log.warning("conntrack.slow", passes=40)
        lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    finally:
        logging.captureWarnings(False)
        logging.getLogger().handlers = []
    assert [(r["event"], r["component"], r["level"]) for r in lines] == [
        ("conntrack.slow", "conntrack", "warning")
    ]


def test_a_commands_deferred_set_up_ends_with_the_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``cli.main`` called in-process for a command that logs nothing leaves no set-up behind:
    a logger made afterwards (here, inside a test's capture) is not reconfigured by it."""
    import structlog
    from structlog.testing import capture_logs

    from nlproxy.cli import main

    structlog.reset_defaults()
    assert main(["version"]) == 0
    capsys.readouterr()
    with capture_logs() as logs:
        get_logger("kube-source").warning("source.kind_unavailable", kind="ServiceCIDR")
    assert [(e["event"], e["kind"]) for e in logs] == [("source.kind_unavailable", "ServiceCIDR")]
    assert capsys.readouterr().err == ""
