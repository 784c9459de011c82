"""``run`` and ``plan`` given a kubeconfig whose sections the client's loader cannot use: one
line naming the file and the section, status 2, never a traceback, an internal error, or a
daemon sending its requests to an empty address. Each runs in a namespace of its own, where
nothing answers. (Every case, and the client's own result:
``tests/kube/test_kubeconfig_refused.py``.)"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from nlproxy.cli import main
from tests.kube.conftest import NODE
from tests.kube.test_kubeconfig_refused import bad_files, kubeconfig

CASES = ["cluster-without-server", "context-null", "user-a-string", "client-key-a-directory"]


@pytest.mark.parametrize("case", CASES)
def test_run_and_plan_say_it_in_one_line_and_exit_2(
    make_netns: Callable[[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    ns = make_netns("kcfg")
    args, says, _ = bad_files(tmp_path)[case]
    path = kubeconfig(tmp_path / "kubeconfig", **args)
    line = f"nlproxy: kubeconfig {path}: {says}"
    run = subprocess.run(
        [sys.executable, "-m", "nlproxy", "--netns", ns, "run", "--kubeconfig", str(path),
         "--hostname-override", NODE, "--healthz-bind-address", "127.0.0.1:0",
         "--metrics-bind-address", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    if case == "client-key-a-directory":  # found by the loader itself, in the daemon
        assert run.stderr.splitlines()[-1] == line
    else:  # found before the daemon changed anything (its conntrack sysctls)
        assert run.stderr.splitlines() == [line]
    status = main(["--netns", ns, "plan", "--kubeconfig", str(path), "--node-name", NODE])
    assert (status, capsys.readouterr().err) == (2, line + "\n")
