"""Netlink transport shared by nft, conntrack and inspect; knows nothing of either.

- ``codec``: netlink framing: message headers, nfgenmsg, errors and attributes (nlattr).
- ``nlsock``: a NETLINK_NETFILTER socket: send, receive, dump, ack, subscribe.
- ``protocols``: IP protocol numbers and the names nft and conntrack print for them.
- ``netns``: entering a named network namespace for one block (sockets are made there).
"""
