"""The wheel on its own: installed into a fresh venv, away from the checkout, ``nlproxy demo``
finds its manifests and shows traffic (root, real kernel, as ``make demo``)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from tests.packaging.conftest import ROOT

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


def _elf_machine(data: bytes) -> int:
    assert data[:4] == b"\x7fELF"
    return int.from_bytes(data[18:20], "little")


def test_make_wheel_builds_for_arch(tmp_path: Path) -> None:
    """The wheel holds the compiled shim, so it is one architecture's: ``make wheel ARCH=...``
    builds (or cross-builds) that one's, tagged for it, and leaves the other's wheel beside it."""
    built = {}
    for arch, tag, machine in (("amd64", "linux_x86_64", 62), ("arm64", "linux_aarch64", 183)):
        proc = subprocess.run(
            ["make", "-C", str(ROOT), "wheel", f"ARCH={arch}", f"DIST={tmp_path}"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-4000:]
        [whl] = [p for p in tmp_path.glob("nlproxy-*.whl") if p.name.endswith(f"-{tag}.whl")]
        assert whl.name.endswith(f"-cp311-cp311-{tag}.whl"), whl.name
        with zipfile.ZipFile(whl) as z:
            [meta] = [n for n in z.namelist() if n.endswith(".dist-info/WHEEL")]
            wheel_file = z.read(meta).decode()
            [shim] = [n for n in z.namelist() if n.startswith("nlproxy/_nftshim")]
            assert _elf_machine(z.read(shim)) == machine, shim
        assert f"Tag: cp311-cp311-{tag}\n" in wheel_file
        assert "Root-Is-Purelib: false\n" in wheel_file
        built[arch] = whl
    assert sorted(tmp_path.glob("nlproxy-*.whl")) == sorted(built.values())


def test_a_native_build_needs_no_dpkg(tmp_path: Path) -> None:
    """A build host without dpkg (not Debian) builds for its own architecture, named by uname."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("uname", "bash"):
        (bin_dir / tool).symlink_to(subprocess.check_output(["which", tool], text=True).strip())
    script = (
        f'root={ROOT}; arch=; . "$root/packaging/target.sh"; echo "$native $arch ${{#target[@]}}"'
    )
    out = subprocess.run(
        ["bash", "-c", script], env={"PATH": str(bin_dir)}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    machine = {"x86_64": "amd64", "aarch64": "arm64"}[
        subprocess.check_output(["uname", "-m"], text=True).strip()
    ]
    assert out.stdout.split() == [machine, machine, "0"]
