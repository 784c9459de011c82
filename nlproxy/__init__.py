"""nlproxy: a Kubernetes service proxy that programs nftables over netlink."""

__version__ = "0.1.0"
