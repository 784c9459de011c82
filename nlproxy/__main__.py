"""``python -m nlproxy`` and the ``nlproxy`` command: the entry point, kept free of imports.

Ctrl-C while the command line's modules load (the first tenths of a second) would otherwise
end in a traceback from whichever import it interrupted: the imports happen here, inside the
handling, and an interrupt there exits 130 like one anywhere later (``cli.entry``).
"""

import sys


def entry() -> None:
    """The console script's entry point."""
    try:
        from nlproxy.cli import entry as run
    except KeyboardInterrupt:
        sys.exit(130)  # 128 + SIGINT, as cli.EXIT_INTERRUPTED
    run()


if __name__ == "__main__":
    entry()
