"""The wheel on its own: installed into a fresh venv, away from the checkout, ``nlproxy demo``
finds its manifests and shows traffic (root, real kernel, as ``make demo``)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

EXAMPLES = "share/nlproxy/examples/demo"


def test_wheel_carries_the_demo_manifests_and_the_shim(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    data = {n.split("/data/", 1)[1] for n in names if ".data/data/" in n}
    assert {f"{EXAMPLES}/{f}" for f in ("service.yaml", "endpointslice.yaml", "node.yaml")} <= data
    assert any(n.startswith("nlproxy/_nftshim") and n.endswith(".so") for n in names)


def test_demo_runs_from_an_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
         "--no-index", str(wheel)],
        check=True,
    )  # fmt: skip
    # The dependencies come from the test environment (offline, fast): a path entry after the
    # venv's own site-packages, whose nlproxy (the wheel's) therefore comes first.
    site = Path(
        subprocess.run(
            [py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    (site / "test-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")

    where = subprocess.run(
        [py, "-c", "import nlproxy.demo.run as d; print(d.__file__); print(d.find_examples())"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert where[0].startswith(str(site)), where
    assert where[1] == str(venv.resolve() / EXAMPLES), where

    demo = subprocess.run(
        [venv / "bin" / "nlproxy", "demo", "--requests", "4"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "== Cleaned up ==" in demo.stdout, demo.stdout
