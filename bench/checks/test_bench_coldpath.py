"""``bench_coldpath.py`` at a small size: every stage of the profile is printed for the cold
start, the restart, a burst and a verify tick, and ``run --once`` runs beside
``iptables-legacy-restore``, its restart sending nothing."""

from __future__ import annotations

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
