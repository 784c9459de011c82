"""Sync periods and the masquerade mark, read from the section kube-proxy reads for the file's
mode and validated as kube-proxy validates them: a value is honoured or refused naming its
field, never replaced by a default behind the user's back."""

from __future__ import annotations

from pathlib import Path

import pytest

from nlproxy.cli import main
from nlproxy.config import DaemonConfig, honoured_fields, load_kube_proxy_config
from nlproxy.config.kubeproxy import API_VERSIONS
from nlproxy.errors import ConfigError

V1ALPHA1_VERSION, V1ALPHA2_VERSION = API_VERSIONS
V1ALPHA1 = f"apiVersion: {V1ALPHA1_VERSION}\nkind: KubeProxyConfiguration\n"
V1ALPHA2 = f"apiVersion: {V1ALPHA2_VERSION}\nkind: KubeProxyConfiguration\n"
SECTIONS = """iptables:
  masqueradeBit: 12
  minSyncPeriod: 2s
  syncPeriod: 45s
ipvs:
  minSyncPeriod: 3s
  syncPeriod: 50s
nftables:
  masqueradeBit: 13
  minSyncPeriod: 4s
  syncPeriod: 55s
"""


def _load(tmp_path: Path, text: str) -> DaemonConfig:
    path = tmp_path / "config.conf"
    path.write_text(text)
    return load_kube_proxy_config(path)


@pytest.mark.parametrize(
    ("mode", "want"),
    [
        # kube-proxy's default mode on Linux is iptables: an empty mode reads that section.
        pytest.param("", (45.0, 2.0, 12), id="empty-reads-iptables"),
        pytest.param("iptables", (45.0, 2.0, 12), id="iptables"),
        pytest.param("ipvs", (50.0, 3.0, 12), id="ipvs-periods-and-the-iptables-mark"),
        pytest.param("nftables", (55.0, 4.0, 13), id="nftables"),
    ],
)
def test_periods_and_mark_come_from_the_modes_section(
    tmp_path: Path, mode: str, want: tuple[float, float, int]
) -> None:
    cfg = _load(tmp_path, f"{V1ALPHA1}mode: {mode!r}\n{SECTIONS}")
    assert (cfg.sync_period, cfg.min_sync_period, cfg.masquerade_bit) == want


def test_an_empty_mode_names_the_nftables_section_it_does_not_read(tmp_path: Path) -> None:
    cfg = _load(tmp_path, f"{V1ALPHA1}{SECTIONS}")
    unread = [w for w in cfg.warnings if w.startswith("nftables.")]
    assert unread == [
        f"nftables.{f} is not used by nlproxy (an empty mode reads the iptables section)"
        for f in ("masqueradeBit", "minSyncPeriod", "syncPeriod")
    ]


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        pytest.param(
            "iptables: {masqueradeBit: 32}\n", "iptables.masqueradeBit", "32 is not in 0..31",
            id="iptables-bit-32-empty-mode",
        ),
        pytest.param(
            "mode: nftables\niptables: {masqueradeBit: 32}\n", "iptables.masqueradeBit",
            "32 is not in 0..31", id="iptables-bit-is-validated-in-every-mode",
        ),
        pytest.param(
            "mode: nftables\nnftables: {masqueradeBit: -1}\n", "nftables.masqueradeBit",
            "-1 is not in 0..31", id="nftables-bit-negative",
        ),
        pytest.param(
            "mode: iptables\niptables: {masqueradeBit: true}\n", "iptables.masqueradeBit",
            "True is not an integer", id="bit-not-a-number",
        ),
        pytest.param(
            "nftables: {minSyncPeriod: often}\n", "nftables.minSyncPeriod",
            "'often' is not a duration", id="unread-section-still-decoded",
        ),
        pytest.param(
            "mode: iptables\nnftables: {masqueradeBit: 1.5}\n", "nftables.masqueradeBit",
            "1.5 is not an integer", id="unread-mark-still-decoded",
        ),
        pytest.param(
            "iptables: {syncPeriod: -5s}\n", "iptables.syncPeriod",
            "'-5s': must be greater than 0", id="negative-sync-period",
        ),
        pytest.param(
            "mode: nftables\nnftables: {minSyncPeriod: -1s}\n", "nftables.minSyncPeriod",
            "'-1s': must be at least 0", id="negative-min-sync-period",
        ),
    ],
)  # fmt: skip
def test_a_value_kube_proxy_refuses_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, field: str, reason: str
) -> None:
    path = tmp_path / "config.conf"
    path.write_text(V1ALPHA1 + text)
    with pytest.raises(ConfigError) as err:
        load_kube_proxy_config(path)
    assert str(err.value) == f"KubeProxyConfiguration: {field}: {reason}"
    code = main(["run", "--config", str(path), "--manifests", str(tmp_path), "--once"])
    out = capsys.readouterr().err
    assert code == 2, out
    assert f"{field}: {reason}" in out
    assert len(out.strip().splitlines()) == 1, out


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(V1ALPHA1 + "iptables: {syncPeriod: 0s, minSyncPeriod: 0s}\n", id="v1alpha1"),
        pytest.param(V1ALPHA1 + "iptables: {syncPeriod: '-0s'}\n", id="minus-zero"),
        pytest.param(V1ALPHA2 + "syncPeriod: 0s\nminSyncPeriod: '0'\n", id="v1alpha2-top-level"),
    ],
)
def test_a_zero_period_means_the_default_as_in_kube_proxy(tmp_path: Path, text: str) -> None:
    # kube-proxy's defaulting replaces a 0 period by its default before validating it (kubeadm
    # writes 0s in every section for "default"); nlproxy's defaults stand in the same way.
    cfg = _load(tmp_path, text)
    default = DaemonConfig()
    assert (cfg.sync_period, cfg.min_sync_period) == (default.sync_period, default.min_sync_period)
    assert cfg.warnings == ()


def test_kube_proxys_defaults_in_an_unread_section_are_not_warned_about(tmp_path: Path) -> None:
    # What kubeadm writes into every section: kube-proxy's defaults, read or not.
    text = V1ALPHA1 + (
        "mode: nftables\niptables: {masqueradeBit: 14, minSyncPeriod: 1s, syncPeriod: 30s}\n"
    )
    assert _load(tmp_path, text).warnings == ()


@pytest.mark.parametrize(
    ("text", "want", "warning"),
    [
        pytest.param(
            V1ALPHA1 + "syncPeriod: 10s\n",
            DaemonConfig().sync_period,
            "syncPeriod is not used by nlproxy (kubeproxy.config.k8s.io/v1alpha1 has its sync "
            "periods in the mode's section)",
            id="v1alpha1-has-no-top-level-period",
        ),
        pytest.param(
            V1ALPHA2 + "syncPeriod: 10s\niptables: {syncPeriod: 20s}\n",
            10.0,
            "iptables.syncPeriod is not used by nlproxy (kubeproxy.config.k8s.io/v1alpha2 has "
            "its sync periods at the top level)",
            id="v1alpha2-has-no-section-period",
        ),
    ],
)
def test_a_period_is_read_where_its_version_keeps_it(
    tmp_path: Path, text: str, want: float, warning: str
) -> None:
    # kube-proxy ignores (v1alpha1, decoded leniently) or refuses (v1alpha2) a period written
    # anywhere else; nlproxy names it instead of letting it replace the one kube-proxy reads.
    cfg = _load(tmp_path, text)
    assert cfg.sync_period == want
    assert cfg.warnings == (warning,)


@pytest.mark.parametrize(
    ("text", "want", "warnings"),
    [
        pytest.param(
            V1ALPHA1 + "mode: nftables\nlinux: {masqueradeAll: true}\n",
            False,
            (
                "linux.masqueradeAll is not used by nlproxy (kubeproxy.config.k8s.io/v1alpha1 "
                "sets masqueradeAll in the mode's section)",
            ),
            id="v1alpha1-has-no-linux-section",
        ),
        pytest.param(
            V1ALPHA2 + "mode: nftables\nlinux: {masqueradeAll: true}\n",
            True,
            (),
            id="v1alpha2-linux-section",
        ),
    ],
)
def test_masquerade_all_is_read_where_its_version_keeps_it(
    tmp_path: Path, text: str, want: bool, warnings: tuple[str, ...]
) -> None:
    cfg = _load(tmp_path, text)
    assert (cfg.masquerade_all, cfg.warnings) == (want, warnings)


def test_a_bind_address_yaml_reads_as_a_number_is_refused(tmp_path: Path) -> None:
    # 167772161 is 10.0.0.1 as an integer; kube-proxy cannot decode a number into the string
    # field, and nlproxy took it as that address.
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, V1ALPHA1 + "bindAddress: 167772161\n")
    assert str(err.value) == "KubeProxyConfiguration: bindAddress: 167772161 is not an IP address"


def test_the_fields_one_file_is_read_at_follow_its_mode_and_version() -> None:
    empty = honoured_fields({"apiVersion": V1ALPHA1_VERSION})
    assert {"iptables.syncPeriod", "iptables.masqueradeBit", "iptables.masqueradeAll"} <= empty
    assert not {"nftables.syncPeriod", "syncPeriod", "linux.masqueradeAll"} & empty
    v2 = honoured_fields({"apiVersion": V1ALPHA2_VERSION, "mode": "nftables"})
    assert {"syncPeriod", "nftables.masqueradeBit", "linux.masqueradeAll"} <= v2
    assert "nftables.syncPeriod" not in v2
