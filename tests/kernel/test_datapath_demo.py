"""``nlproxy demo`` end to end: real namespaces, real engine, real traffic; nothing left over."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nlproxy.cli import main
from nlproxy.demo.ns import sweep_stale
from nlproxy.demo.run import NAMESPACE_TAG, find_examples, read_spec, without_endpoint
from nlproxy.netlink.netns import NETNS_RUN_DIR
from tests import netns

ROOT = Path(__file__).parents[2]


def _demo_namespaces(pid: int) -> list[str]:
    return [n for n in os.listdir(NETNS_RUN_DIR) if n.startswith(f"nlp-demo-{pid}-")]


def test_example_manifests_describe_the_demo() -> None:
    spec = read_spec(find_examples())
    assert spec.service == "demo/echo"
    assert [name for name, _ in spec.endpoints] == ["echo-a", "echo-b", "echo-c"]
    assert {(p.protocol, p.node_port is not None) for p in spec.ports} == {
        ("tcp", True),
        ("udp", True),
    }


def test_without_endpoint_edits_a_copy(tmp_path: Path) -> None:
    spec = read_spec(find_examples())
    without_endpoint(spec, find_examples(), tmp_path, "echo-b")
    edited = yaml.safe_load((tmp_path / spec.slice_file.name).read_text())
    assert [ep["targetRef"]["name"] for ep in edited["endpoints"]] == ["echo-a", "echo-c"]
    original = yaml.safe_load(spec.slice_file.read_text())
    assert len(original["endpoints"]) == 3


def test_bad_manifests_name_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "svc.yaml").write_text("apiVersion: v1\nkind: Node\nmetadata: {name: n}\n")
    assert main(["demo", "--manifests", str(tmp_path)]) == 1
    assert f"manifests {tmp_path}: no Service, EndpointSlice object" in capsys.readouterr().err


def test_demo_runs_and_cleans_up(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["demo", "--requests", "8"])
    out = capsys.readouterr().out
    assert status == 0, out
    for heading in ("== 1.", "== 2.", "== 3.", "== 4.", "== 5.", "== 6.", "== Cleaned up =="):
        assert heading in out
    after = out.split("== 6.")[1]
    assert re.search(r"^\s+echo-c\s+0\s*$", after, re.MULTILINE), after
    assert "echo-c gets no traffic any more" in after
    assert not _demo_namespaces(os.getpid())


def test_demo_interrupted_deletes_everything() -> None:
    try:
        _interrupt_demo_and_check()
    finally:  # what a demo that failed to clean up left (it is dead by now)
        sweep_stale(NAMESPACE_TAG)


def _interrupt_demo_and_check() -> None:
    with subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from nlproxy.cli import entry; entry()",
            "demo",
            "--requests",
            "200",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        preexec_fn=netns.default_sigint,
    ) as proc:
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("== 3."):
                    break
            assert _demo_namespaces(proc.pid), "the demo built its namespaces"
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=30) == 130
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert not _demo_namespaces(proc.pid)
