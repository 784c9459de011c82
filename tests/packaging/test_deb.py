"""The Debian package: what it holds (dpkg-deb), and that it installs into a Debian bookworm root
filesystem and runs there (the one ``make image`` builds; the image test sends traffic)."""

from __future__ import annotations

import gzip
import re
import subprocess
import tomllib
from pathlib import Path

from tests.packaging.conftest import ROOT

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _deb(*args: str) -> str:
    return subprocess.run(["dpkg-deb", *args], capture_output=True, text=True, check=True).stdout


def _chroot(rootfs: Path, *cmd: str) -> str:
    proc = subprocess.run(["chroot", rootfs, *cmd], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)}: {proc.stderr}"
    return proc.stdout


def test_control_fields(deb: Path) -> None:
    assert _deb("--field", str(deb), "Package", "Version").split() == [
        "Package:", "nlproxy", "Version:", f"{VERSION}-1"
    ]  # fmt: skip
    depends = {d.strip() for d in _deb("--field", str(deb), "Depends").split(",")}
    assert {"python3 (>= 3.11)", "libnftnl11", "libmnl0"} <= depends
    conffiles = subprocess.run(
        ["dpkg-deb", "--info", str(deb), "conffiles"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert conffiles == [
        "/etc/default/nlproxy",
        "/etc/nlproxy/config.yaml",
        "/etc/sysctl.d/90-nlproxy-conntrack.conf",
    ]


def test_contents(deb: Path) -> None:
    listing = _deb("--contents", str(deb))
    paths = {line.split()[5].removeprefix(".") for line in listing.splitlines()}
    owners = {line.split()[1] for line in listing.splitlines()}
    assert owners == {"root/root"}
    assert {
        "/opt/nlproxy/bin/nlproxy",
        "/opt/nlproxy/pyvenv.cfg",
        "/usr/bin/nlproxy",
        "/lib/systemd/system/nlproxy.service",
        "/usr/lib/sysusers.d/nlproxy.conf",
        "/etc/nlproxy/config.yaml",
        "/etc/default/nlproxy",
        "/etc/sysctl.d/90-nlproxy-conntrack.conf",
        "/usr/share/doc/nlproxy/copyright",
        "/opt/nlproxy/share/nlproxy/examples/demo/service.yaml",
    } <= paths
    assert any(p.endswith(".so") and "/nlproxy/_nftshim" in p for p in paths), "the native shim"


def test_installed_into_debian(built: dict[str, Path]) -> None:
    rootfs = built["rootfs"]
    status = _chroot(rootfs, "dpkg-query", "-W", "-f", "${Status} ${Version}", "nlproxy")
    assert status == f"install ok installed {VERSION}-1"
    # The one copy of the unit, as shipped; the package's own files unchanged.
    unit = rootfs / "lib/systemd/system/nlproxy.service"
    assert unit.read_text() == (ROOT / "deploy/systemd/nlproxy.service").read_text()
    assert "ExecStart=/opt/nlproxy/bin/nlproxy " in unit.read_text()
    sysctl = rootfs / "etc/sysctl.d/90-nlproxy-conntrack.conf"
    assert sysctl.read_text() == (ROOT / "deploy/sysctl/90-nlproxy-conntrack.conf").read_text()
    # postinst made the user the unit runs as, from the sysusers.d entry's fields.
    user = _chroot(rootfs, "getent", "passwd", "nlproxy").strip().split(":")
    assert (user[0], user[5], user[6]) == ("nlproxy", "/nonexistent", "/usr/sbin/nologin")
    sysusers = (rootfs / "usr/lib/sysusers.d/nlproxy.conf").read_text()
    assert (
        'u nlproxy - "nlproxy Kubernetes service proxy" /nonexistent /usr/sbin/nologin' in sysusers
    )
    # Debian's python3 runs it: the venv, the shim against Debian's libnftnl, the console script.
    assert _chroot(rootfs, "nlproxy", "version").startswith(f"nlproxy {VERSION} (libnftnl ")
    cfg = (rootfs / "opt/nlproxy/pyvenv.cfg").read_text()
    assert "executable = /usr/bin/python3.11" in cfg


def test_what_debian_tools_expect(deb: Path, built: dict[str, Path]) -> None:
    """md5sums (``dpkg --verify`` reads them), changelogs, a Homepage that is a web address or
    none, and no file:// one."""
    control = subprocess.run(
        ["dpkg-deb", "--info", str(deb), "md5sums"], capture_output=True, text=True, check=True
    ).stdout
    assert " opt/nlproxy/bin/nlproxy\n" in control
    assert " usr/share/doc/nlproxy/copyright\n" in control
    verify = subprocess.run(
        ["dpkg", f"--root={built['rootfs']}", "--verify", "nlproxy"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert (verify.returncode, verify.stdout) == (0, ""), verify.stdout + verify.stderr
    homepage = _deb("--field", str(deb), "Homepage").strip()
    assert homepage == "" or homepage.startswith("https://"), homepage
    doc = built["rootfs"] / "usr/share/doc/nlproxy"
    changelog = gzip.decompress((doc / "changelog.Debian.gz").read_bytes()).decode()
    assert changelog.startswith(f"nlproxy ({VERSION}-1) bookworm; urgency=medium\n")
    assert re.search(r"\n -- .+ <.+>  \w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d \+0000\n$", changelog)
    upstream = gzip.decompress((doc / "changelog.gz").read_bytes()).decode()
    assert upstream == (ROOT / "CHANGELOG.md").read_text()


def test_only_nlproxy_in_its_bin_and_the_docs_beside_the_readme(deb: Path) -> None:
    listing = _deb("--contents", str(deb))
    paths = {line.split()[5].removeprefix(".") for line in listing.splitlines()}
    scripts = {
        p.removeprefix("/opt/nlproxy/bin/") for p in paths if p.startswith("/opt/nlproxy/bin/")
    }
    assert scripts - {""} == {"nlproxy", "python", "python3", "python3.11"}
    # README.md's links (docs/*.md) resolve beside it.
    shipped = {p.removeprefix("/usr/share/doc/nlproxy/") for p in paths}
    for linked in sorted(
        set(re.findall(r"\(?`?(docs/[\w-]+\.md)", (ROOT / "README.md").read_text()))
    ):
        assert linked in shipped, linked
    assert {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} <= shipped
