"""Netlink transport shared by nft, conntrack and inspect.

- ``nlsock``: a NETLINK_NETFILTER socket (send, receive, dump, ack) and the netlink codec.
- ``netns``: entering a named network namespace for one block (sockets are made there).
"""
