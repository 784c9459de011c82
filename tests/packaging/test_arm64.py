"""arm64: ``make deb image ARCH=arm64`` on this (amd64) machine, from PyPI's aarch64 wheels (the
lock's hashes) and Debian's arm64 archive only. What is checked: the .deb's fields, that every
compiled file in it is aarch64 code (the libnftnl shim, cross-compiled, and the dependencies'
extensions) linked against what its Depends bring, that one commit gives one arm64 .deb, and that
the arm64 programs run: the .deb installed into Debian's arm64 root file system (the image's)
runs ``nlproxy version`` under qemu-user (binfmt_misc), and the image loads and runs under podman.

qemu-user translates only a few netlink families and refuses nftables' (NETLINK_NETFILTER: "Protocol
not supported"), so ``rules`` and ``run --once`` run in an arm64 VM: Debian's arm64 kernel under
qemu-system-aarch64 (software CPU), the image's root file system as its root
(vm-tests/arm64/boot.sh).
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.packaging.conftest import ROOT
from tests.packaging.test_supply_chain import RUNTIME

ARCH = "arm64"
EM_AARCH64 = 183
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _build(script: str, out: Path, *args: str) -> list[str]:
    proc = subprocess.run(
        ["bash", str(ROOT / "packaging" / script), str(out), *args],
        capture_output=True, text=True, check=False, env={**os.environ, "NLPROXY_ARCH": ARCH},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.split()


@pytest.fixture(scope="session")
def deb_arm64(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("deb-arm64")
    [deb] = _build("build-deb.sh", out)[-1:]
    assert Path(deb).name == f"nlproxy_{VERSION}-1_{ARCH}.deb"
    return Path(deb)


@pytest.fixture(scope="session")
def image_arm64(deb_arm64: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("image-arm64")
    archive, _digest = _build("build-image.sh", out, str(deb_arm64))[-2:]
    assert Path(archive).name == f"nlproxy_{VERSION}_{ARCH}.oci.tar"
    return {"archive": Path(archive), "rootfs": ROOT / "build/image" / ARCH / "rootfs"}


def _field(deb: Path, name: str) -> str:
    return subprocess.run(
        ["dpkg-deb", "--field", str(deb), name], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_control_fields(deb_arm64: Path) -> None:
    assert _field(deb_arm64, "Architecture") == ARCH
    assert _field(deb_arm64, "Version") == f"{VERSION}-1"
    # The same Debian packages as on amd64: apt takes the arm64 ones on an arm64 node.
    control = (ROOT / "packaging/deb/control").read_text()
    [depends] = re.findall(r"^Depends: (.*)$", control, re.M)
    assert _field(deb_arm64, "Depends") == depends


def _elves(root: Path) -> dict[Path, tuple[int, int]]:
    """Every ELF file under ``root``: (class, machine)."""
    found = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            with path.open("rb") as f:
                head = f.read(20)
            if head[:4] == b"\x7fELF":
                found[path] = (head[4], int.from_bytes(head[18:20], "little"))
    return found


def _needed(path: Path) -> set[str]:
    dynamic = subprocess.run(
        ["readelf", "-d", str(path)], capture_output=True, text=True, check=True
    ).stdout
    return set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic))


def test_every_compiled_file_is_aarch64(deb_arm64: Path, tmp_path: Path) -> None:
    subprocess.run(["dpkg-deb", "-x", str(deb_arm64), str(tmp_path)], check=True)
    elves = _elves(tmp_path)
    site = next((tmp_path / "opt/nlproxy/lib").glob("python3.*/site-packages"))
    [shim] = list((site / "nlproxy").glob("_nftshim*.so"))
    assert shim in elves
    wrong = {str(p.relative_to(tmp_path)): m for p, m in elves.items() if m != (2, EM_AARCH64)}
    assert wrong == {}, "not 64-bit aarch64 code"
    # The compiled dependencies came as aarch64 wheels too: pydantic-core's, pyyaml's, ...
    assert len(elves) >= 10, sorted(map(str, elves))
    # The shim links Debian's libnftnl and libmnl, which the package's Depends bring.
    assert {"libnftnl.so.11", "libmnl.so.0", "libc.so.6"} <= _needed(shim)
    depends = _field(deb_arm64, "Depends")
    assert "libnftnl11" in depends
    assert "libmnl0" in depends


def test_the_sbom_names_the_locked_aarch64_wheels(deb_arm64: Path, tmp_path: Path) -> None:
    subprocess.run(["dpkg-deb", "-x", str(deb_arm64), str(tmp_path)], check=True)
    sbom = json.loads((tmp_path / "usr/share/doc/nlproxy/sbom.cdx.json").read_text())
    components = {c["purl"]: c for c in sbom["components"]}
    assert set(components) == {f"pkg:pypi/{n}@{v}" for n, (v, _) in RUNTIME.items()}
    for name, (version, hashes) in RUNTIME.items():
        [digest] = components[f"pkg:pypi/{name}@{version}"]["hashes"]
        assert digest["content"] in hashes, name


def test_one_commit_gives_one_arm64_deb(deb_arm64: Path, tmp_path: Path) -> None:
    [again] = _build("build-deb.sh", tmp_path)[-1:]
    assert Path(again).read_bytes() == deb_arm64.read_bytes()


def _chroot(rootfs: Path, *cmd: str) -> str:
    proc = subprocess.run(["chroot", str(rootfs), *cmd], capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def test_runs_under_qemu_user(image_arm64: dict[str, Path]) -> None:
    """The .deb as dpkg installed it into Debian's arm64 root file system, run through
    qemu-user-static: the interpreter is aarch64, the shim loads against Debian's arm64
    libnftnl, and the build's stamp is there."""
    rootfs = image_arm64["rootfs"]
    status = _chroot(rootfs, "dpkg-query", "-W", "-f", "${Status} ${Version}", "nlproxy")
    assert status == f"install ok installed {VERSION}-1"
    assert _chroot(rootfs, "dpkg", "--print-architecture").strip() == ARCH
    probe = (
        "import json, platform; import nlproxy._nftshim as s; "
        "from nlproxy.serve.metrics import build_info; "
        "print(json.dumps([platform.machine(), s.__file__, build_info()]))"
    )
    machine, shim, info = json.loads(_chroot(rootfs, "/opt/nlproxy/bin/python", "-c", probe))
    assert machine == "aarch64"
    assert shim.startswith("/opt/nlproxy/lib/python3.11/site-packages/nlproxy/_nftshim")
    assert info["platform"] == "linux/arm64"
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert info["git_commit"] == head
    assert _chroot(rootfs, "nlproxy", "version").startswith(f"nlproxy {VERSION} (libnftnl 1.")


def _image(archive: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The index's manifest entry and the image config."""
    with tarfile.open(archive) as tar:

        def load(name: str) -> dict[str, Any]:
            f = tar.extractfile(name)
            assert f is not None
            doc: dict[str, Any] = json.load(f)
            return doc

        [entry] = load("index.json")["manifests"]
        manifest = load(f"blobs/sha256/{entry['digest'].removeprefix('sha256:')}")
        config = load(f"blobs/sha256/{manifest['config']['digest'].removeprefix('sha256:')}")
        return entry, config


def test_the_image_is_arm64_and_runs(
    image_arm64: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    entry, config = _image(image_arm64["archive"])
    assert entry["platform"] == {"architecture": "arm64", "os": "linux", "variant": "v8"}
    assert (config["architecture"], config["os"], config["variant"]) == ("arm64", "linux", "v8")
    assert config["config"]["Labels"]["org.opencontainers.image.version"] == VERSION
    store = tmp_path_factory.mktemp("podman")  # short: podman refuses a long runroot
    # podman's default limits exceed the hard limits this machine grants (test_image.py).
    nofile = min(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    limits = [f"--ulimit=nofile={nofile}:{nofile}", "--ulimit=nproc=4096:4096"]
    cmd = ["podman", "--runtime", "runc", "--root", str(store / "root"),
           "--runroot", str(store / "run"), "--storage-driver", "overlay"]  # fmt: skip
    try:
        loaded = subprocess.run(
            [*cmd, "load", "-i", str(image_arm64["archive"])], capture_output=True, text=True
        )
        assert loaded.returncode == 0, loaded.stderr
        run = subprocess.run(
            [*cmd, "run", "--rm", "--network", "none", "--arch", "arm64", *limits,
             f"nlproxy:{VERSION}", "nlproxy", "version", "--json"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout)["nlproxy"] == VERSION
        uname = subprocess.run(
            [*cmd, "run", "--rm", "--network", "none", "--arch", "arm64", *limits,
             f"nlproxy:{VERSION}", "uname", "-m"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert uname.stdout.strip() == "aarch64", uname.stderr
    finally:
        subprocess.run([*cmd, "rmi", "--all", "--force"], capture_output=True, check=False)
        shutil.rmtree(store, ignore_errors=True)


def _demo(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples/demo" / name).read_text())
    return doc


def test_version_rules_and_run_once_in_an_arm64_vm(
    image_arm64: dict[str, Path], tmp_path: Path
) -> None:
    """The arm64 root with nlproxy installed, booted by Debian's arm64 kernel: ``run --once``
    programs the demo's Service through nftables (the kernel's modules loaded on first use),
    and ``rules`` reads it back."""
    demo = "/opt/nlproxy/share/nlproxy/examples/demo"
    script = tmp_path / "script.sh"
    script.write_text(
        "nlproxy version\n"
        'echo "== version exit $?"\n'
        f"nlproxy --log-format json run --manifests {demo} --node-name node1"
        " --cluster-cidr 10.244.0.0/16 --service-cidr 10.96.0.0/12 --once\n"
        'echo "== run exit $?"\n'
        "nlproxy rules\n"
        'echo "== rules exit $?"\n'
    )
    log = tmp_path / "console.log"
    boot = subprocess.run(
        ["bash", str(ROOT / "vm-tests/arm64/boot.sh"), str(image_arm64["rootfs"]), str(script),
         str(log)],
        capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    console = log.read_text(errors="replace").replace("\r\n", "\n")
    assert boot.returncode == 0, boot.stderr + console[-4000:]
    assert "== arm64 VM up: aarch64 " in console
    assert f"\nnlproxy {VERSION} (libnftnl 1." in console
    for step in ("version", "run", "rules", "script"):
        assert f"== {step} exit 0\n" in console, console[-4000:]
    applied = [
        json.loads(line[line.index("{") :])
        for line in console.splitlines()
        if '"event": "sync.applied"' in line
    ]
    assert len(applied) == 1
    assert applied[0]["ops"] > 0
    assert applied[0]["invalid"] == 0
    rules = console.split("== run exit 0\n", 1)[1].split("== rules exit", 1)[0]
    assert _demo("service.yaml")["spec"]["clusterIP"] in rules
    addresses = [a for e in _demo("endpointslice.yaml")["endpoints"] for a in e["addresses"]]
    assert addresses
    for address in addresses:
        assert address in rules, address
