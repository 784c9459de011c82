"""``python -m nlproxy`` and the ``nlproxy`` command: the entry point, kept free of imports.

Ctrl-C while the command line's modules load would otherwise end in a traceback from whichever
import it interrupted (or in an "Exception ignored" note from the import machinery, the command
going on). So the first thing the command does is to make SIGINT end it at once, quietly, with
130 (nothing is written yet, nothing is lost); ``cli.main`` gives Ctrl-C back its usual
KeyboardInterrupt just before the command itself runs, and ``cli.entry`` takes it away again
once the command has returned. A process started with SIGINT ignored keeps ignoring it.
"""

# Only modules the interpreter has loaded before this runs, so that the handler is set at once:
# ``_signal`` is the C module behind ``signal`` (which builds its enums on import, a millisecond
# in which Ctrl-C would still end in a traceback), and nothing imports ``types`` for a hint.
import _signal  # type: ignore[import-not-found]  # no stub: typeshed covers signal only
import os

EXIT_INTERRUPTED = 130
"""128 + SIGINT, as ``cli.EXIT_INTERRUPTED``."""


def _interrupted(signum: int, frame: object) -> None:
    os._exit(EXIT_INTERRUPTED)


def _quiet() -> None:
    """Ctrl-C ends the process at once, with 130."""
    _signal.signal(_signal.SIGINT, _interrupted)


def _interruptible() -> None:
    """Ctrl-C raises KeyboardInterrupt (the command's own handling, trio's included)."""
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)


_HELD = _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler
if _HELD:
    _quiet()


def entry() -> None:
    """The console script's entry point."""
    from nlproxy.cli import entry as run

    if _HELD:
        run(command_starts=_interruptible, command_ended=_quiet)
    else:
        run()


if __name__ == "__main__":
    entry()
