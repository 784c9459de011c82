"""The nodes run nlproxy as installed from its Debian package (make deb), nothing provisioned
beside it: dpkg owns the binary and the unit systemd loaded, and the user came from postinst."""

from __future__ import annotations

import tomllib

import cluster
import pytest
from conftest import REPO, Vms

NODES = [n.name for n in cluster.nodes()]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


@pytest.mark.parametrize("node", NODES)
def test_nlproxy_comes_from_its_package(vms: Vms, node: str) -> None:
    status = vms.out(node, "dpkg-query -W -f '${Status} ${Version}' nlproxy")
    assert status == f"install ok installed {VERSION}-1"
    unit = vms.out(node, "systemctl show -p FragmentPath --value nlproxy.service")
    # The package's (/lib and /usr/lib are one directory on bookworm), not a copy in /etc.
    assert unit.endswith("/lib/systemd/system/nlproxy.service"), unit
    # dpkg -S names the package owning each path: the unit systemd runs and the binary it starts.
    paths = "/lib/systemd/system/nlproxy.service /opt/nlproxy/bin/nlproxy"
    owners = vms.out(node, f"dpkg -S {paths} /usr/lib/sysusers.d/nlproxy.conf")
    assert [line.split(":", 1)[0] for line in owners.splitlines()] == ["nlproxy"] * 3
    assert vms.out(node, "getent passwd nlproxy").split(":")[6] == "/usr/sbin/nologin"
