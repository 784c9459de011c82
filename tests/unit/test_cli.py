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


def test_exception_groups_end_in_one_line_with_the_members_status(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """trio's nurseries raise groups: the daemon's failures are judged by what is inside."""
    import argparse

    from nlproxy.cli import EXIT_INTERRUPTED, _ending
    from nlproxy.errors import ConfigError, NlproxyError

    args = argparse.Namespace(command="run", log_level="info")
    inner = ExceptionGroup("nursery", [RuntimeError("x"), ConfigError("--kubeconfig", "gone")])
    nested = BaseExceptionGroup("outer", [ExceptionGroup("inner", [inner])])
    assert _ending(nested, args) == 2
    assert capsys.readouterr().err == "nlproxy: --kubeconfig: gone\n"
    assert _ending(ExceptionGroup("g", [NlproxyError("table ip x", "busy")]), args) == 1
    assert _ending(BaseExceptionGroup("g", [KeyboardInterrupt()]), args) == EXIT_INTERRUPTED
    assert _ending(ValueError("bug"), args) == 1
    err = capsys.readouterr().err
    assert "internal error: ValueError: bug" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        pytest.param(["run", "--once", "--masquerade-bit", "40"], "--masquerade-bit", id="value"),
        pytest.param(["run", "--manifest", "d"], "--manifest", id="abbreviated"),
        pytest.param(["conntrack", "list", "--dport", "99999"], "--dport", id="port"),
        pytest.param(["bogus"], "bogus", id="command"),
    ],
)
def test_a_usage_error_is_one_line_naming_the_flag(
    argv: list[str], names: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # not argparse's whole usage above it
    assert names in err
    assert "--help" in err
