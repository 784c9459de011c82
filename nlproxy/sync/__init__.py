"""Stage ④, one sync and the loop that runs them.

- ``syncer``: one sync: plan, diff against what is programmed, commit, then the effects (conntrack).
- ``isolation``: a Service the kernel refuses is left out and retried when it changes.
- ``loop``: the rate-limited loop (min sync period, periodic verify, retries) the daemon runs.
"""
