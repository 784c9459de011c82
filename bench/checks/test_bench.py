"""The benchmark's inputs and helpers, checked for real: every generated ruleset loads into a
fresh namespace and DNATs a real TCP connection to the pod, kube-proxy's partial-sync delta
applies on top of its full ruleset, and the measuring, plotting and report helpers do what the
figures rely on. Nothing here looks at how long anything took."""

from __future__ import annotations

import json
import re
import struct
import zlib
from pathlib import Path

import control
import dataplane
import gen
import plot
import pytest
import report
from measure import in_ns, netns, run_measured, sh, sync_applied


def small(services: int = 5, endpoints: int = 3) -> gen.Cluster:
    return gen.Cluster(services=services, endpoints=endpoints)


def test_generation_is_deterministic(tmp_path: Path) -> None:
    a = gen.write_all(small(), tmp_path / "a")
    b = gen.write_all(small(), tmp_path / "b")
    for what in ("nft-1.31", "nft-1.36", "iptables"):
        assert a[what].read_bytes() == b[what].read_bytes()
    for name in ("services.yaml", "endpointslices.yaml", "node.yaml"):
        assert (a["manifests"] / name).read_bytes() == (b["manifests"] / name).read_bytes()


def test_manifests_parse_into_the_cluster(tmp_path: Path) -> None:
    from nlproxy.cluster.manifests import load_manifests
    from nlproxy.cluster.state import ClusterState

    c = gen.Cluster(services=4, endpoints=150, nodes=2)
    for fmt in ("yaml", "json"):
        gen.write_manifests(c, tmp_path / fmt, fmt)
        loaded = load_manifests(tmp_path / fmt)
        assert loaded.errors == ()
        state = ClusterState(gen.NODE_NAME)
        state.apply(loaded.changes)
        assert dict(state.invalid) == {}
        snap = state.snapshot()
        assert len(snap.services) == 4
        assert snap.node is not None
        ips = {str(e.ip) for slices in snap.slices.values() for s in slices for e in s.endpoints}
        assert len(ips) == 4 * 150  # two slices per service (100 per slice)


def test_names_and_counts_follow_kube_proxy() -> None:
    c = small(services=3, endpoints=4)
    text = gen.nft_text(c, "nft-1.31")
    assert len(re.findall(r"^add chain ip kube-proxy service-[A-Z2-7]{8}-", text, re.M)) == 3
    assert len(re.findall(r"^add chain ip kube-proxy endpoint-[A-Z2-7]{8}-", text, re.M)) == 12
    assert "numgen random mod 4 vmap" in text
    assert "dnat to" not in gen.nft_text(c, "nft-1.36")
    ipt = gen.iptables_text(c)
    assert ipt.count(":KUBE-SVC-") == 3
    assert ipt.count(":KUBE-SEP-") == 12
    # kube-proxy's cascade: 1/4, 1/3, 1/2, then the last endpoint unconditionally.
    for p in ("0.2500000000", "0.3333333333", "0.5000000000"):
        assert ipt.count(f"--probability {p}") == 3
    assert len(gen.ipt_svc_chain(c, 0)) <= 28  # iptables chain name limit
    with pytest.raises(ValueError, match="unknown nft shape"):
        gen.nft_service(c, 0, "nft-0.1")


def test_edit_changes_exactly_one_endpoint() -> None:
    c = small()
    edited = gen.edit_one_endpoint(c, 2)
    changed = [i for i in range(c.services) if c.endpoint_ips(i) != edited.endpoint_ips(i)]
    assert changed == [2]
    old, new = set(c.endpoint_ips(2)), set(edited.endpoint_ips(2))
    assert len(old - new) == len(new - old) == 1


@pytest.mark.parametrize("variant", ["nlproxy", *control.BASELINES])
def test_every_variant_dnats_the_last_service_to_the_pod(variant: str, tmp_path: Path) -> None:
    c = gen.Cluster(services=20, endpoints=2, last_endpoints=(dataplane.POD_IP,))
    inp = control.generate(c, tmp_path, (variant,))
    with dataplane.topology() as topo:
        argv, stdin = control.load_command(variant, topo.node, inp)
        u = run_measured(argv, stdin=stdin, timeout=120)
        assert u.rc == 0, u.stderr
        lat = dataplane.connect_latency(topo, c.vip(c.services - 1), gen.PORT, 20, 30)
        assert lat["connects"] == 20
        assert lat["errors"] == 0
        # The connections went through the node's NAT: conntrack saw the service address.
        flows = sh("conntrack", "-L", "-d", c.vip(c.services - 1), ns=topo.node, check=False)
        assert f"src={dataplane.POD_IP}" in flows


def test_without_rules_the_service_address_is_unreachable() -> None:
    with dataplane.topology() as topo:
        vip = small().vip(0)
        out = sh(
            dataplane.PY, "-c", dataplane.CLIENT, vip, str(gen.PORT), "3", "10", ns=topo.client
        )
        res = json.loads(out)
        assert res["samples"] == []
        assert res["errors"] == 3


@pytest.mark.parametrize("shape", ["nft-1.31", "nft-1.36"])
def test_partial_sync_delta_applies_on_the_full_ruleset(shape: str, tmp_path: Path) -> None:
    c = small(services=4, endpoints=3)
    edited = gen.edit_one_endpoint(c, 1)
    full, delta = tmp_path / "full.nft", tmp_path / "delta.nft"
    full.write_text(gen.nft_text(c, shape))
    delta.write_text(gen.nft_partial(edited, c, 1, shape))
    with netns("test") as ns:
        sh("nft", "-f", str(full), ns=ns)
        sh("nft", "-f", str(delta), ns=ns)
        listing = sh("nft", "list", "table", "ip", gen.NFT_TABLE, ns=ns)
    (gone,) = set(c.endpoint_ips(1)) - set(edited.endpoint_ips(1))
    (new,) = set(edited.endpoint_ips(1)) - set(c.endpoint_ips(1))
    assert new in listing
    assert f"{gone} " not in listing
    assert f"{gone}/" not in listing


def test_run_measured_reports_usage_and_kills_on_timeout() -> None:
    u = run_measured(["sh", "-c", "echo oops >&2; exit 3"])
    assert (u.rc, u.stderr.strip(), u.timed_out) == (3, "oops", False)
    u = run_measured(["sleep", "30"], timeout=0.2)
    assert u.timed_out
    assert u.rc != 0


def test_nlproxy_log_line_is_found(tmp_path: Path) -> None:
    c = small()
    gen.write_manifests(c, tmp_path, "json")
    from measure import nlproxy_argv

    with netns("test") as ns:
        first = sync_applied(run_measured(nlproxy_argv(ns, tmp_path)).stderr)
        again = sync_applied(run_measured(nlproxy_argv(ns, tmp_path)).stderr)
        assert sh("nft", "list", "tables", ns=ns).strip()
    assert first["ops"] > 0
    assert again["ops"] == 0
    assert in_ns("x", "true") == ["ip", "netns", "exec", "x", "true"]


def _png_size(data: bytes) -> tuple[int, int, bytes]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    width = height = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + body)
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    return width, height, zlib.decompress(idat)


def test_plot_writes_a_valid_png_with_the_lines(tmp_path: Path) -> None:
    path = tmp_path / "p.png"
    series = {"a": [(10.0, 1.0), (1000.0, 5.0)], "b": [(10.0, 2.0), (30000.0, 3.0)]}
    plot.line_chart(path, "T", series, xlabel="x", ylabel="y", size=(300, 200))
    w, h, raw = _png_size(path.read_bytes())
    assert (w, h) == (300, 200)
    assert len(raw) == h * (1 + 3 * w)
    assert bytes(plot.PALETTE[0]) in raw  # series colours were drawn
    assert bytes(plot.PALETTE[1]) in raw


def test_report_targets_are_ratios_of_the_records() -> None:
    def cold(variant: str, wall: float, sys: float) -> dict[str, object]:
        return {"bench": "cold_sync", "point": "10kx10", "variant": variant, "wall": wall,
                "user": 0.0, "sys": sys, "rss_mib": 1.0, "rc": 0, "services": 10000}  # fmt: skip

    records = [
        cold("nlproxy", 2.0, 1.0),
        cold("nft-1.31", 50.0, 45.0),
        {
            "bench": "one_endpoint_inprocess",
            "point": "10kx10",
            "wall_ms_median": 4.0,
            "wall_ms_max": 6.0,
            "plan_ms_median": 1.0,
            "apply_ms_median": 2.0,
            "ops": [2],
        },
        {"bench": "restart_unchanged", "point": "10kx10", "ops": 3, "wall": 1.0, "sync_ms": 9},
        {
            "bench": "first_packet",
            "variant": "nlproxy",
            "services": 10,
            "p50_us": 50.0,
            "p99_us": 90.0,
        },
        {
            "bench": "first_packet",
            "variant": "nlproxy",
            "services": 30000,
            "p50_us": 60.0,
            "p99_us": 99.0,
        },
    ]
    values = [(t["value"], t["met"]) for t in report.targets(records, "10kx10")]
    assert values == [(25.0, True), (2.0, False), (4.0, True), (3, False), (1.2, False)]
    text = report.summary(records, "10kx10", "test")
    assert "MISSED" in text
    assert "nft-1.31" in text


def test_a_remeasured_figure_replaces_only_the_same_measurement() -> None:
    import run

    failed = {"bench": "cold_sync", "point": "44kx5", "services": 44000, "variant": "nlproxy",
              "wall": 35.0, "rc": 1, "error": "NameError", "timed_out": False}  # fmt: skip
    redone = {**failed, "wall": 18.8, "rc": 0, "timed_out": False}
    del redone["error"]
    other = {**redone, "variant": "iptables-nft", "wall": 166.0}
    daemon = [
        {"script": "bench_daemon.py", "bench": "daemon", "what": w, "services": 1000, "x": 1}
        for w in ("first_sync", "event_to_commit")
    ]
    machines = [{"bench": "machine", "date": d} for d in ("a", "b")]
    got = run.latest([machines[0], failed, other, *daemon, machines[1], redone])
    assert [r.get("wall") for r in got if r["bench"] == "cold_sync"] == [166.0, 18.8]
    assert [r["what"] for r in got if r["bench"] == "daemon"] == ["first_sync", "event_to_commit"]
    assert [r for r in got if r["bench"] == "machine"] == [machines[1]]


def test_run_measured_peak_rss_is_the_childs_not_the_parents() -> None:
    """A child exec'd from a large process reports its own peak, not the parent's (Linux keeps
    the old image's high-water mark in ``ru_maxrss`` across ``exec``)."""
    held = bytearray(300 << 20)
    for i in range(0, len(held), 4096):
        held[i] = 1
    grow = (
        "import time; b = bytearray(80 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(0.3)"
    )
    u = run_measured([dataplane.PY, "-c", grow])
    assert u.rc == 0, u.stderr
    assert 80 < u.rss_mib < 200
    del held
