"""Stage ③, the kernel's objects: nftables as a typed IR, written and read over netlink.

Knows no Kubernetes and no Services (the layering test holds it to that); one table per family,
owned whole by nlproxy.

- ``ir``: the nouns (``Table``, ``Chain``, ``Rule``, ``Set``, ``Map``, ``Element``), expression
  trees and the verbs of a transaction; ``packed``: a set's elements held as the kernel's bytes.
- ``tables``: what the sync needs of nftables, as two small interfaces (a table, a read-back).
- ``view``: a ruleset brought forward by a committed batch, written once for the fake, the
  programmed cache, the backend's view of declarations and validation.
- ``values``, ``uapi``, ``udata``, ``jhash``: values in the kernel's byte layout, the kernel's
  expression numbers, libnftnl's userdata TLVs, the kernel's ``jhash``.
- Planned → programmed: ``reconcile`` (the smallest transaction, pure), ``validate`` and
  ``bulkcheck`` (checked before anything is sent), ``elements`` (runs of element operations).
- Writing: ``lower`` (IR expressions → netlink expressions), ``encode`` (a transaction → one
  nfnetlink batch through the native shim), ``backend`` (send it, collect every ack, name what
  the kernel refused, keep the programmed cache).
- Reading back: ``dump`` (requests and replies), ``decode`` (netlink expressions → IR),
  ``readsets`` (sets, maps, elements), ``readback`` (one table into a ``Ruleset``), ``counters``.
- ``dynmap``: a dynamic map's stale clients (ClientIP affinity): read what the packet path
  learned, delete the clients of endpoints that went.
- ``render``: nft's own text (``nlproxy rules``, goldens) and JSON.
- ``monitor``: other writers changing nlproxy's tables (drift): the generation watch the daemon
  runs (no multicast membership), and the notification monitor that names writers.
- ``fake``: in-memory tables for tests and tools: apply to a copy, commit on success, read back
  as the kernel does; ``FakeNftables``/``FakeTables`` stand in for ``readback``/``backend``.
"""

# Modules here import msgspec, whose C initialisation imports ``datetime`` itself and loses a
# Ctrl-C that arrives during that import (the command then runs on). Imported first, in Python,
# an interrupt at any import still ends the command with 130 (tests/unit/test_interrupt.py).
import datetime  # noqa: F401
