"""The OCI image of ``make image``, loaded and run with podman as the DaemonSet runs it: root
with every capability dropped but NET_ADMIN and NET_RAW, in the node's network namespace.
``nlproxy run --once`` inside programs a node the test built (tests/kernel/topo.py), and real
TCP and UDP from a pod reach the Service's endpoints through those rules. containerd imports the
same archive under the name Kubernetes asks for.

podman runs here with runc, not Debian's default crun: this machine mounts cgroups in hybrid
mode (v1 controllers), which crun 1.8 refuses. The limits are given explicitly because podman's
defaults exceed the hard limits this machine grants.
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.topo import PORTS, SLICE_PORTS, answers, ask
from tests.packaging.conftest import ROOT

testbed = topo.testbed

VIP = "10.96.0.10"


def _daemonset_image() -> str:
    docs = yaml.safe_load_all((ROOT / "deploy/kubernetes/daemonset.yaml").read_text())
    (ds,) = [d for d in docs if d and d.get("kind") == "DaemonSet"]
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    return str(container["image"])


def test_the_daemonset_names_this_version() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert _daemonset_image() == f"nlproxy:{version}"


@pytest.fixture(scope="module")
def podman(built: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """A podman command line with its own image store (nothing left in the machine's), the
    archive loaded into it."""
    store = tmp_path_factory.mktemp("podman")
    cmd = ["podman", "--runtime", "runc", "--root", str(store / "root"),
           "--runroot", str(store / "run"), "--storage-driver", "overlay"]  # fmt: skip
    loaded = subprocess.run(
        [*cmd, "load", "-i", str(built["archive"])], capture_output=True, text=True, check=False
    )
    assert loaded.returncode == 0, loaded.stderr
    # Kubernetes resolves the DaemonSet's short name to the docker.io/library name.
    assert f"Loaded image: docker.io/library/{_daemonset_image()}" in loaded.stdout
    yield cmd
    subprocess.run([*cmd, "rmi", "--all", "--force"], capture_output=True, check=False)
    shutil.rmtree(store, ignore_errors=True)


def test_image_programs_a_node_and_traffic_flows(
    podman: list[str], testbed: Testbed, tmp_path: Path
) -> None:
    eps = [topo.endpoint(str(testbed.pod(p).ipv4), testbed.pod(p).node) for p in ("pod-b", "pod-r")]
    manifests = topo.write_manifests(
        tmp_path / "manifests",
        [
            testbed.node_manifest(),
            topo.service("web", VIP, PORTS),
            topo.endpoint_slice("web", eps, SLICE_PORTS),
        ],
    )
    nofile = min(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    run = subprocess.run(
        [*podman, "run", "--rm", "--network", f"ns:/run/netns/{testbed.node.netns}",
         "--cap-drop=all", "--cap-add=NET_ADMIN,NET_RAW",
         f"--ulimit=nofile={nofile}:{nofile}", "--ulimit=nproc=4096:4096",
         "--volume", f"{manifests}:/manifests:ro", _daemonset_image(),
         # The shipped configuration file, with the flags a manifests-driven node needs.
         "nlproxy", "--log-format", "json", "run", "--config", "/etc/nlproxy/config.yaml",
         "--manifests", "/manifests", "--node-name", testbed.node.name,
         "--cluster-cidr", testbed.cluster_cidr(), "--service-cidr", testbed.service_cidr(),
         "--once"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert '"event": "sync.applied"' in run.stdout + run.stderr
    a = testbed.pod("pod-a")
    for proto, port in (("tcp", 80), ("udp", 53)):
        assert answers(ask(proto, a.netns, VIP, port)) == {
            "pod-b": {str(a.ipv4)},
            "pod-r": {str(a.ipv4)},
        }, proto


def test_containerd_imports_it_under_the_daemonsets_name(
    built: dict[str, Path], tmp_path: Path
) -> None:
    """``ctr images import`` (what a containerd node uses), with a containerd of the test's own:
    its own root, state and socket, the CRI plugin off, stopped at the end."""
    sock = tmp_path / "sock"
    config = tmp_path / "config.toml"
    config.write_text(
        f'version = 2\nroot = "{tmp_path / "root"}"\nstate = "{tmp_path / "state"}"\n'
        f'[grpc]\n  address = "{sock}"\n'
        '[plugins."io.containerd.grpc.v1.cri"]\n  disable = true\n'
    )
    log = (tmp_path / "containerd.log").open("w")
    daemon = subprocess.Popen(["containerd", "--config", str(config)], stdout=log, stderr=log)
    try:
        ctr = ["ctr", "--address", str(sock)]
        for _ in range(100):
            if subprocess.run([*ctr, "version"], capture_output=True, check=False).returncode == 0:
                break
            time.sleep(0.1)
        imported = subprocess.run(
            [*ctr, "images", "import", str(built["archive"])],
            capture_output=True,
            text=True,
            check=False,
        )
        assert imported.returncode == 0, imported.stderr
        names = subprocess.run(
            [*ctr, "images", "ls", "-q"], capture_output=True, text=True, check=True
        ).stdout.split()
        assert names == [f"docker.io/library/{_daemonset_image()}"]
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        log.close()
