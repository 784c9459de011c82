"""Stage ⑤, the node as it is: can each endpoint be reached, whose rules are there.

- ``rtnl``: links, routes, neighbours and addresses from rtnetlink, as small values
  (``NodeRoutes``, ``RtnlNode``); ``fake``: a node in memory standing in for it.
- ``classify``: local, remote or unreachable, with the reason, for every endpoint.
- ``watch``: rtnetlink notifications that may change a verdict.
- ``reachability``: the daemon task keeping verdicts current and exported.
- ``foreign``: another proxy's rules (kube-proxy's tables and chains), found and removed.
- ``ipvs``: what kube-proxy's IPVS mode leaves outside nftables (ipsets, ``kube-ipvs0``, virtual
  servers), found and removed.
- ``kubeproxy``: kube-proxy's nftables tables read whole, as rulesets the tracer walks (for
  ``nlproxy compare``); ``iptables``: its iptables mode's chains in the iptables-nft tables,
  merged into one such ruleset, their compat expressions read by ``xt``.

``nlproxy inspect``'s rows (programmed endpoints joined with their verdicts) are
``operate/inspect.py``'s.
"""
