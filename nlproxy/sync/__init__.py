"""Stage ④, one sync and the loop that runs them.

- ``syncer``: one sync: plan, diff against what is programmed, commit, then the effects
  (``cleanup``: the conntrack flows a commit left without their backend, an object it owns;
  ``batches``: its batches to the kernel, a backend per family, likewise).
- ``kernel``: what a Syncer is handed of the kernel (tables, read-back, flows): the real ones
  of a namespace, or fakes, so the whole sync runs in a unit test.
- ``verify``: the verify off the sync loop (read-back, comparison, a drift's repair prepared),
  an object the Syncer owns; ``restart`` and ``fingerprint``: the record of each commit kept in
  the tables and the start-up check that trusts it, likewise; ``result``: what a sync returns.
- ``isolation``: a Service the kernel refuses is left out and retried when it changes.
- ``keep``: while a source cannot read a place, the Services the tables held there at start
  are kept as programmed.
- ``balancing``: the load-balancing budget applied to each snapshot (random past it), the
  per-sync quota of tables, and the warnings for annotation values not understood.
- ``preload``: a cold start's pages into the state and the restart digest as they arrive
  (the API source's ``on_page``), and, once the Services (or the slices) are listed, the plan
  made ahead (``ahead``, an object the Syncer owns), so the first sync has only the lists' tail
  left.
- ``loop``: the rate-limited loop (min sync period, periodic verify, retries) the daemon runs;
  what it needs of the daemon (the memory release) is handed to it; ``report``: what the loop
  tells the outside (metrics, health, objects left out), an object the loop owns.
"""
