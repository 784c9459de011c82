"""A hostile ``--config`` file is held to the manifests' limits: too large, an alias bomb, an
integer of thousands of digits, nesting too deep, bytes that are not text, or a minSyncPeriod
that would freeze every change: one line naming the file or field, exit 2, at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from nlproxy.cli import main
from nlproxy.config import MAX_CONFIG_BYTES

HEAD = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
# Nine levels of nine aliases: 9**9 values once expanded, a few hundred bytes written.
LAUGHS = "".join(
    [f"x{0}: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]\n"]
    + [f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)]
)

CASES = {
    "too-large": (HEAD + "#" * MAX_CONFIG_BYTES + "\n", "bytes; at most"),
    "alias-bomb": (HEAD + LAUGHS + "clusterCIDR: *a8\n", "once its YAML aliases are expanded"),
    "huge-integer": (HEAD + "iptables: {masqueradeBit: " + "9" * 5000 + "}\n", "cannot be read"),
    "deep-nesting": (HEAD + "clusterCIDR: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested"),
    "binary": (None, "not UTF-8 text"),
    "nul-byte": (HEAD + "clusterCIDR: a\0b\n", "not valid YAML"),
    "two-documents": (HEAD + "---\n" + HEAD, "holds 2 YAML documents"),
    "huge-min-sync-period": (
        HEAD + "mode: nftables\nnftables: {minSyncPeriod: 100000h}\n",
        "nftables.minSyncPeriod: 3.6e+08s is more than 1m; every change would wait for it",
    ),
    "min-sync-period-over-sync-period": (
        HEAD + "iptables: {minSyncPeriod: 30s, syncPeriod: 10s}\n",
        "minSyncPeriod: 30s is longer than syncPeriod (10s)",
    ),
    "huge-sync-period": (
        HEAD + "iptables: {syncPeriod: 9999999h}\n",
        "iptables.syncPeriod: 3.6e+10s is more than 24h",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_config_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    text, expected = CASES[case]
    path = tmp_path / "config.yaml"
    if text is None:
        path.write_bytes(HEAD.encode() + b"clusterCIDR: \xff\xfe\x00\x81\n")
    else:
        path.write_text(text)
    code = main(["run", "--config", str(path), "--manifests", str(tmp_path), "--once"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert expected in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert len(err) < 400


def test_the_min_sync_period_flag_has_the_same_bound(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--min-sync-period", "2h", "--manifests", "/nonexistent", "--once"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--min-sync-period: 7200s is more than 1m" in err
