"""The command-line reference in ``docs/cli.md``, generated from nlproxy's own parser.

``python -m tests.cli_reference > docs/cli.md`` writes it; ``tests/unit/test_cli_reference.py``
fails when the file and the parser disagree, so every flag of every command is documented.
"""

from __future__ import annotations

import argparse

from nlproxy.cli import build_parser

HEADER = """# Command-line reference

Every command and flag, generated from nlproxy's own argument parser
(`python -m tests.cli_reference > docs/cli.md`; a test fails when this file is out of date).
The README explains what the commands are for, the exit codes and the metrics.
"""


def _flag(action: argparse.Action) -> str:
    choices = "{" + ",".join(map(str, action.choices)) + "}" if action.choices else None
    if not action.option_strings:  # a positional argument
        return f"`{choices or action.metavar or action.dest}`"
    names = ", ".join(f"`{o}`" for o in action.option_strings)
    if action.nargs != 0:
        names += f" {choices or action.metavar or action.dest.upper()}"
    return names


def _options(parser: argparse.ArgumentParser) -> list[str]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if action.help == argparse.SUPPRESS:
            continue
        text = " ".join((action.help or "").split())
        out.append(f"- {_flag(action)}: {text}" if text else f"- {_flag(action)}")
    return out


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return sorted(action.choices.items())
    return []


def reference() -> str:
    parser = build_parser()
    lines = [HEADER, "## Global flags", "", "Taken before or after the command's name.", ""]
    lines += _options(parser)
    for name, sub in _subcommands(parser):
        lines += ["", f"## nlproxy {name}", "", " ".join((sub.description or "").split()), ""]
        lines += [o for o in _options(sub) if o not in _options(parser)]
        for inner, subsub in _subcommands(sub):
            lines += [
                "",
                f"### nlproxy {name} {inner}",
                "",
                " ".join((subsub.description or "").split()),
                "",
            ]
            lines += [o for o in _options(subsub) if o not in _options(parser)]
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(reference(), end="")
