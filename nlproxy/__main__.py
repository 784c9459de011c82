"""``python -m nlproxy``: the same as the ``nlproxy`` command."""

from nlproxy.cli import entry

entry()
