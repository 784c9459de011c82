"""Command line: ``main(argv) -> int`` wires subcommands (``nlproxy/commands/``) together.

Thin: parsing and dispatch only. Exit codes: 0 ok, 1 runtime failure, 2 usage or configuration
error, 3 applied but some objects were invalid and left out, 4 ``inspect`` found unreachable
endpoints.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any, NoReturn, cast

import nlproxy.commands
from nlproxy import __version__
from nlproxy.errors import ConfigError, NlproxyError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE, as a tool killed by a closed pipe (``nlproxy rules | head``) exits."""
EXIT_INTERRUPTED = 130
"""128 + SIGINT (Ctrl-C)."""

LEVELS = ("debug", "info", "warning", "error")


def _verbosity(text: str) -> str:
    """kube-proxy's ``-v N``/``--v=N`` as a log level: 0..3 info, 4 and more debug."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    return "debug" if n >= 4 else "info"


def _global_flags(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The flags every command takes, before or after the command's name. On a subcommand they
    default to "not given" (SUPPRESS), so they never undo the same flag given before it."""

    def default(value: object) -> dict[str, Any]:
        return {"default": value if top else argparse.SUPPRESS}

    parser.add_argument(
        "--netns",
        metavar="NAME",
        help="work in this named network namespace (default: the current one)",
        **default(None),
    )
    parser.add_argument("--log-level", choices=LEVELS, **default("info"))
    parser.add_argument(
        "-v",
        "--v",
        dest="log_level",
        type=_verbosity,
        metavar="N",
        help="kube-proxy's verbosity: 0-3 is --log-level info, 4 and more debug",
        default=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--log-format",
        choices=["auto", "json", "console"],
        help="auto: console on a terminal, JSON lines otherwise",
        **default("auto"),
    )


def _names() -> list[str]:
    """The subcommands' module names, found without importing them: a directory listing
    (``pkgutil.iter_modules`` would cost ``nlproxy version`` a tenth of its time in imports)."""
    return sorted(
        {
            name.removesuffix(".py")
            for path in nlproxy.commands.__path__
            for name in os.listdir(path)
            if name.endswith(".py") and not name.startswith("_")
        }
    )


def _command(name: str) -> ModuleType:
    return importlib.import_module(f"nlproxy.commands.{name}")


def _commands() -> list[ModuleType]:
    return sorted((_command(name) for name in _names()), key=lambda m: str(m.NAME))


def _columns() -> int:
    """The terminal's width as ``shutil.get_terminal_size`` finds it for argparse's help
    (``$COLUMNS``, else stdout's terminal, else 80), without importing ``shutil``: it loads the
    bz2 and lzma libraries, milliseconds of every command's start."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class _Formatter(argparse.HelpFormatter):
    """argparse's help formatter, its width found by :func:`_columns`."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        width = _columns() - 2 if width is None else width
        super().__init__(prog, indent_increment, max_help_position, width)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help formatter is :class:`_Formatter` unless told otherwise;
    the commands' subparsers are made of the same class (argparse's default). No flag may be
    abbreviated: ``run --manifest DIR`` is a typo, not ``--manifests`` (kube-proxy's flag
    library takes no prefixes either)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """One line naming the flag, and exit 2: the whole usage (50 lines for ``run``) would
        bury the one line that says what is wrong; ``--help`` shows it."""
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser(only: ModuleType | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``only``, that one command's arguments and every other
    command as a bare name (what parsing that command shows is the same either way)."""
    parser = _Parser(
        prog="nlproxy",
        description="Kubernetes service proxy that programs nftables over netlink.",
    )
    parser.add_argument("--version", action="version", version=f"nlproxy {__version__}")
    _global_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    if only is None:
        for mod in _commands():
            _add_command(sub, mod)
    else:
        for name in _names():
            if name == only.NAME:
                _add_command(sub, only)
            else:
                sub.add_parser(name, add_help=False)  # a name alone: never parsed
    return parser


def _add_command(sub: Any, mod: ModuleType) -> None:
    p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
    mod.add_arguments(p)
    _global_flags(p, top=False)
    p.set_defaults(func=mod.run)


_VALUED = frozenset({"--netns", "--log-level", "-v", "--v", "--log-format"})
"""The global flags that take a value (``_global_flags``)."""


def _probe(argv: Sequence[str]) -> str | None:
    """The word naming the command ``argv`` runs, read past the global flags as the parser
    reads them; None where only the parser can tell (help, ``--version``, an abbreviated or
    unknown flag, a missing value, no command at all). Saves building a second parser for
    every command line: each parser asks gettext for its titles' translations."""
    words = iter(argv)
    for word in words:
        if not word.startswith("-") or word == "-":
            return word
        name, eq, _ = word.partition("=")
        if name not in _VALUED or (not eq and next(words, None) is None):
            return None
    return None


def _parser_for(argv: Sequence[str] | None) -> argparse.ArgumentParser:
    """The parser for ``argv``: when the probe names one command, a parser importing that
    command alone (``nlproxy version`` loads no netlink, Kubernetes or metrics code); for help,
    ``--version``, a typo or no command at all, the whole one."""
    command = _probe(sys.argv[1:] if argv is None else argv)
    if command is None or command not in _names():
        return build_parser()
    mod = _command(command)
    if command != mod.NAME:
        return build_parser()
    return build_parser(only=mod)


def main(
    argv: Sequence[str] | None = None, *, command_starts: Callable[[], None] | None = None
) -> int:
    """Run nlproxy with ``argv`` (default ``sys.argv[1:]``) and return the exit status;
    ``command_starts`` is called once the command's modules are loaded, as it starts."""
    parser = _parser_for(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors and 0 on --help
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    func = cast(Callable[[argparse.Namespace], int], args.func)
    from nlproxy import log

    # A command that does not log as it starts says so (LOGS = False): its logging is set up
    # only if it makes a logger after all.
    if getattr(sys.modules[func.__module__], "LOGS", True):
        log.configure(level=args.log_level, fmt=args.log_format)
    else:
        log.defer(level=args.log_level, fmt=args.log_format)
    try:
        if command_starts is not None:
            command_starts()
        return func(args)
    except BaseException as exc:  # noqa: BLE001 - every ending is turned into one line here
        return _ending(exc, args)
    finally:
        log.undefer()


def _ending(exc: BaseException, args: argparse.Namespace) -> int:
    """The exit status for an exception, with at most one line on stderr; never a traceback
    for what a user can cause. A group (trio's nurseries raise them) is judged by its most
    telling member: a configuration error, then any other named error."""
    if isinstance(exc, BaseExceptionGroup):
        leaves = list(_leaves(exc))
        for kind in (KeyboardInterrupt, ConfigError, NlproxyError, BrokenPipeError, OSError):
            for leaf in leaves:
                if isinstance(leaf, kind):
                    return _ending(leaf, args)
        exc = leaves[0] if leaves else exc
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, SystemExit):
        return int(exc.code) if isinstance(exc.code, int) else EXIT_FAILURE
    if isinstance(exc, BrokenPipeError):
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    if isinstance(exc, ConfigError):
        _say(f"nlproxy: {exc}")
        return EXIT_USAGE
    if isinstance(exc, NlproxyError):
        _say(f"nlproxy: {exc}")
        return EXIT_FAILURE
    if isinstance(exc, OSError):
        hint = " (nlproxy needs CAP_NET_ADMIN)" if exc.errno == errno.EPERM else ""
        _say(f"nlproxy: {args.command}: {exc.strerror or exc}{hint}")
        return EXIT_FAILURE
    if not isinstance(exc, Exception):
        raise exc  # GeneratorExit and the like: not ours to turn into a status
    # A bug, not something the user did: one line, and the stack where it is asked for.
    if getattr(args, "log_level", "info") == "debug":
        import traceback

        traceback.print_exception(exc)
    _say(
        f"nlproxy: {args.command}: internal error: {type(exc).__name__}: {exc} "
        "(run with --log-level debug for the stack)"
    )
    return EXIT_FAILURE


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


def _say(line: str) -> None:
    with contextlib.suppress(OSError):  # stderr closed too: nothing more to say
        print(line, file=sys.stderr)


def _quiet_stdout() -> None:
    """After a closed pipe, point stdout at /dev/null so the interpreter's final flush does
    not report the same broken pipe again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def entry(
    *,
    command_starts: Callable[[], None] | None = None,
    command_ended: Callable[[], None] | None = None,
) -> None:
    """Console-script entry point. Errors writing to stderr are dropped (``SafeStream``): a log
    line that cannot be written must not end the daemon or fail a sync that was applied.

    ``__main__`` makes Ctrl-C end the process at once while the modules load, and passes what
    changes that: ``command_starts`` (Ctrl-C raises KeyboardInterrupt while the command runs,
    see :func:`main`) and ``command_ended`` (it ends the process quietly again once the
    command has returned and its output is flushed: no traceback from the interpreter's
    teardown).
    """
    from nlproxy.commands import _fastexit
    from nlproxy.log import SafeStream

    sys.stderr = SafeStream(sys.stderr)
    _fastexit.allow()
    try:
        status = main(command_starts=command_starts)
    except KeyboardInterrupt:  # Ctrl-C while the command ended
        status = EXIT_INTERRUPTED
    if command_ended is not None:
        command_ended()
        status = _fastexit.flushed(status)
        if status == EXIT_BROKEN_PIPE:
            _quiet_stdout()  # or the interpreter's last flush reports it again
    sys.exit(status)
