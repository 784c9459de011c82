"""What ``nlproxy run`` imports on its way to the first sync: modules it needs only later (or
never) stay unimported until used, and work as before once they are. Each case runs in a fresh
interpreter (the modules must not be imported already)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

DAEMON_PATH = (
    "import nlproxy.cli, nlproxy.commands.run, nlproxy.daemon.run, nlproxy.cluster.kube, "
    "nlproxy.sync.preload\n"
)
"""The modules the daemon has imported by the time its API source lists (``daemon/run.py``
imports the source's modules as it builds the source)."""


def _run(code: str) -> object:
    """The JSON value the code prints last, run in a fresh interpreter once the daemon's
    modules are imported (``DAEMON_PATH``)."""
    prelude = f"import json, sys\nsys.path.insert(0, {str(ROOT)!r})\n" + DAEMON_PATH
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_pyroute2_is_imported_by_the_inspectors_first_look_not_at_start() -> None:
    """The inspector classifies after the first sync: pyroute2 (~50 ms of imports) is not on
    the way there, and the first dump imports it and reads the node as before."""
    out = _run(
        """
        before = sorted(m for m in sys.modules if m.split(".")[0] == "pyroute2")
        from nlproxy.inspect.rtnl import RtnlNode
        import socket
        node = RtnlNode()
        snap = node.dump([socket.AF_INET])
        addrs = node.addresses()
        print(json.dumps([before, "pyroute2.iproute" in sys.modules,
                          any(link.name == "lo" for link in snap.links.values()),
                          "127.0.0.1" in map(str, addrs)]))
        """
    )
    assert out == [[], True, True, True]
