"""The command line's own behaviour: help, version, usage errors."""

import json
import os

import pytest

from nlproxy.cli import main


def test_version_names_nlproxy_libnftnl_and_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version", "--json"]) == 0
    v = json.loads(capsys.readouterr().out)
    assert v["kernel"] == os.uname().release
    assert v["libnftnl"].count(".") >= 1, v
    assert v["nlproxy"]


def test_help_lists_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "version" in capsys.readouterr().out


def test_unknown_subcommand_is_a_usage_error() -> None:
    assert main(["no-such-command"]) == 2


def test_no_subcommand_is_a_usage_error() -> None:
    assert main([]) == 2
