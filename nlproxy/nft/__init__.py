"""Stage ③, the kernel's objects: nftables as a typed IR, written and read over netlink.

Knows no Kubernetes and no Services (the layering test holds it to that); one table per family,
owned whole by nlproxy.

- ``ir``: the nouns (``Table``, ``Chain``, ``Rule``, ``Set``, ``Map``, ``Element``), expression
  trees and the verbs of a transaction.
- ``values``, ``uapi``, ``udata``, ``jhash``: values in the kernel's byte layout, the kernel's
  expression numbers, libnftnl's userdata TLVs, the kernel's ``jhash``.
- Planned → programmed: ``reconcile`` (the smallest transaction, pure), ``validate`` and
  ``bulkcheck`` (checked before anything is sent), ``elements`` (runs of element operations).
- Writing: ``lower`` (IR expressions → netlink expressions), ``encode`` (a transaction → one
  nfnetlink batch through the native shim), ``backend`` (send it, collect every ack, name what
  the kernel refused, keep the programmed cache).
- Reading back: ``dump`` (requests and replies), ``decode`` (netlink expressions → IR),
  ``readsets`` (sets, maps, elements), ``readback`` (one table into a ``Ruleset``), ``counters``.
- ``render``: nft's own text (``nlproxy rules``, goldens) and JSON.
- ``monitor``: notifications of other writers changing nlproxy's tables (drift).
- ``fake``: an in-memory table for tests and tools: applies to a copy, commits on success.
"""
