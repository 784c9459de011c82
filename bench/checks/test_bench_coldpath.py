"""``bench_coldpath.py`` at a small size: every stage of the profile is printed for the cold
start, the restart, a burst and a verify tick, and ``run --once`` runs beside
``iptables-legacy-restore``, its restart sending nothing."""

from __future__ import annotations

from pathlib import Path

from checks.script import run_script


def test_small_run_prints_every_stage_and_the_reference() -> None:
    rows = run_script(
        "bench_coldpath.py", "--services", "40", "--endpoints", "2", "--burst", "10",
        "--rounds", "1",
    )  # fmt: skip
    stages = {(r["format"], r["phase"]): r for r in rows if r["bench"] == "coldpath_stages"}
    assert set(stages) == {(f, p) for f in ("json", "yaml") for p in ("cold", "restart")}
    for r in stages.values():
        assert {"read_s", "decode_s", "parse_s", "plan_s", "readback_s", "diff_s"} <= set(r)
    assert stages["json", "cold"]["ops"] > 0
    assert stages["json", "restart"]["ops"] == 0
    assert {"validate_s", "encode_s", "commit_s"} <= set(stages["json", "cold"])
    burst = {r["what"]: r for r in rows if r["bench"] == "burst_stages"}
    assert burst["burst"]["updates"] == 10
    assert burst["burst"]["ops"] > 0
    assert burst["verify"]["ops"] == 0  # nothing drifted: the read-back equals the plan
    assert burst["verify"]["readback_s"] > 0
    cli = {(r["format"], r["phase"]): r for r in rows if r["bench"] == "coldpath_cli"}
    assert set(cli) == {
        ("json", "cold"), ("json", "restart"), ("yaml", "cold"), ("yaml", "restart"),
        ("iptables-legacy", "cold"),
    }  # fmt: skip
    assert cli["json", "restart"]["ops"] == cli["yaml", "restart"]["ops"] == 0
    assert cli["json", "cold"]["ops"] == stages["json", "cold"]["ops"]


def test_kubectl_style_yaml_runs_cold_and_restarts_unchanged() -> None:
    rows = run_script(
        "bench_coldpath.py", "--services", "40", "--endpoints", "2", "--rounds", "1",
        "--formats", "yaml-kubectl", "--skip-stages", "--no-legacy",
    )  # fmt: skip
    cli = {(r["format"], r["phase"]): r for r in rows if r["bench"] == "coldpath_cli"}
    assert set(cli) == {("yaml-kubectl", "cold"), ("yaml-kubectl", "restart")}
    assert cli["yaml-kubectl", "cold"]["ops"] > 0
    assert cli["yaml-kubectl", "restart"]["ops"] == 0


def test_load_alone_runs_beside_another_checkout() -> None:
    """``--load-rounds``: ``load_manifests`` in a child per checkout and format, the same
    objects from both (here the checkout is its own base)."""
    base = str(Path(__file__).resolve().parents[2])
    rows = run_script(
        "bench_coldpath.py", "--services", "40", "--endpoints", "2", "--skip-cli",
        "--skip-stages", "--load-rounds", "1", "--base", base,
    )  # fmt: skip
    load = {(r["checkout"], r["format"]): r for r in rows if r["bench"] == "coldpath_load"}
    assert set(load) == {(c, f) for c in ("base", "this") for f in ("json", "yaml")}
    for r in load.values():
        assert r["objects"] == 40 + 40 + 1  # Services, slices, the Node
        assert r["load_s"] > 0
        assert r["rss_mib"] > 0
