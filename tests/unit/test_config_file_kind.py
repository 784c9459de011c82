"""``--config`` must name a regular file: a FIFO would block the daemon's start until some
writer came, a directory or a device is no configuration. Each is one line naming the file
and what it is, exit 2, without waiting; a ConfigMap mount (links to a regular file) works."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from nlproxy.cli import main
from nlproxy.config import load_kube_proxy_config
from tests.configs import KUBEADM_CONFIGMAP

BOUND = 60.0
"""Seconds a refusal may take on a loaded machine before the test calls it blocked."""


def _run(config: Path, manifests: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``nlproxy run --once --config CONFIG`` in a thread; a run still blocked after
    :data:`BOUND` is released (a FIFO is given a writer that closes at once) and failed."""
    result: list[int] = []
    argv = ["run", "--config", str(config), "--manifests", str(manifests), "--once"]
    worker = threading.Thread(target=lambda: result.append(main(argv)), daemon=True)
    worker.start()
    worker.join(BOUND)
    if worker.is_alive():
        if config.is_fifo():  # end the blocked open: a writer that writes nothing
            os.close(os.open(config, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(BOUND)
        pytest.fail(f"reading {config} blocked")
    return result[0], capsys.readouterr().err


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "config.conf"
    os.mkfifo(path)
    return path


def _directory(tmp_path: Path) -> Path:
    path = tmp_path / "config.conf"
    path.mkdir()
    return path


def _device(tmp_path: Path) -> Path:
    path = tmp_path / "config.conf"
    path.symlink_to("/dev/null")  # a link to a character device is the device
    return path


@pytest.mark.parametrize(
    ("make", "what"),
    [
        pytest.param(_fifo, "is a FIFO, not a regular file", id="fifo"),
        pytest.param(_directory, "is a directory, not a regular file", id="directory"),
        pytest.param(_device, "is a character device, not a regular file", id="device"),
    ],
)
def test_a_config_that_is_not_a_regular_file_is_refused_at_once(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    make: Callable[[Path], Path],
    what: str,
) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    path = make(tmp_path)
    code, err = _run(path, manifests, capsys)
    assert code == 2, err
    assert f"config {path}: {what}" in err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_a_configmap_mount_of_links_to_a_regular_file_is_read(tmp_path: Path) -> None:
    # The kubelet's layout: config.conf -> ..data/config.conf, ..data -> a timestamped directory.
    mount = tmp_path / "mount"
    stamped = mount / "..2026_01_01_00_00_00.000000001"
    stamped.mkdir(parents=True)
    (stamped / "config.conf").write_text(
        KUBEADM_CONFIGMAP.replace("clusterCIDR: 10.244.0.0/16", "clusterCIDR: 10.99.0.0/16")
    )
    (mount / "..data").symlink_to(stamped.name)
    (mount / "config.conf").symlink_to("..data/config.conf")
    assert load_kube_proxy_config(mount / "config.conf").cluster_cidr == "10.99.0.0/16"
