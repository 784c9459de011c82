"""The supply chain of ``make deb`` and ``make image``: the lock files pin every Python package
with its hashes, the .deb holds exactly those pins and says so in its SBOM, the image carries
its labels and its SBOM, one commit gives one .deb and one image digest, and ``make image``
leaves an up-to-date .deb alone."""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.packaging.conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) \\$")
HASH = re.compile(r"^\s+--hash=sha256:([0-9a-f]{64})")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock(path: Path) -> dict[str, tuple[str, set[str]]]:
    """A pip-compile lock: name -> (version, sha256 hashes)."""
    pins: dict[str, tuple[str, set[str]]] = {}
    name = ""
    for line in path.read_text().splitlines():
        if m := PIN.match(line):
            name = normalize(m.group(1))
            pins[name] = (m.group(2), set())
        elif (h := HASH.match(line)) and name:
            pins[name][1].add(h.group(1))
    return pins


RUNTIME = lock(ROOT / "packaging/requirements.lock")
BUILD = lock(ROOT / "packaging/build-requirements.lock")


@pytest.mark.parametrize(
    ("pins", "wanted"),
    [(RUNTIME, PYPROJECT["project"]["dependencies"]),
     (BUILD, PYPROJECT["build-system"]["requires"])],
    ids=["runtime", "build"],
)  # fmt: skip
def test_the_locks_pin_what_pyproject_asks_with_hashes(
    pins: dict[str, tuple[str, set[str]]], wanted: list[str]
) -> None:
    assert pins
    for spec in wanted:
        req = Requirement(spec)
        name = normalize(req.name)
        assert name in pins, f"{name} is not locked (make lock)"
        assert Version(pins[name][0]) in req.specifier, (spec, pins[name][0])
    for name, (_, hashes) in pins.items():
        assert hashes, f"{name} has no hash"


def _installed(deb: Path) -> dict[str, str]:
    """The Python distributions in the .deb's /opt/nlproxy: name -> version."""
    listing = subprocess.run(
        ["dpkg-deb", "--contents", str(deb)], capture_output=True, text=True, check=True
    ).stdout
    found = {}
    for m in re.finditer(r"site-packages/([^/\s]+)-([^-/\s]+)\.dist-info/\s", listing):
        found[normalize(m.group(1))] = m.group(2)
    return found


def test_the_deb_holds_exactly_the_locked_packages(deb: Path) -> None:
    assert _installed(deb) == {
        "nlproxy": VERSION,
        **{name: version for name, (version, _) in RUNTIME.items()},
    }


def _extract(deb: Path, member: str, tmp_path: Path) -> Path:
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True)
    return tmp_path / member


def _components(sbom: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["purl"]: c for c in sbom["components"]}


def test_the_debs_sbom_names_each_package_and_the_wheel_it_came_from(
    deb: Path, tmp_path: Path
) -> None:
    sbom = json.loads(_extract(deb, "usr/share/doc/nlproxy/sbom.cdx.json", tmp_path).read_text())
    assert (sbom["bomFormat"], sbom["specVersion"]) == ("CycloneDX", "1.5")
    assert sbom["metadata"]["component"]["purl"] == f"pkg:pypi/nlproxy@{VERSION}"
    components = _components(sbom)
    assert set(components) == {f"pkg:pypi/{n}@{v}" for n, (v, _) in RUNTIME.items()}
    for name, (version, hashes) in RUNTIME.items():
        comp = components[f"pkg:pypi/{name}@{version}"]
        [digest] = comp["hashes"]
        assert digest["content"] in hashes, name  # the wheel installed is one the lock allows
    # nlproxy's own dependencies, as the graph's root.
    [root] = [d for d in sbom["dependencies"] if d["ref"] == f"pkg:pypi/nlproxy@{VERSION}"]
    assert f"pkg:pypi/kubernetes@{RUNTIME['kubernetes'][0]}" in root["dependsOn"]


def _image(archive: Path) -> tuple[str, dict[str, Any]]:
    """The image's manifest digest and its config."""
    with tarfile.open(archive) as tar:

        def blob(digest: str) -> dict[str, Any]:
            f = tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            assert f is not None
            doc: dict[str, Any] = json.load(f)
            return doc

        index_file = tar.extractfile("index.json")
        assert index_file is not None
        [entry] = json.load(index_file)["manifests"]
        manifest = blob(entry["digest"])
        return str(entry["digest"]), blob(manifest["config"]["digest"])


def _meta(name: str, root: Path = ROOT, **env: str) -> str:
    """A value packaging/meta.sh sets for the checkout ``root``."""
    out = subprocess.run(
        ["bash", "-c", f'root={root}; . "{ROOT}/packaging/meta.sh"; echo "${name}"'],
        capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin", **env},
    )  # fmt: skip
    return out.stdout.strip()


def test_the_image_carries_its_labels(built: dict[str, Path]) -> None:
    _, config = _image(built["archive"])
    labels = config["config"]["Labels"]
    epoch = int(_meta("SOURCE_DATE_EPOCH"))
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.revision"] == _meta("revision")
    assert labels["org.opencontainers.image.revision"].startswith(
        subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                       text=True, check=True).stdout.strip()
    )  # fmt: skip
    assert labels["org.opencontainers.image.created"] == created == config["created"]
    assert labels["org.opencontainers.image.licenses"] == PYPROJECT["project"]["license"]
    assert labels["org.opencontainers.image.title"] == "nlproxy"
    source = _meta("source_url")
    assert labels.get("org.opencontainers.image.source", "") == source


def test_source_url_comes_from_the_origin_remote(tmp_path: Path) -> None:
    """The image's source label and the .deb's Homepage: the origin remote as https, the
    environment's ``NLPROXY_SOURCE_URL`` first, nothing for a remote that is not a web address."""
    repo = tmp_path / "clone"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    git = ["git", "-C", str(repo)]
    for remote, want in (
        ("git@git.example.org:team/nlproxy.git", "https://git.example.org/team/nlproxy"),
        ("https://git.example.org/team/nlproxy.git", "https://git.example.org/team/nlproxy"),
        ("/srv/git/nlproxy", ""),
    ):
        subprocess.run([*git, "remote", "remove", "origin"], capture_output=True, check=False)
        subprocess.run([*git, "remote", "add", "origin", remote], check=True)
        assert _meta("source_url", repo) == want, remote
    assert _meta("source_url", repo, NLPROXY_SOURCE_URL="https://x.example/n") == (
        "https://x.example/n"
    )


def test_the_image_carries_an_sbom_with_its_debian_packages(built: dict[str, Path]) -> None:
    beside = built["archive"].parent / f"nlproxy_{VERSION}.sbom.cdx.json"
    inside = built["rootfs"] / "usr/share/doc/nlproxy/image.sbom.cdx.json"
    assert beside.read_bytes() == inside.read_bytes()
    names = {(c["purl"].split("/")[0], c["name"]) for c in json.loads(beside.read_text())[
        "components"]}  # fmt: skip
    assert {("pkg:deb", "python3.11"), ("pkg:deb", "libnftnl11"), ("pkg:deb", "nlproxy"),
            ("pkg:pypi", "kubernetes"), ("pkg:pypi", "pyroute2")} <= names  # fmt: skip


def _build(script: str, *args: str) -> list[str]:
    proc = subprocess.run(
        ["bash", str(ROOT / "packaging" / script), *args], capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.split()


def test_one_commit_gives_one_deb_and_one_image_digest(
    deb: Path, built: dict[str, Path], tmp_path: Path
) -> None:
    """A second ``make deb`` and ``make image`` of the same checkout, into other directories,
    give the same .deb, byte for byte, and the same image digest."""
    [again] = _build("build-deb.sh", str(tmp_path / "deb"))
    assert Path(again).read_bytes() == deb.read_bytes()
    archive, digest = _build("build-image.sh", str(tmp_path / "image"), again)
    assert digest == _image(built["archive"])[0] == _image(Path(archive))[0]
    assert Path(archive).read_bytes() == built["archive"].read_bytes()


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-C", str(ROOT), *args], capture_output=True, text=True, check=False
    )


def test_make_image_reuses_an_up_to_date_deb(deb: Path) -> None:
    """``make image`` builds the .deb only when one of its inputs is newer (make's own view,
    asked with -q and -n: nothing is built here)."""
    dist = f"DIST={deb.parent}"
    assert _make("-q", dist, str(deb)).returncode == 0  # up to date
    plan = _make("-n", dist, "image").stdout
    assert "build-image.sh" in plan
    assert "build-deb.sh" not in plan
    # A source newer than the .deb (-W: as if just changed): the .deb is built first.
    newer = ("-W", "nlproxy/__main__.py", dist)
    assert _make("-q", *newer, str(deb)).returncode == 1
    plan = _make("-n", *newer, "image").stdout
    assert plan.index("build-deb.sh") < plan.index("build-image.sh")
