"""The operator commands' logic, one module per command, read only but for ``conntrack flush``.

Each gathers what the kernel (and a running daemon, or a manifests directory) says and returns
values or text; none parses a command line (``commands/`` does) and the daemon imports none.

- ``status``, ``status_render``: ``nlproxy status``: ask a running daemon over its health and
  metrics ports, and show what it said.
- ``conntrack``: ``nlproxy conntrack list|flush``: select flows (filters, a Service, stale ones),
  print or delete them.
- ``inspect``: ``nlproxy inspect``'s rows: programmed endpoints joined with their verdicts.
"""
