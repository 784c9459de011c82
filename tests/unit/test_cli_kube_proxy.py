"""Every flag of kube-proxy v1.36's command line (the list in
``tests/data/config/kube-proxy-1.36.md``, kept as the team's reference has it) is taken by
``nlproxy run`` with its kube-proxy spelling: honoured (the settings or the command's own options
change) or named in exactly one warning; a value kube-proxy would refuse exits 2 naming the flag;
no flag may be abbreviated."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from nlproxy.cli import build_parser, main
from nlproxy.commands.run import settings
from nlproxy.config import Settings
from tests.configs import EXAMPLE, ROOT

REFERENCE = ROOT / "tests/data/config/kube-proxy-1.36.md"


def _reference_flags() -> list[str]:
    text = REFERENCE.read_text()
    section = text.split("## Command-line flags", 1)[1].split("\n## ", 1)[0]
    return sorted(set(re.findall(r"`(-{1,2}[a-z][a-z0-9-]*)`", section)))


FLAGS = _reference_flags()

VALID: dict[str, str | None] = {
    # A value for each flag (None: a switch, given alone).
    "--bind-address": "10.0.0.5",
    "--bind-address-hard-fail": None,
    "--cleanup": None,
    "--cluster-cidr": "10.244.0.0/16,fd00:10:244::/56",
    "--config": str(EXAMPLE),
    "--config-sync-period": "15m0s",
    "--conntrack-max-per-core": "0",
    "--conntrack-min": "4096",
    "--conntrack-tcp-be-liberal": None,
    "--conntrack-tcp-timeout-close-wait": "30m",
    "--conntrack-tcp-timeout-established": "2h",
    "--conntrack-udp-timeout": "30s",
    "--conntrack-udp-timeout-stream": "2m",
    "--detect-local-mode": "NodeCIDR",
    "--feature-gates": "AllAlpha=false,NFTablesProxyMode=true",
    "--healthz-bind-address": "0.0.0.0:10266",
    "--healthz-port": "10257",
    "--hostname-override": "worker-7",
    "--init-only": None,
    "--iptables-localhost-nodeports": "false",
    "--iptables-masquerade-bit": "12",
    "--iptables-min-sync-period": "2s",
    "--iptables-sync-period": "45s",
    "--ipvs-exclude-cidrs": "10.0.0.0/8",
    "--ipvs-min-sync-period": "2s",
    "--ipvs-scheduler": "rr",
    "--ipvs-strict-arp": None,
    "--ipvs-sync-period": "45s",
    "--ipvs-tcp-timeout": "900s",
    "--ipvs-tcpfin-timeout": "120s",
    "--ipvs-udp-timeout": "300s",
    "--kube-api-burst": "40",
    "--kube-api-content-type": "application/json",
    "--kube-api-qps": "20",
    "--kubeconfig": "/etc/kubernetes/proxy.conf",
    "--log-flush-frequency": "5s",
    "--log-json-info-buffer-size": "64Ki",
    "--log-json-split-stream": "true",
    "--log-text-info-buffer-size": "0",
    "--log-text-split-stream": "false",
    "--logging-format": "json",
    "--masquerade-all": None,
    "--master": "https://10.0.0.1:6443",
    "--metrics-bind-address": "0.0.0.0:10249",
    "--metrics-port": "10250",
    "--nodeport-addresses": "10.0.0.0/8",
    "--oom-score-adj": "-999",
    "--pod-bridge-interface": "cni0",
    "--pod-interface-name-prefix": "veth",
    "--profiling": "true",
    "--proxy-mode": "iptables",
    "--show-hidden-metrics-for-version": "1.35",
    "--v": "4",
    "--vmodule": "proxier=4,sync*=2",
    "--write-config-to": "/tmp/never-written.yaml",
    "-v": "4",
}

INVALID: dict[str, str | None] = {
    # A value kube-proxy refuses (None: any value is taken, or only a later check can tell).
    "--bind-address": "node-1",
    "--bind-address-hard-fail": "maybe",
    "--cleanup": "maybe",
    "--cluster-cidr": "10.244.0.0/33",
    "--config": "/nonexistent/kube-proxy.conf",
    "--config-sync-period": "15 minutes",
    "--conntrack-max-per-core": "many",
    "--conntrack-min": "-1",
    "--conntrack-tcp-be-liberal": "maybe",
    "--conntrack-tcp-timeout-close-wait": "1 hour",
    "--conntrack-tcp-timeout-established": "1d",
    "--conntrack-udp-timeout": "30",
    "--conntrack-udp-timeout-stream": "forever",
    "--detect-local-mode": "PodCIDR",
    "--feature-gates": "AllAlpha=maybe",
    "--healthz-bind-address": "0.0.0.0:70000",
    "--healthz-port": "70000",
    "--hostname-override": None,
    "--init-only": "maybe",
    "--iptables-localhost-nodeports": "maybe",
    "--iptables-masquerade-bit": "32",
    "--iptables-min-sync-period": "soon",
    "--iptables-sync-period": "often",
    "--ipvs-exclude-cidrs": "10.0.0.0/99",
    "--ipvs-min-sync-period": "soon",
    "--ipvs-scheduler": None,
    "--ipvs-strict-arp": "maybe",
    "--ipvs-sync-period": "often",
    "--ipvs-tcp-timeout": "15 minutes",
    "--ipvs-tcpfin-timeout": "2 minutes",
    "--ipvs-udp-timeout": "5 minutes",
    "--kube-api-burst": "-3",
    "--kube-api-content-type": None,
    "--kube-api-qps": "fast",
    "--kubeconfig": None,  # a missing file is checked as the daemon starts (test_startup.py)
    "--log-flush-frequency": "often",
    "--log-json-info-buffer-size": "big",
    "--log-json-split-stream": "maybe",
    "--log-text-info-buffer-size": "-1",
    "--log-text-split-stream": "maybe",
    "--logging-format": "xml",
    "--masquerade-all": "maybe",
    "--master": "ftp://10.0.0.1",
    "--metrics-bind-address": "localhost:10249",
    "--metrics-port": "-1",
    "--nodeport-addresses": "localhost",
    "--oom-score-adj": "-1001",
    "--pod-bridge-interface": None,
    "--pod-interface-name-prefix": None,
    "--profiling": "maybe",
    "--proxy-mode": "userspace",
    "--show-hidden-metrics-for-version": "one-three-five",
    "--v": "loud",
    "--vmodule": "proxier",
    "--write-config-to": "/nonexistent/dir/out.yaml",
    "-v": "loud",
}

BASE = ["run", "--node-name", "n1"]
OPTIONS_OF_THE_COMMAND = ("cleanup", "init_only", "write_config_to", "log_level", "log_format")
"""What a flag may change besides the settings: the command's own options."""


def _argv(flag: str, value: str | None) -> list[str]:
    if value is None:
        return [flag]
    return [flag, value] if flag == "-v" else [f"{flag}={value}"]


def _quiet(s: Settings) -> Settings:
    return replace(s, daemon=replace(s.daemon, warnings=()))


def test_the_list_is_the_whole_reference() -> None:
    assert len(FLAGS) > 50  # the section was found and read
    assert sorted(VALID) == FLAGS
    assert sorted(INVALID) == FLAGS


@pytest.mark.parametrize("flag", FLAGS)
def test_each_flag_is_honoured_or_named_in_one_warning(flag: str) -> None:
    parser = build_parser()
    base_args = parser.parse_args(BASE)
    args = parser.parse_args([*BASE, *_argv(flag, VALID[flag])])
    base, got = settings(base_args), settings(args)
    name = flag.lstrip("-")
    naming = [w for w in got.daemon.warnings if re.match(rf"-*{re.escape(name)}\b", w)]
    honoured = _quiet(got) != _quiet(base) or any(
        getattr(args, o, None) != getattr(base_args, o, None) for o in OPTIONS_OF_THE_COMMAND
    )
    if flag == "--proxy-mode":  # nftables programmed in iptables mode's place, and said so
        assert len(naming) == 1
        assert "nlproxy programs nftables" in naming[0]
        return
    if honoured:
        assert naming == [], f"{flag} is honoured and warned about"
    else:
        assert len(naming) == 1, f"{flag} is neither honoured nor named once: {got.daemon.warnings}"
        assert "is not used by nlproxy" in naming[0]


@pytest.mark.parametrize("flag", [f for f in FLAGS if INVALID[f] is not None])
def test_a_value_kube_proxy_refuses_exits_2_naming_the_flag(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --write-config-to (unless it is the flag tried) makes a value wrongly taken end the run
    # with 0 instead of starting anything.
    out = [] if flag == "--write-config-to" else ["--write-config-to", str(tmp_path / "c.yaml")]
    argv = [*BASE, "--manifests", str(tmp_path), *out, *_argv(flag, INVALID[flag])]
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith(("usage:", " "))]
    assert len(lines) == 1, err
    named = "config /nonexistent" if flag == "--config" else flag.lstrip("-")
    if flag == "--nodeport-addresses":
        named = "nodePortAddresses"
    assert named in lines[0], lines[0]
    assert not (tmp_path / "c.yaml").exists()


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["run", "--manifest", "/tmp"], id="manifest-for-manifests"),
        pytest.param(["run", "--masquerade", "--manifests", "/tmp"], id="masquerade-all"),
        pytest.param(["run", "--oom-score", "5", "--manifests", "/tmp"], id="oom-score-adj"),
        pytest.param(["version", "--log-lev", "debug"], id="global-flag"),
        pytest.param(["rules", "--fam", "ip"], id="subcommand-flag"),
    ],
)
def test_no_flag_may_be_abbreviated(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "unrecognized arguments" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value", "want"),
    [
        pytest.param("--masquerade-all", "false", False, id="switch-false"),
        pytest.param("--masquerade-all", "true", True, id="switch-true"),
        pytest.param("--masquerade-all", None, True, id="switch-alone"),
    ],
)
def test_switches_take_kube_proxys_spellings(flag: str, value: str | None, want: bool) -> None:
    args = build_parser().parse_args([*BASE, *_argv(flag, value)])
    assert settings(args).proxy.masquerade_all is want


def test_sync_period_aliases_and_the_ipvs_ones_in_ipvs_mode() -> None:
    parse = build_parser().parse_args
    s = settings(parse([*BASE, "--iptables-sync-period=45s", "--iptables-min-sync-period=2s"]))
    assert (s.daemon.sync_period, s.daemon.min_sync_period) == (45.0, 2.0)
    s = settings(parse([*BASE, "--proxy-mode=ipvs", "--ipvs-sync-period=40s"]))
    assert s.daemon.sync_period == 40.0
    assert not [w for w in s.daemon.warnings if "--ipvs-sync-period" in w]


def test_a_zero_duration_is_taken_as_go_reads_it() -> None:
    args = build_parser().parse_args(
        [*BASE, "--iptables-min-sync-period=0", "--config-sync-period=0"]
    )
    assert settings(args).daemon.min_sync_period == 0.0


def test_logging_flags_map_onto_nlproxys_logging() -> None:
    parse = build_parser().parse_args
    assert parse([*BASE, "--logging-format=text"]).log_format == "console"
    assert parse([*BASE, "--logging-format=json"]).log_format == "json"
    assert parse([*BASE, "--v=2"]).log_level == "info"
    assert parse([*BASE, "-v", "5"]).log_level == "debug"


def test_deprecated_port_flags_replace_the_bind_addresses_port() -> None:
    args = build_parser().parse_args([*BASE, "--healthz-port=10300", "--metrics-port=0"])
    s = settings(args)
    assert (s.daemon.healthz_bind_address, s.daemon.metrics_bind_address) == (
        "0.0.0.0:10300",
        "127.0.0.1:0",
    )


RUN_ACTIONS = ("--cleanup", "--init-only", "--write-config-to")
"""kube-proxy's flags that make it do something else than sync: not plan's (nor compare's)."""


@pytest.mark.parametrize("command", ["plan", "compare"])
@pytest.mark.parametrize("flag", [f for f in FLAGS if f not in RUN_ACTIONS])
def test_plan_and_compare_take_each_flag_as_run_does(
    command: str, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A kube-proxy DaemonSet's command line gives ``plan`` (and ``compare``) the settings it
    gives ``run``: the same honoured values, the same warnings."""
    from nlproxy.commands import plan

    parser = build_parser()
    ran = parser.parse_args([*BASE, *_argv(flag, VALID[flag])])
    asked = parser.parse_args([command, "--node-name", "n1", *_argv(flag, VALID[flag])])
    want, got = settings(ran), plan.settings(asked)
    assert (got.proxy, got.daemon) == (want.proxy, want.daemon)
    assert capsys.readouterr().err.count("warning") == len(want.daemon.warnings)


@pytest.mark.parametrize("flag", RUN_ACTIONS)
def test_plan_refuses_what_makes_run_do_something_else(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--manifests", ".", *_argv(flag, VALID[flag])]) == 2
    assert f"unrecognized arguments: {flag}" in capsys.readouterr().err
