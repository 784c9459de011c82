"""The daemon: wiring only.

- ``run``: the nursery: source, sync loop, HTTP, monitors, in order.
- ``stop``: the bounded stop: signals, and a deadline after which the process ends as it stands.
- ``memory``: malloc tuning for a long-lived process with a large plan; its ``release`` is
  handed to the sync loop (sync/ does not import daemon/).
- ``foreign``: the look for another proxy's rules on the node: when it looks, what it says.
- ``systemd``: sd_notify readiness and watchdog.
- ``nslock``: one nlproxy per network namespace.
"""
