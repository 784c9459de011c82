"""What the node exposes over HTTP.

- ``http``: the small trio HTTP server (bounded connections, timeouts), in the rules' namespace.
- ``health``: ``/healthz``, ``/livez`` and the health-check node ports' answers.
- ``healthcheck``: one server per ``healthCheckNodePort``.
- ``metrics``: kube-proxy's metrics and nlproxy's own.

``nlproxy status``, which asks a running daemon over those ports, is ``operate/status.py``'s.
"""
