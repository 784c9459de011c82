"""The process's own machinery, below every stage: what ``cluster/`` and ``proxy/`` up to
``daemon/`` may all use, and nothing of the cluster, the rules or the node's state.

- ``hotpath``: the hot path's memory policy (msgspec values, the collector paused while
  long-lived objects are built, frozen after a full sync) and what it was measured to save.
- ``imports``: packages entered without their ``__init__`` (``bare``), and a module's rarely
  used imports deferred to their first use (``deferring``).
- ``inotify``: the kernel's file-change events over ctypes (the manifests directory, the
  ``--config`` file's directories).

It imports nothing itself: importing one of its modules brings in only that module.
"""
