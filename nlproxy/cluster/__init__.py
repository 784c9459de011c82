"""Cluster state: sources, typed objects and validation, change tracking."""
