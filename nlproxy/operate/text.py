"""Text from the cluster or the kernel, made safe to print on an operator's terminal.

An object's name, a comment read back from the kernel or a manifest's field is user-provided:
printed raw, a name holding ``ESC [ 2 J`` clears the terminal, a newline forges a line. Every
plain-text line the operator commands print goes through :func:`printable` (one value) or
:func:`printable_lines` (rendered text, whose own line breaks are kept). JSON output needs
neither: the encoder escapes control characters.
"""

from __future__ import annotations


def printable(text: object) -> str:
    """``str(text)`` with every character that does not print (control characters, newline and
    tab included, and format characters such as bidirectional overrides) written as ``repr``
    writes it (``\\x1b``, ``\\n``, ``\\u202e``); printable text, backslashes included, is kept."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in s)


def printable_lines(text: str) -> str:
    """Rendered multi-line text with each line made :func:`printable`: its line breaks (``\\n``)
    are kept, any other control character is escaped."""
    return "\n".join(printable(line) for line in text.split("\n"))
