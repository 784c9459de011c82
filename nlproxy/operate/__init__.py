"""The operator commands' logic, one module per command; read only but for ``conntrack flush``,
``cleanup`` and ``run --once``.

Each gathers what the kernel (and a running daemon, or a manifests directory) says and returns
values or text; none parses a command line (``commands/`` does) and the daemon imports none.

- ``status``, ``status_render``: ``nlproxy status``: ask a running daemon over its health and
  metrics ports, and show what it said.
- ``services``: ``nlproxy services``: every programmed frontend with its backends.
- ``explain``, ``explain_render``: ``nlproxy explain``: one Service's objects, programmed rules,
  flows, endpoints, problems and a trace, joined; and as text or JSON. Its halves, also read by
  ``services``: ``programmed`` (a Service's programmed rules, recovered from the kernel's maps),
  ``manifests`` (what a manifests directory says of it), ``trace`` (a new connection traced
  through the programmed rules).
- ``inspect``: ``nlproxy inspect``'s rows: programmed endpoints joined with their verdicts.
- ``conntrack``: ``nlproxy conntrack list|flush``: select flows (filters, a Service, stale ones),
  print or delete them.
- ``preflight``: ``nlproxy preflight``: what would bite a kube-proxy node's switch to nlproxy.
  Its API server checks are in ``preflight_api``; the findings both make in ``findings``.
- ``run``: ``nlproxy run --once``: reconcile once from a manifests directory, name what was
  left out (``run`` without ``--once`` is the daemon, ``daemon/``'s). ``inputs``: the snapshot a
  one-shot sync plans from (shared with ``plan``).
- ``plan``, ``plan_report``, ``plan_render``: ``nlproxy plan``: the next sync run with nothing
  applied, its batches told per Service, as text or JSON.
- ``compare``: ``nlproxy compare``: kube-proxy's live rules traced against nlproxy's plan.
- ``rules``: ``nlproxy rules``: nlproxy's tables read back, nft-like or as JSON.
- ``version``: ``nlproxy version``: nlproxy's, libnftnl's and the kernel's versions.
- ``cleanup``: ``nlproxy cleanup``: nlproxy's tables removed, or (``--kube-proxy``) every
  kube-proxy mode's rules.
"""
