"""Stage ②, the planner, pure: no I/O, clock or logging.

- ``config``: the node facts and options the planner needs, validated once.
- ``endpoints``: which endpoints of a service port this node sends traffic to.
- ``naming``: the name of every nftables object nlproxy creates.
- ``skeleton``: the static chains and sets, and the shared dispatch chains.
- ``planner``: cluster snapshot → the desired rulesets and a per-port summary.
- ``affinity``, ``balance``, ``hashring``: ClientIP affinity, round-robin and consistent hashing.
- ``budget``: which round-robin/consistent-hash Services fit the element budget (else random).
- ``fragments``, ``changes``, ``incremental``: each service's part of a plan, replayed or
  updated in place for the services that changed.
- ``tracer``: where a new connection goes through a planned ruleset.
- ``layout``: the shape read backwards: programmed maps → frontends → backends.
"""

# Modules here import msgspec, whose C initialisation imports ``datetime`` itself and loses a
# Ctrl-C that arrives during that import (the command then runs on). Imported first, in Python,
# an interrupt at any import still ends the command with 130 (tests/unit/test_interrupt.py).
import datetime  # noqa: F401
