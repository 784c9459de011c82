"""Names and other user-provided text reach the operator's terminal escaped: a name holding
``ESC [ 2 J`` (clear the screen) or a newline (a forged line) prints as ``\\x1b[2J`` / ``\\n``."""

from __future__ import annotations

from pathlib import Path

import pytest

from nlproxy.config import DaemonConfig, Settings
from nlproxy.conntrack.fake import FakeConntrack
from nlproxy.nft.fake import FakeNftables
from nlproxy.operate.inspect import Target, render_table
from nlproxy.operate.run import run_once
from nlproxy.operate.text import printable, printable_lines
from nlproxy.proxy.config import ProxyConfig
from nlproxy.sync.kernel import SyncKernel

EVIL = "web\x1b[2J\nnlproxy: left out: nothing"


def test_printable_escapes_control_characters_only() -> None:
    assert printable(EVIL) == "web\\x1b[2J\\nnlproxy: left out: nothing"
    assert printable("tab\there\u202eRTL\x7f") == "tab\\there\\u202eRTL\\x7f"
    assert printable("caf\u00e9 a\\b 10.0.0.1:80/TCP") == "caf\u00e9 a\\b 10.0.0.1:80/TCP"
    assert printable(42) == "42"
    # Rendered text keeps its own line breaks; values are escaped before they are rendered.
    assert printable_lines("head\n  web\x1b[2J\tx\n") == "head\n  web\\x1b[2J\\tx\n"


def test_run_once_prints_an_invalid_objects_name_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "m"
    d.mkdir()
    name = EVIL.replace("\x1b", "\\e").replace("\n", "\\n")  # YAML double-quoted escapes
    (d / "svc.yaml").write_text(
        "apiVersion: v1\nkind: Service\n"
        f'metadata: {{name: "{name}", namespace: default}}\n'
        "spec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}\n"
    )
    s = Settings(daemon=DaemonConfig(node_name="n"), proxy=ProxyConfig(node_name="n"), manifests=d)
    nft = FakeNftables("node")
    kernel = SyncKernel(tables=nft.open, readback=nft, flows=FakeConntrack())
    assert run_once(s, kernel=kernel) == 3
    err = capsys.readouterr().err
    assert "\x1b" not in err
    assert "web\\x1b[2J\\nnlproxy: left out: nothing" in err
    assert [
        line for line in err.splitlines() if line.startswith("nlproxy: left out: nothing")
    ] == []


def test_inspect_table_escapes_a_programmed_name() -> None:
    endpoints: dict[str, list[Target]] = {f"default/{EVIL}:http/TCP": []}
    text = render_table(endpoints, [])
    assert text == "default/web\\x1b[2J\\nnlproxy: left out: nothing:http/TCP\n  (no endpoints)"
