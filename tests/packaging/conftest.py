"""Fixtures for the packaging tests: artefacts built once per session from this checkout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import netns

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session", autouse=True)
def _prerequisites() -> None:
    """Building and installing packages takes root (apt, mmdebstrap, podman)."""
    if missing := netns.missing_prerequisites():
        pytest.fail(f"test prerequisites missing: {', '.join(missing)} (run `make test`)")


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The nlproxy wheel, built by the test interpreter (which has the build requirements)."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        ["bash", str(ROOT / "packaging" / "build-wheel.sh"), sys.executable, str(out)],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("nlproxy-*.whl")
    return built


@pytest.fixture(scope="session")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``make deb`` into a fresh directory."""
    out = tmp_path_factory.mktemp("deb")
    proc = subprocess.run(
        ["bash", str(ROOT / "packaging" / "build-deb.sh"), str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    (built,) = out.glob("nlproxy_*.deb")
    return built


@pytest.fixture(scope="session")
def built(deb: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``make image`` from ``deb`` into a fresh directory: the OCI archive, and the root
    filesystem the image was made from (the .deb installed into Debian bookworm with dpkg)."""
    out = tmp_path_factory.mktemp("image")
    proc = subprocess.run(
        ["bash", str(ROOT / "packaging" / "build-image.sh"), str(out), str(deb)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    (archive,) = out.glob("nlproxy_*.oci.tar")
    return {"archive": archive, "rootfs": ROOT / "build" / "image" / "rootfs"}
