"""The daemon's look for IPVS leftovers on a node without IPVS: nothing found, and found
without opening a pyroute2 socket (its own event loop per look, the idle daemon's cost every
30 s); a ``kube-ipvs0`` that is not a dummy is still not kube-proxy's."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from nlproxy.inspect import ipvs
from tests.netns import sh

PROBE = """
import sys
from nlproxy.inspect import ipvs
found = ipvs.detect(sys.argv[1])
print(bool(found), "pyroute2" in sys.modules)
"""


def test_no_ipvs_is_found_without_pyroute2(make_netns: Callable[[str], str]) -> None:
    ns = make_netns("iv")
    out = subprocess.run(
        [sys.executable, "-c", PROBE, ns], check=True, capture_output=True, text=True
    ).stdout.split()
    assert out == ["False", "False"]


def test_a_kube_ipvs0_of_another_kind_is_not_kube_proxys(
    make_netns: Callable[[str], str],
) -> None:
    ns = make_netns("iv")
    """The device exists, so the look by pyroute2 runs (its kind decides; this kernel has no
    dummy devices, so a dummy's is covered by ``test_cleanup_ipvs.py``'s VM twin)."""
    sh("ip", "link", "add", "kube-ipvs0", "type", "bridge", ns=ns)
    assert ipvs.detect(ns).device is None
