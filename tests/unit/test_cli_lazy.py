"""The command line imports only the command it runs; what it prints, parses and returns is the
same as with every command loaded, for help, usage errors and typos alike."""

from __future__ import annotations

import argparse

import pytest

from nlproxy import cli

ARGVS = [
    pytest.param(["version"], id="version"),
    pytest.param(["version", "--json"], id="version-json"),
    pytest.param(["--log-level", "debug", "version"], id="flag-before"),
    pytest.param(["version", "--log-level", "debug"], id="flag-after"),
    pytest.param(["--log-l", "debug", "version"], id="abbreviated-flag"),
    pytest.param(["--v=5", "version"], id="verbosity"),
    pytest.param(["--netns", "version", "version", "-h"], id="netns-named-like-a-command"),
    pytest.param(["version", "-h"], id="command-help"),
    pytest.param(["rules", "--help"], id="rules-help"),
    pytest.param(["conntrack", "list", "--help"], id="conntrack-list-help"),
    pytest.param(["conntrack", "lst"], id="conntrack-typo"),
    pytest.param(["-h"], id="help"),
    pytest.param(["-h", "version"], id="help-before-command"),
    pytest.param(["--he", "version"], id="abbreviated-help"),
    pytest.param(["--version"], id="dash-dash-version"),
    pytest.param(["--version", "rules"], id="dash-dash-version-then-command"),
    pytest.param(["versio"], id="typo"),
    pytest.param([], id="nothing"),
    pytest.param(["--bogus", "version"], id="unknown-flag-before"),
    pytest.param(["version", "--bogus"], id="unknown-flag-after"),
    pytest.param(["version", "extra"], id="extra-word"),
    pytest.param(["--log-level", "loud", "version"], id="bad-choice"),
    pytest.param(["--netns"], id="missing-value"),
    pytest.param(["rules", "--json", "--family"], id="command-missing-value"),
    pytest.param(["--log-level=debug", "version"], id="flag-with-equals"),
    pytest.param(["--netns=version", "rules", "-h"], id="netns-with-equals-named-like-a-command"),
    pytest.param(["-v5", "version"], id="short-flag-with-its-value"),
    pytest.param(["--netns", "-x", "version"], id="value-like-a-flag"),
    pytest.param(["--", "version"], id="double-dash"),
    pytest.param(["-", "version"], id="single-dash"),
    pytest.param(["--log-format", "json", "-v", "4", "conntrack", "list", "-h"], id="flags"),
]


def outcome(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[int | str, str, str, argparse.Namespace | None]:
    parser = cli._parser_for(argv)
    try:
        args: argparse.Namespace | None = parser.parse_args(argv)
        status: int | str = 0
    except SystemExit as exc:
        args, status = None, str(exc.code)
    out = capsys.readouterr()
    return status, out.out, out.err, args


@pytest.mark.parametrize("argv", ARGVS)
def test_one_command_parses_as_all_commands_do(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lazy = outcome(argv, capsys)
    monkeypatch.setattr(cli, "_parser_for", lambda _argv: cli.build_parser())
    whole = outcome(argv, capsys)
    assert lazy == whole


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        pytest.param(["version"], "version", id="version"),
        pytest.param(["--netns", "rules", "version"], "version", id="netns-named-like-a-command"),
        pytest.param(["conntrack", "list", "rules"], "conntrack", id="command-word-after"),
        pytest.param(["--v=4", "--netns=x", "version"], "version", id="flags-with-equals"),
    ],
)
def test_parsing_a_command_loads_that_command_alone(argv: list[str], command: str) -> None:
    parser = cli._parser_for(argv)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    described = {name for name, p in sub.choices.items() if p.description}
    assert described == {command}
