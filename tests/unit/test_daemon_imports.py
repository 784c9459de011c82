"""What ``nlproxy run`` imports on its way to the first sync: modules it needs only later (or
never) stay unimported until used, and work as before once they are. Each case runs in a fresh
interpreter (the modules must not be imported already)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

DAEMON_PATH = (
    "import nlproxy.cli, nlproxy.commands.run, nlproxy.daemon.run, nlproxy.cluster.kube, "
    "nlproxy.sync.preload\n"
)
"""The modules the daemon has imported by the time its API source lists (``daemon/run.py``
imports the source's modules as it builds the source)."""


def _run(code: str, lines: int = 1) -> Any:
    """The JSON value the code prints last (the last ``lines`` values, with ``lines``), run in
    a fresh interpreter once the daemon's modules are imported (``DAEMON_PATH``)."""
    prelude = f"import json, sys\nsys.path.insert(0, {str(ROOT)!r})\n" + DAEMON_PATH
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    values = [json.loads(line) for line in done.stdout.splitlines()[-lines:]]
    return values[0] if lines == 1 else values


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
        from nlproxy.operate.preflight import packages
        print(json.dumps([before, "pyroute2.iproute" in sys.modules,
                          any(link.name == "lo" for link in snap.links.values()),
                          "127.0.0.1" in map(str, addrs), packages().level.value]))
        """
    )
    assert out == [[], True, True, True, "ok"]


def test_a_pyroute2_that_cannot_be_imported_is_a_config_error_naming_it() -> None:
    """pyroute2 is imported by the first rtnetlink call, long after start: a broken install
    must then be an ``NlproxyError`` (which the daemon's address watch logs and retries, and a
    command turns into one line, exit 2), not an ``ImportError`` out of the daemon's nursery.
    The next call tries the import again."""
    monitor, preflight, out = _run(
        """
        sys.modules["pyroute2.iproute"] = None  # what a broken or partial install looks like
        from nlproxy.errors import ConfigError
        from nlproxy.inspect.rtnl import RtnlNode
        from nlproxy.inspect import ipvs
        import structlog, trio
        from ipaddress import ip_address
        from nlproxy.inspect import reachability
        from prometheus_client import CollectorRegistry
        reachability.RETRY_AFTER = 0
        monitor = reachability.ReachabilityMonitor(CollectorRegistry())
        monitor._pending = {ip_address("10.1.0.1")}  # one endpoint to classify
        with structlog.testing.capture_logs() as logs:
            ok = trio.run(lambda: monitor._evaluate_guarded(full=True))
            for _ in range(2):  # the retries: said once while it lasts
                trio.run(lambda: monitor._evaluate_guarded(full=True))
        failed = [e for e in logs if e["event"] == "inspector.failed"]
        print(json.dumps([ok, [(e["log_level"], "exc_info" in e, e.get("error", "")[:16])
                               for e in failed]]))
        from nlproxy.operate.preflight import packages
        found = packages()
        print(json.dumps([found.check, found.level.value, found.text]))
        seen = []
        for call in (RtnlNode().addresses, RtnlNode().addresses,
                     lambda: ipvs._device(None, addresses=True)):
            try:
                call()
            except Exception as exc:
                seen.append([type(exc).__name__, isinstance(exc, ConfigError), str(exc)])
        print(json.dumps(seen))
        """,
        lines=3,
    )
    check, level, text = preflight
    assert (check, level) == ("packages", "FAIL")
    assert text.startswith("package pyroute2: cannot be imported")
    said = ["warning", False, "package pyroute2"]
    again = ["debug", False, "package pyroute2"]
    assert monitor == [False, [said, again, again]]
    assert len(out) == 3
    for name, is_config, line in out:
        assert (name, is_config) == ("ConfigError", True)
        assert line.startswith("package pyroute2: cannot be imported")
        assert "\n" not in line


def test_a_pyroute2_cut_off_mid_file_is_a_config_error_and_a_preflight_finding(
    tmp_path: Path,
) -> None:
    """A partial install can leave a module that does not even compile: that is the same
    ConfigError naming pyroute2, and preflight's ``packages`` finding, not a SyntaxError."""
    fake = tmp_path / "site" / "pyroute2"
    (fake / "netlink").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "netlink" / "__init__.py").write_text("")
    (fake / "netlink" / "exceptions.py").write_text("class NetlinkError(Exception): pass\n")
    (fake / "iproute.py").write_text("class IPRoute:\n    def close(self\n")  # cut off
    seen, found = _run(
        f"""
        sys.path.insert(0, {str(tmp_path / "site")!r})
        from nlproxy.errors import ConfigError
        from nlproxy.inspect.rtnl import RtnlNode
        try:
            RtnlNode().addresses()
            seen = None
        except ConfigError as exc:
            seen = str(exc)
        print(json.dumps(seen))
        from nlproxy.operate.preflight import packages
        found = packages()
        print(json.dumps([found.level.value, found.text]))
        """,
        lines=2,
    )
    assert seen.startswith("package pyroute2: cannot be imported (SyntaxError")
    assert found[0] == "FAIL"
    assert found[1].startswith("package pyroute2: cannot be imported (SyntaxError")
