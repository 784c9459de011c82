"""Operator reports, read only: ``nlproxy explain``, ``nlproxy services``, ``nlproxy preflight``.

- ``report``: one Service: objects, programmed rules, flows, endpoints, problems, a trace.
- ``manifests``: what a manifests directory says of a Service.
- ``rules``: the programmed rules of a Service, recovered from the kernel's maps.
- ``trace``: a new connection traced through the programmed rules.
- ``render``: the report as text.
- ``services``: every frontend with its backends (``nlproxy services``).
- ``preflight``: what would bite a kube-proxy node's switch (``nlproxy preflight``).
"""
