"""The version's one place is ``[project] version`` of pyproject.toml: a build stamps it, with
the commit, tree state and date, into what it builds (``nlproxy version``,
``kubernetes_build_info``), and ``make tag`` tags a release ``vVERSION`` from it once the
CHANGELOG and the DaemonSet name it. Each is tried on a clone of this checkout whose version is
moved to one no file of the repository names."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

from tests.packaging.conftest import ROOT

NEW = "9.8.7"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@localhost", *args],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


def _set_version(repo: Path, version: str) -> None:
    pyproject = repo / "pyproject.toml"
    text, n = re.subn(r'(?m)^version = "[^"]*"$', f'version = "{version}"', pyproject.read_text())
    assert n == 1
    pyproject.write_text(text)


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """This checkout's files (tracked and new, as committed or not) in a repository of their
    own, with its version moved to NEW, committed."""
    repo = tmp_path / "clone"
    repo.mkdir()
    files = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    tar = subprocess.run(
        ["tar", "--null", "--ignore-failed-read", "-T", "-", "-cf", "-"],
        input=files, capture_output=True, check=True, cwd=ROOT,
    ).stdout  # fmt: skip
    subprocess.run(["tar", "-xf", "-", "-C", str(repo)], input=tar, check=True)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _set_version(repo, NEW)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", f"version {NEW}")
    return repo


def test_no_module_names_the_version() -> None:
    """No version literal in nlproxy/: a release changes pyproject.toml only."""
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for path in (ROOT / "nlproxy").rglob("*.py"):
        assert f'"{version}"' not in path.read_text(), path


def test_a_build_stamps_the_version_commit_and_date(clone: Path, tmp_path: Path) -> None:
    out = tmp_path / "wheel"
    subprocess.run(
        ["bash", str(clone / "packaging/build-wheel.sh"), sys.executable, str(out)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = out.glob("nlproxy-*.whl")
    assert wheel.name.startswith(f"nlproxy-{NEW}-")
    assert "nlproxy/_build.py" in zipfile.ZipFile(wheel).namelist()
    assert not (clone / "nlproxy/_build.py").exists()  # stamped into the build's copy only
    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
         "--no-index", str(wheel)],
        check=True,
    )  # fmt: skip
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    (Path(site) / "test-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    show = (
        "import json; from nlproxy.serve.metrics import build_info; print(json.dumps(build_info()))"
    )
    info = json.loads(
        subprocess.run(
            [py, "-c", show], check=True, capture_output=True, text=True, cwd=tmp_path
        ).stdout
    )
    epoch = int(_git(clone, "log", "-1", "--format=%ct"))
    assert info["git_version"] == f"v{NEW}"
    assert (info["major"], info["minor"]) == ("9", "8")
    assert info["git_commit"] == _git(clone, "rev-parse", "HEAD")
    assert info["git_tree_state"] == "clean"
    assert info["build_date"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
    version = subprocess.run(
        [venv / "bin" / "nlproxy", "version"], check=True, capture_output=True, text=True,
        cwd=tmp_path,
    ).stdout  # fmt: skip
    assert version.startswith(f"nlproxy {NEW} (libnftnl "), version


def _tag(repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-s", "-C", str(repo), "tag"], capture_output=True, text=True, check=False
    )


def test_make_tag_tags_a_whole_release_once(clone: Path) -> None:
    tag = f"v{NEW}"
    # The CHANGELOG has no section for the new version yet.
    refused = _tag(clone)
    assert refused.returncode == 2
    assert f'CHANGELOG.md has no "## {NEW}" section' in refused.stderr
    assert _git(clone, "tag", "-l", tag) == ""
    changelog = clone / "CHANGELOG.md"
    changelog.write_text(changelog.read_text().replace("## Unreleased\n", f"## {NEW}\n", 1))
    _git(clone, "commit", "-qam", "changelog")
    refused = _tag(clone)
    assert refused.returncode == 2
    assert "deploy/kubernetes/daemonset.yaml names image" in refused.stderr
    daemonset = clone / "deploy/kubernetes/daemonset.yaml"
    daemonset.write_text(
        re.sub(r"image: nlproxy:\S+", f"image: nlproxy:{NEW}", daemonset.read_text())
    )
    # Uncommitted: refused.
    refused = _tag(clone)
    assert (refused.returncode, "commit them first" in refused.stderr) == (2, True)
    _git(clone, "commit", "-qam", "daemonset")
    made = _tag(clone)
    assert (made.returncode, made.stdout.strip()) == (0, tag), made.stderr
    head = _git(clone, "rev-parse", "HEAD")
    assert _git(clone, "rev-parse", f"{tag}^{{commit}}") == head
    assert _git(clone, "cat-file", "-t", tag) == "tag"  # annotated
    assert _git(clone, "tag", "-l", "--format=%(contents:subject)", tag) == f"nlproxy {NEW}"
    assert _tag(clone).returncode == 0  # again: the same commit, nothing to do
    # A later commit with the same version: that version is released already.
    (clone / "README.md").write_text((clone / "README.md").read_text() + "\n")
    _git(clone, "commit", "-qam", "later")
    refused = _tag(clone)
    assert refused.returncode == 2
    assert f"already tags commit {head}" in refused.stderr
