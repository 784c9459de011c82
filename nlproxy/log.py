"""structlog set-up: JSON lines when stderr is not a terminal (journald), console when it is.

Events are dotted verbs (``sync.applied``) with stable keys (``service``, ``ops``, ``duration_ms``).
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    import structlog


_WRITE = threading.Lock()
"""One lock for every log line: structlog and the standard library's handler each lock only
their own writes, and both write to stderr from several threads (the watch threads' urllib3)."""


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at the time of writing, not when logging was set up
    (an embedding program or a test harness may swap it). Each caller writes a whole line in one
    call, and the lock keeps lines from different threads apart."""

    def write(self, text: str) -> int:
        with _WRITE:
            return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


class SafeStream:
    """A text stream whose write errors are dropped, not raised.

    Logging must never end the proxy: with journald gone, a full disk behind a redirection or a
    closed pipe, a log line is lost and the node keeps its rules and its syncs. ``lost`` counts
    the writes dropped.
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.lost = 0

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except (OSError, ValueError):  # ValueError: the stream was closed
            self.lost += 1
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except (OSError, ValueError):
            self.lost += 1

    def isatty(self) -> bool:
        try:
            return self.stream.isatty()
        except (OSError, ValueError):
            return False

    def fileno(self) -> int:
        return self.stream.fileno()

    def __getattr__(self, name: str) -> object:
        return getattr(self.stream, name)


_deferred: dict[str, str] = {}
"""The settings ``defer`` kept for the first logger. Process-wide, as logging's own set-up is."""


def defer(*, level: str = "info", fmt: str = "auto") -> None:
    """Configure logging as :func:`configure` would, but only when the first logger is made: a
    command that never logs loads neither structlog nor the standard library's logging, and one
    that logs after all still writes its lines as asked."""
    _deferred.clear()
    _deferred.update(level=level, fmt=fmt)


def undefer() -> None:
    """Forget what :func:`defer` kept: a command's set-up does not outlive the command (a
    program that called it in-process makes its own loggers afterwards, or a test its own
    capture, which a late set-up would replace)."""
    _deferred.clear()


_own: dict[str, object] = {}
"""What :func:`configure` set up (processors, level filter), for :func:`warn`."""


def warn(event: str, message: str, **fields: object) -> None:
    """A warning a command gives before (or without) any logger of its own: one log line in the
    format asked for (JSON with ``--log-format json``: a pod's first line is read by machines)
    once logging is set up, else ``nlproxy: warning: message`` on stderr.

    Written with the set-up :func:`configure` made, whatever structlog's global configuration
    became since (an embedding program's or a test's)."""
    if _deferred:
        configure(**_deferred)
    if not _own:
        with _WRITE:
            print(f"nlproxy: warning: {message}", file=sys.stderr)
        return
    import structlog

    logger = structlog.wrap_logger(structlog.WriteLogger(_CurrentStderr()), **_own)  # type: ignore[arg-type]
    logger.bind(component="nlproxy").warning(event, message=message, **fields)


def configure(*, level: str = "info", fmt: str = "auto") -> None:
    """Configure logging for the process; ``fmt`` is ``auto``, ``json`` or ``console``.

    structlog renders nlproxy's events; the standard library's records (urllib3, the kubernetes
    client, ``warnings``) go through the same renderer, so in JSON mode every line on stderr is
    one JSON object. Exceptions logged with ``exc_info`` carry their stack as ``exception``.
    """
    import logging

    import structlog  # here, not at the top: ``nlproxy version`` loads neither

    _deferred.clear()

    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=False)
        if use_console
        else structlog.processors.JSONRenderer(sort_keys=True)
    )
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    numeric = logging.getLevelNamesMapping()[level.upper()]
    _own.update(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            stamp,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
    )
    structlog.configure(
        processors=_own["processors"],  # type: ignore[arg-type]
        wrapper_class=_own["wrapper_class"],  # type: ignore[arg-type]
        # WriteLogger writes the line and its newline in one call (PrintLogger's print() makes
        # two, between which another thread's line could land).
        logger_factory=structlog.WriteLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(_CurrentStderr())
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                stamp,
                structlog.processors.format_exc_info,
            ],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(numeric)
    # Off, then on: the hook is re-installed even if something replaced warnings.showwarning
    # since an earlier call (captureWarnings(True) alone does nothing the second time).
    logging.captureWarnings(False)
    logging.captureWarnings(True)


def get_logger(component: str) -> structlog.typing.FilteringBoundLogger:
    """A logger bound to ``component`` (logging set up first where it was deferred)."""
    import structlog

    if _deferred:
        configure(**_deferred)

    return structlog.get_logger().bind(component=component)  # type: ignore[no-any-return]
