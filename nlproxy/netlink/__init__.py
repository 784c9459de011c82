"""Netlink transport shared by nft, conntrack and inspect.

- ``netns``: entering a named network namespace for one block (sockets are made there).
"""
