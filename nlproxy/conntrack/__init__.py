"""Stage ⑤, an effect of a sync: conntrack flows that lost their endpoint.

- ``plan``: which flows are stale, from the programmed frontends before and after (pure).
- ``messages``: nlproxy's own ctnetlink codec (dump, filter, delete).
- ``kernel``: the ctnetlink socket: list and delete flows.
- ``sysctl``: kube-proxy's conntrack sysctls, set at daemon start.
- ``query``: ``nlproxy conntrack list|flush``: select flows (filters, a Service, stale ones),
  print or delete them.
"""
