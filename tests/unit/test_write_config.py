"""``run --write-config-to``: the settings a command line makes, written as a
KubeProxyConfiguration that ``--config`` reads back to the same settings; and
``--oom-score-adj`` writing the process's score."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nlproxy.cli import build_parser, main
from nlproxy.commands.run import _set_oom_score_adj, settings
from tests.configs import EXAMPLE, KUBEADM

COMMAND_LINES = {
    "flags": [
        "--hostname-override=w1", "--masquerade-all", "--detect-local-mode=NodeCIDR",
        "--cluster-cidr=10.244.0.0/16,fd00:10:244::/56", "--iptables-sync-period=45s",
        "--iptables-min-sync-period=250ms", "--iptables-masquerade-bit=12",
        "--kube-api-qps=20", "--kube-api-burst=40", "--oom-score-adj=-999",
        "--nodeport-addresses=10.0.0.0/8", "--conntrack-tcp-timeout-established=2h",
        "--conntrack-udp-timeout=30s", "--conntrack-tcp-be-liberal",
        "--metrics-bind-address=0.0.0.0:10249", "--ipvs-scheduler=rr", "--proxy-mode=ipvs",
    ],
    "kubeadm-file": ["--config", str(KUBEADM), "--node-name=w2"],
    "example-file-and-flags": ["--config", str(EXAMPLE), "--node-name=w3", "--masquerade-all=true"],
}  # fmt: skip


@pytest.mark.parametrize("flags", COMMAND_LINES.values(), ids=COMMAND_LINES.keys())
def test_the_written_file_reads_back_to_the_same_settings(tmp_path: Path, flags: list[str]) -> None:
    out = tmp_path / "kube-proxy.conf"
    assert main(["run", *flags, "--write-config-to", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    assert (doc["kind"], doc["mode"]) == ("KubeProxyConfiguration", "nftables")
    parse = build_parser().parse_args
    given = settings(parse(["run", *flags]))
    again = settings(parse(["run", "--config", str(out)]))
    assert again.daemon.warnings == ()  # every field written is one nlproxy reads
    assert again.proxy == given.proxy
    for attr in (
        "node_name", "cluster_cidr", "masquerade_bit", "min_sync_period", "sync_period",
        "healthz_bind_address", "metrics_bind_address", "conntrack", "masquerade_all",
        "detect_local_mode", "kube_api_qps", "kube_api_burst", "oom_score_adj", "load_balancing",
    ):  # fmt: skip
        assert getattr(again.daemon, attr) == getattr(given.daemon, attr), attr


def test_flags_values_are_in_the_file(tmp_path: Path) -> None:
    out = tmp_path / "c.yaml"
    assert main(["run", *COMMAND_LINES["flags"], "--write-config-to", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    assert doc["nftables"] == {
        "masqueradeAll": True, "masqueradeBit": 12, "minSyncPeriod": "250ms", "syncPeriod": "45s",
    }  # fmt: skip
    assert doc["clientConnection"]["qps"] == 20
    assert (doc["detectLocalMode"], doc["oomScoreAdj"]) == ("NodeCIDR", -999)


def test_an_unwritable_path_exits_2_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--write-config-to", str(tmp_path / "no" / "c.yaml")]) == 2
    assert capsys.readouterr().err.startswith("nlproxy: --write-config-to: ")


def test_oom_score_adj_is_written_to_the_process() -> None:
    code = (
        "from pathlib import Path; from nlproxy.commands.run import _set_oom_score_adj;"
        "_set_oom_score_adj(512); print(Path('/proc/self/oom_score_adj').read_text().strip())"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert proc.stdout.strip() == "512"


def test_an_oom_score_adj_that_cannot_be_set_is_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _set_oom_score_adj(-999, tmp_path / "missing" / "oom_score_adj")
    err = capsys.readouterr().err
    assert err.startswith("nlproxy: warning: --oom-score-adj: cannot set ")
