"""Stage ①, sources → state: what the cluster wants, as typed objects.

The only code that reads raw Kubernetes objects; knows no rules and no nftables (the layering
test holds it to that). A bad object is named (``kind namespace/name``, the field) and left
out; everything else goes on.

- ``model``: the typed, frozen objects every later stage consumes.
- Reading raw objects: ``parse`` (an object → model values, or an error naming the field),
  ``fields`` (typed reads of one object's fields), ``schema`` (the fields nlproxy knows, to
  name unknown ones), ``claims`` (which Service owns a contested frontend).
- Sources (``source``: what the daemon is given):
  the Kubernetes API — ``kube`` (list + watch, relist on ``410 Gone``), ``kube_http`` (the
  requests, decoded from raw JSON), ``kube_link`` (retry delays, reachability, unreadable kinds),
  ``ratelimit`` (the client's token bucket, ``--kube-api-qps``/``--kube-api-burst``),
  ``kubeconfig`` (the file ``run`` opens, read and merged as the client's loader reads it:
  the current context's server and user, why a user's ``auth-provider`` was refused);
  a directory of manifests — ``manifests`` (load YAML/JSON files), ``readdir`` (open them
  beneath the directory, regular files only), ``decode`` (their text to documents),
  ``fileobjects`` (one file's bytes to its objects), ``watchdir`` (reload on inotify, in a
  worker thread).
- ``state``: the current valid objects and which Services changed since the last sync.
"""
