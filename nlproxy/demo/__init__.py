"""Outside the flow: the throwaway node of ``nlproxy demo`` and the kernel tests.

- ``testbed``: a node, pods, a second node and an outside client in network namespaces.
- ``ns``: namespace and veth helpers for it.
- ``echo``: echo servers in the pods and the clients that ask them.
- ``run``: the demo itself.
"""
