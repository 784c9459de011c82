"""The load-balancing algorithm: the Service annotation, the flag and ``ipvs.scheduler``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nlproxy.cli import main
from nlproxy.cluster.model import LoadBalancing
from nlproxy.cluster.parse import parse_service
from nlproxy.config import load_kube_proxy_config
from tests.configs import KUBEADM_CONFIGMAP
from tests.objects import example_service as service

LB = "nlproxy.io/load-balancing"
KEY = "nlproxy.io/consistent-hash-key"


@pytest.mark.parametrize(
    ("annotations", "algorithm", "with_port"),
    [
        pytest.param({}, None, False, id="none-means-the-node-default"),
        pytest.param({LB: "random"}, LoadBalancing.RANDOM, False, id="random"),
        pytest.param({LB: "round-robin"}, LoadBalancing.ROUND_ROBIN, False, id="round-robin"),
        pytest.param(
            {LB: "consistent-hash"}, LoadBalancing.CONSISTENT_HASH, False, id="consistent-hash"
        ),
        pytest.param(
            {LB: "consistent-hash", KEY: "client-ip-port"},
            LoadBalancing.CONSISTENT_HASH,
            True,
            id="consistent-hash-of-address-and-port",
        ),
    ],
)
def test_annotation_chooses_the_algorithm(
    annotations: dict[str, str], algorithm: LoadBalancing | None, with_port: bool
) -> None:
    svc = parse_service(service(**{"metadata.annotations": annotations, "metadata.uid": "u-1"}))
    assert svc is not None
    assert (svc.load_balancing, svc.hash_source_port, svc.uid) == (algorithm, with_port, "u-1")


@pytest.mark.parametrize(
    ("annotations", "algorithm", "message"),
    [
        pytest.param(
            {LB: "roundrobin"},
            None,
            f'metadata.annotations[{LB}]: "roundrobin" is not one of random, round-robin, '
            "consistent-hash; the default is kept",
            id="unknown-algorithm",
        ),
        pytest.param(
            {LB: "consistent-hash", KEY: "source-ip"},
            LoadBalancing.CONSISTENT_HASH,
            f'metadata.annotations[{KEY}]: "source-ip" is not one of client-ip, client-ip-port; '
            "the default is kept",
            id="unknown-hash-key",
        ),
    ],
)
def test_unknown_annotation_value_keeps_the_default_and_says_so(
    annotations: dict[str, str], algorithm: LoadBalancing | None, message: str
) -> None:
    """The API server never validates annotations: a typo must not take the Service down."""
    svc = parse_service(service(**{"metadata.annotations": annotations}))
    assert svc is not None
    assert (svc.load_balancing, svc.hash_source_port) == (algorithm, False)
    assert svc.annotation_warnings == (message,)


@pytest.mark.parametrize(
    ("scheduler", "algorithm", "warned"),
    [
        pytest.param('""', "random", False, id="unset"),
        pytest.param("rr", "round-robin", False, id="rr"),
        pytest.param("sh", "consistent-hash", False, id="sh"),
        pytest.param("mh", "consistent-hash", False, id="mh"),
        pytest.param("lc", "random", True, id="lc-warned"),
    ],
)
def test_ipvs_scheduler_sets_the_default(
    tmp_path: Path, scheduler: str, algorithm: str, warned: bool
) -> None:
    path = tmp_path / "config.conf"
    path.write_text(KUBEADM_CONFIGMAP.replace('  scheduler: ""', f"  scheduler: {scheduler}"))
    cfg = load_kube_proxy_config(path)
    assert cfg.load_balancing == algorithm
    expected = (
        ("ipvs.scheduler 'lc' has no nlproxy equivalent (rr, sh and mh do): endpoints are "
         "chosen at random",)
        if warned
        else ()
    )  # fmt: skip
    assert cfg.warnings == expected


def _proxy_config(argv: list[str]) -> Any:
    from nlproxy.cli import build_parser
    from nlproxy.commands.run import settings

    args = build_parser().parse_args(["run", "--node-name", "n1", *argv])
    return settings(args).proxy


def test_flag_overrides_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.conf"
    path.write_text(KUBEADM_CONFIGMAP.replace('  scheduler: ""', "  scheduler: rr"))
    assert _proxy_config([]).load_balancing is LoadBalancing.RANDOM
    assert _proxy_config(["--config", str(path)]).load_balancing is LoadBalancing.ROUND_ROBIN
    flags = ["--load-balancing", "consistent-hash", "--consistent-hash-seed", "7"]
    pcfg = _proxy_config(["--config", str(path), *flags])
    assert (pcfg.load_balancing, pcfg.hash_seed) == (LoadBalancing.CONSISTENT_HASH, 7)


def test_bad_seed_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "--once", "--manifests", "/nonexistent", "--consistent-hash-seed", "-1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == "nlproxy: --consistent-hash-seed: -1 is not in 0..4294967295\n"
