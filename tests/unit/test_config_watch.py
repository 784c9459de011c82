"""A changed ``--config`` file as the daemon would see it: a ConfigMap's symlink swap noticed,
each changed setting named with its old and new value, an invalid file keeping the settings
that run, and a changed bind address asking for a restart."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from nlproxy.config import Flags, build_settings
from nlproxy.config.watch import ConfigWatcher, Reload
from tests.configs import KUBEADM_CONFIGMAP


class ConfigMapVolume:
    """A directory laid out as the kubelet mounts a ConfigMap: ``config.conf`` →
    ``..data/config.conf``, ``..data`` → a timestamped directory, swapped on each update."""

    def __init__(self, root: Path, text: str) -> None:
        self.root = root
        self.version = 0
        self.update(text)
        (root / "config.conf").symlink_to("..data/config.conf")

    @property
    def path(self) -> Path:
        return self.root / "config.conf"

    def update(self, text: str) -> None:
        self.version += 1
        data = self.root / f"..2026_11_28_12_00_{self.version:02d}"
        data.mkdir()
        (data / "config.conf").write_text(text)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(data.name)
        os.replace(tmp, self.root / "..data")  # the kubelet's atomic swap


def _text(**fields: str) -> str:
    text = KUBEADM_CONFIGMAP
    for old, new in fields.items():
        text = text.replace(old, new)
    return text


MASQ_ON = {"nftables:\n  masqueradeAll: false": "nftables:\n  masqueradeAll: true"}


@pytest.fixture
def volume(tmp_path: Path) -> ConfigMapVolume:
    return ConfigMapVolume(tmp_path, KUBEADM_CONFIGMAP)


def _watcher(volume: ConfigMapVolume, **flags: object) -> ConfigWatcher:
    f = Flags(config=volume.path, node_name="n1", **flags)  # type: ignore[arg-type]
    return ConfigWatcher(f, build_settings(f))


def test_a_configmap_swap_is_noticed_with_each_change(volume: ConfigMapVolume) -> None:
    watcher = _watcher(volume)
    assert watcher.check() is None  # nothing changed yet
    volume.update(_text(**MASQ_ON))
    reload = watcher.check()
    assert reload is not None
    assert reload.error is None
    # One setting, one change: the planner's copy of it is not named again.
    assert [str(c) for c in reload.changes] == ["daemon.masquerade_all: False -> True"]
    assert reload.restart == ()
    assert reload.settings.proxy.masquerade_all is True
    assert watcher.settings is reload.settings
    assert watcher.check() is None  # seen once


def test_an_invalid_file_keeps_the_running_settings_and_says_why(volume: ConfigMapVolume) -> None:
    watcher = _watcher(volume)
    running = watcher.settings
    volume.update(_text(**{'mode: "nftables"': "mode: userspace"}))
    reload = watcher.check()
    assert reload is not None
    assert reload.error is not None
    assert "mode: 'userspace'" in reload.error
    assert reload.settings is running
    assert watcher.settings is running
    assert watcher.check() is None  # not read again until it changes
    volume.update(_text(**MASQ_ON))
    fixed = watcher.check()
    assert fixed is not None
    assert fixed.error is None
    assert fixed.settings.daemon.masquerade_all is True


def test_a_bind_address_change_asks_for_a_restart(volume: ConfigMapVolume) -> None:
    watcher = _watcher(volume)
    running = watcher.settings
    volume.update(_text(**{'metricsBindAddress: ""': "metricsBindAddress: 0.0.0.0:10249"}))
    reload = watcher.check()
    assert reload is not None
    assert [c.name for c in reload.restart] == ["daemon.metrics_bind_address"]
    assert watcher.settings is running  # not applied: the daemon exits instead


def test_a_flag_still_overrides_the_new_file(volume: ConfigMapVolume) -> None:
    watcher = _watcher(volume, masquerade_all=False)
    volume.update(_text(**MASQ_ON))
    reload = watcher.check()
    assert reload is not None
    assert reload.changes == ()


def test_an_edit_in_place_is_noticed_and_a_missing_file_waited_for(tmp_path: Path) -> None:
    path = tmp_path / "kube-proxy.conf"
    path.write_text(KUBEADM_CONFIGMAP)
    f = Flags(config=path, node_name="n1")
    watcher = ConfigWatcher(f, build_settings(f))
    path.unlink()
    assert watcher.check() is None  # mid-update: the old settings stay
    path.write_text(
        _text(
            **{
                "minSyncPeriod: 0s\n  syncPeriod: 0s\nnodePort": (
                    "minSyncPeriod: 2s\n  syncPeriod: 0s\nnodePort"
                )
            }
        )
    )
    reload = watcher.check()
    assert reload is not None
    assert [str(c) for c in reload.changes] == ["daemon.min_sync_period: 0.1 -> 2.0"]


def test_a_fifo_swapped_in_is_refused_without_blocking(volume: ConfigMapVolume) -> None:
    watcher = _watcher(volume)
    before = watcher.settings
    data = volume.root / "..2026_11_28_12_00_99"
    data.mkdir()
    os.mkfifo(data / "config.conf")  # no writer: an open for reading would wait for one
    tmp = volume.root / "..data_tmp"
    tmp.symlink_to(data.name)
    os.replace(tmp, volume.root / "..data")
    result: list[Reload | None] = []
    worker = threading.Thread(target=lambda: result.append(watcher.check()), daemon=True)
    worker.start()
    worker.join(60.0)  # generous: a refusal is a stat and an open
    if worker.is_alive():  # release the blocked open with a writer that writes nothing
        os.close(os.open(data / "config.conf", os.O_WRONLY | os.O_NONBLOCK))
        worker.join(60.0)
        pytest.fail("reading the FIFO blocked")
    [reload] = result
    assert reload is not None
    assert reload.error is not None
    assert "is a FIFO, not a regular file" in reload.error
    assert watcher.settings == before


@pytest.mark.parametrize(
    ("edit", "names"),
    [
        pytest.param({"clusterCIDR: 10.244.0.0/16": "clusterCIDR: 10.8.0.0/16"},
                     ["daemon.cluster_cidr", "proxy.cluster_cidrs"], id="cluster-cidr"),
        pytest.param({'detectLocalMode: ""': "detectLocalMode: InterfaceNamePrefix\n"
                      "detectLocal:\n  interfaceNamePrefix: veth"},
                     ["daemon.detect_local_mode", "daemon.pod_interface_name_prefix",
                      "proxy.detect_local", "proxy.pod_interface"], id="detect-local"),
        pytest.param({"nodePortAddresses: null": "nodePortAddresses: [10.0.0.0/8]"},
                     ["daemon.nodeport_addresses", "proxy.nodeport_addresses"], id="nodeports"),
        pytest.param({"  minSyncPeriod: 0s\n  syncPeriod: 0s\nnodePortAddresses":
                      "  minSyncPeriod: 2s\n  syncPeriod: 45s\nnodePortAddresses"},
                     ["daemon.min_sync_period", "daemon.sync_period"], id="sync-periods"),
        pytest.param({"  min: null": "  min: 262144"}, ["daemon.conntrack"], id="conntrack"),
        pytest.param({"bindAddress: 0.0.0.0\n": "bindAddress: 192.0.2.7\n"},
                     ["daemon.node_ip", "proxy.node_ips"], id="node-ip"),
    ],
)  # fmt: skip
def test_what_the_running_daemon_can_change_is_applied_in_place(
    volume: ConfigMapVolume, edit: dict[str, str], names: list[str]
) -> None:
    watcher = _watcher(volume)
    volume.update(_text(**edit))
    reload = watcher.check()
    assert reload is not None
    assert reload.error is None, reload.error
    assert [c.name for c in reload.changes] == names
    assert reload.restart == ()
    assert watcher.settings is reload.settings  # the new settings are the running ones


@pytest.mark.parametrize(
    ("edit", "name"),
    [
        pytest.param({'healthzBindAddress: ""': "healthzBindAddress: 0.0.0.0:10266"},
                     "daemon.healthz_bind_address", id="healthz-bind"),
        pytest.param({"  qps: 0": "  qps: 50"}, "daemon.kube_api_qps", id="client-qps"),
        pytest.param({"  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf":
                      "  kubeconfig: /etc/other.conf"}, "daemon.kubeconfig", id="kubeconfig"),
        pytest.param({"oomScoreAdj: null": "oomScoreAdj: -999"}, "daemon.oom_score_adj",
                     id="oom-score"),
    ],
)  # fmt: skip
def test_what_cannot_change_in_place_asks_for_a_restart(
    volume: ConfigMapVolume, edit: dict[str, str], name: str
) -> None:
    watcher = _watcher(volume)
    running = watcher.settings
    volume.update(_text(**edit, **MASQ_ON))  # with an in-place change: nothing is applied
    reload = watcher.check()
    assert reload is not None
    assert reload.error is None, reload.error
    assert [c.name for c in reload.restart] == [name]
    assert watcher.settings is running
