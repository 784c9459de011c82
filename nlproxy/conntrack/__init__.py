"""Stage ⑤, an effect of a sync: conntrack flows that lost their endpoint.

- ``plan``: which flows are stale, from the programmed frontends before and after (pure).
- ``messages``: nlproxy's own ctnetlink codec (dump, filter, delete), its attribute tree declared
  once (``CT_MESSAGE``).
- ``lines``: ``conntrack -L`` lines straight from the bytes, by layouts learnt from that tree.
- ``kernel``: the ctnetlink socket: list and delete flows (``Flows``, what the sync needs).
- ``fake``: flows in memory, standing in for ``kernel``'s ``Conntrack`` in unit tests.
- ``sysctl``: kube-proxy's conntrack sysctls, set at daemon start.

``nlproxy conntrack list|flush`` uses this machinery from ``operate/conntrack.py``.
"""
