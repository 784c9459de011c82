"""``bench_set_size.py`` at a small size: both declarations load, and the kernel keeps the
size the sized one declares (``nft list`` shows it), so the two rows differ in that alone."""

from __future__ import annotations

import subprocess
import tempfile

from bench.bench_commit import TABLE, nft_text
from checks.script import run_script
from tests.netns import namespace


def test_both_variants_load() -> None:
    rows = run_script("bench_set_size.py", "--services", "30", "--endpoints", "2", "--rounds", "1")
    assert [r["variant"] for r in rows] == ["no_size", "size"]
    assert all(r["sys_s"] >= 0 and r["sys_us_per_element"] >= 0 for r in rows)


def test_the_kernel_keeps_the_declared_size() -> None:
    sized = nft_text(30, 2).replace("map backends { typeof", "map backends { size 60; typeof")
    with tempfile.NamedTemporaryFile("w", suffix=".nft") as f, namespace("nlpsz") as ns:
        f.write(sized)
        f.flush()
        subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", f.name], check=True)
        listed = subprocess.run(
            ["ip", "netns", "exec", ns, "nft", "list", "map", "ip", TABLE.name, "backends"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    assert "size 60" in listed
